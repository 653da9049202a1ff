"""The strategy family: Flower strategies that weigh, update and record.

For your own ServerApp (:mod:`~fedweigh.strategies.library`): :class:`FedOUI`,
:class:`FedNolowe`, :class:`UFL`, :class:`FLood`, :class:`Feddle`,
:class:`FedBuff`, :class:`FedAsync`, :class:`FedProx`, the
:class:`DAC` aggregation and any other rule by name (:func:`aggregation`),
each a Flower ``FedAvg`` constructed in code; your ClientApp computes what they
weigh with through :mod:`fedweigh.client`.

Inside:

* :mod:`~fedweigh.strategies.base`: :class:`WeightedFedAvg`, the template every method fills;
* :mod:`~fedweigh.strategies.build`: a run's strategy from its settings (through the library's classes);
* :mod:`~fedweigh.strategies.replies`: checking replies;
* :mod:`~fedweigh.strategies.aggregation`: encoding, decoding and averaging models;
* :mod:`~fedweigh.strategies.updates`: the server-update step (the weighted mean by default);
* :mod:`~fedweigh.strategies.schedules`: train-config values that change per round;
* :mod:`~fedweigh.strategies.sampling`: seeded client sampling by partition.

The aggregation rules are :mod:`fedweigh.rules`; the methods by name, :mod:`fedweigh.methods`.
"""

from fedweigh.strategies.library import (
    DAC,
    UFL,
    FedAsync,
    FedBuff,
    Feddle,
    FedNolowe,
    FedOUI,
    FedProx,
    FLood,
    MethodStrategy,
    aggregation,
)

__all__ = [
    "DAC",
    "FLood",
    "FedAsync",
    "FedBuff",
    "FedNolowe",
    "FedOUI",
    "FedProx",
    "Feddle",
    "MethodStrategy",
    "UFL",
    "aggregation",
]
