"""The strategy family: Flower strategies that weigh, update and record.

* :mod:`~fedweigh.strategies.base`: :class:`WeightedFedAvg`, the template every method fills;
* :mod:`~fedweigh.strategies.build`: a run's strategy from its settings;
* :mod:`~fedweigh.strategies.replies`: checking replies;
* :mod:`~fedweigh.strategies.aggregation`: encoding, decoding and averaging models;
* :mod:`~fedweigh.strategies.updates`: the server-update step (the weighted mean by default);
* :mod:`~fedweigh.strategies.schedules`: train-config values that change per round;
* :mod:`~fedweigh.strategies.sampling`: seeded client sampling by partition.

The aggregation rules are :mod:`fedweigh.rules`; the methods by name, :mod:`fedweigh.methods`.
"""
