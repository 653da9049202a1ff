"""fedweigh: five answers to data heterogeneity in federated learning, as one Flower app.

Layers, from the bottom up (a module imports only from layers below it; see docs/design.md):

1. :mod:`~fedweigh.settings`, :mod:`~fedweigh.protocol` (the message format);
2. :mod:`~fedweigh.data`, :mod:`~fedweigh.models`, :mod:`~fedweigh.rules` (server halves),
   :mod:`~fedweigh.client` (client halves), :mod:`~fedweigh.results`, :mod:`~fedweigh.flops`;
3. :mod:`~fedweigh.methods`, :mod:`~fedweigh.components`, :mod:`~fedweigh.strategies`,
   :mod:`~fedweigh.preflight`;
4. the apps (:mod:`~fedweigh.server_app`, :mod:`~fedweigh.client_app`), :mod:`~fedweigh.launch`;
5. :mod:`~fedweigh.experiments`, :mod:`~fedweigh.benchmarks`, :mod:`~fedweigh.cli`.
"""

from fedweigh.engine import prepare_if_simulating

# In a simulation process the app is imported before Flower's engine starts its message loop: the moment to
# make the hand-off event-driven (fedweigh/engine.py). Elsewhere (a SuperNode, the CLI, tests) nothing happens.
prepare_if_simulating()
