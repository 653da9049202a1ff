"""The methods, one package each: ``fedweigh/methods/<method>/``.

A package holds everything of one method (or of a paper and the baselines
that share its options), in up to three modules by layer:

* ``protocol.py``: what server and client both know: its run-config tables
  of options (``OPTIONS``), the signals its clients report (``SIGNALS``) and
  its client steps (``STEPS``); gathered by :mod:`fedweigh.methods.catalog`;
* ``client.py``: its client steps (:class:`~fedweigh.client.steps.ClientStep`)
  and the functions a user's own ClientApp calls;
* ``server.py``: its aggregation rule and server update, its Flower strategy
  (:class:`~fedweigh.strategies.library.MethodStrategy`) and ``DECLARATION``,
  its entries in the tables (:class:`~fedweigh.methods.declaration.Declaration`),
  gathered by :mod:`fedweigh.methods.registry`.

The tables are built from what the packages declare: a new package is found
without being listed anywhere (docs/design.md, "Adding a method"). This
``__init__`` imports nothing, so that the protocol modules stay at the
bottom of the package.
"""
