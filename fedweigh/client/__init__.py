"""The client halves of the methods: local training, the client steps, and their registry.

* :mod:`~fedweigh.client.training`: local training and evaluation (per-sample loss weights, SGD or Adam);
* :mod:`~fedweigh.client.steps`: the step protocol;
* :mod:`~fedweigh.client.oui`, :mod:`~fedweigh.client.ufl` (with :mod:`~fedweigh.client.mc_dropout`): one
  module per paper's client step;
* :mod:`~fedweigh.client.registry`: the steps by name.
"""
