"""Aggregation rules: the protocol every rule follows and the weighting math the methods share.

* :mod:`~fedweigh.rules.base`: the rule protocol (:class:`~fedweigh.rules.base.WeightingRule`), the
  sample-count, uniform and complement-share rules and the shared math.

Each method's own rule lives in its package (``fedweigh/methods/<method>/server.py``); the rules by
name are :data:`fedweigh.methods.registry.RULES`.
"""
