"""fedweigh: five answers to data heterogeneity in federated learning, as one Flower app.

Layers, from the bottom up (a module imports only from layers below it; see docs/design.md):

1. :mod:`~fedweigh.settings`, :mod:`~fedweigh.protocol` (the message format), :mod:`~fedweigh.flower`;
2. :mod:`~fedweigh.data`, :mod:`~fedweigh.models`, :mod:`~fedweigh.rules` (server halves),
   :mod:`~fedweigh.client` (client halves), :mod:`~fedweigh.results`, :mod:`~fedweigh.flops`;
3. :mod:`~fedweigh.methods`, :mod:`~fedweigh.components`, :mod:`~fedweigh.strategies`,
   :mod:`~fedweigh.preflight`;
4. the apps (:mod:`~fedweigh.server_app`, :mod:`~fedweigh.client_app`), :mod:`~fedweigh.launch`;
5. :mod:`~fedweigh.experiments`, :mod:`~fedweigh.benchmarks`, :mod:`~fedweigh.cli`.

Importing fedweigh changes nothing in Flower: the changes to Flower's internals
(:mod:`~fedweigh.flower`) are installed by the apps and launchers that want them.
"""
