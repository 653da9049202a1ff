"""Aggregation rules: the server halves of the methods, from a round's signals to weights.

* :mod:`~fedweigh.rules.base`: the rule protocol and the shared weighting math;
* :mod:`~fedweigh.rules.fedoui`, :mod:`~fedweigh.rules.fedalign`, :mod:`~fedweigh.rules.fedasl`,
  :mod:`~fedweigh.rules.uagg`: one module per paper's rule;
* :mod:`~fedweigh.rules.registry`: the rules by name (``aggregation = "..."``).
"""
