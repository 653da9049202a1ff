"""The strategy family: Flower strategies that weigh, update and record.

For your own ServerApp: every method's Flower strategy by name,
``from fedweigh.strategies import FedOUI`` (also :class:`FedNolowe`,
:class:`UFL`, :class:`FLood`, :class:`Feddle`, :class:`FedBuff`,
:class:`FedAsync`, :class:`FedProx`), the :class:`DAC` aggregation and any
other rule by name (:func:`aggregation`), each a Flower ``FedAvg``
constructed in code; your ClientApp computes what they weigh with through
:mod:`fedweigh.client`. Each lives in its method's package
(``fedweigh/methods/<method>/server.py``); the names are looked up when
first used (:data:`fedweigh.methods.registry.PUBLIC`), so that a new method
package is offered here without being listed, and importing this package
imports no method.

Inside:

* :mod:`~fedweigh.strategies.base`: :class:`WeightedFedAvg`, the template every method fills;
* :mod:`~fedweigh.strategies.library`: :class:`MethodStrategy`, a method as a library class;
* :mod:`~fedweigh.strategies.build`: a run's strategy from its settings (through the library's classes);
* :mod:`~fedweigh.strategies.replies`: checking replies;
* :mod:`~fedweigh.strategies.averaging`: encoding, decoding and averaging models;
* :mod:`~fedweigh.strategies.updates`: the server-update step (the weighted mean by default);
* :mod:`~fedweigh.strategies.schedules`: train-config values that change per round;
* :mod:`~fedweigh.strategies.sampling`: seeded client sampling by partition.

>>> from fedweigh.strategies import FedOUI, aggregation
>>> FedOUI.__module__, aggregation("dac").name
('fedweigh.methods.fedoui.server', 'dac')
"""

from __future__ import annotations

import importlib.util
from typing import Any

import fedweigh.strategies.averaging as _averaging  # noqa: F401  (bound first: the function below takes its name)


def aggregation(name: str, **options: Any) -> Any:
    """An aggregation rule by its run-config name, options as keyword arguments (see
    :func:`fedweigh.methods.registry.aggregation`)."""
    from fedweigh.methods.registry import aggregation as rule_by_name

    return rule_by_name(name, **options)


def __getattr__(name: str) -> Any:
    """``fedweigh.strategies.FedOUI``: a method's strategy, ``DAC`` or ``MethodStrategy``.

    A name that is a submodule of this package, or a dunder, is left to Python's import (looked up here
    it would import every method's server half first).
    """
    if name.startswith("__") or importlib.util.find_spec(f"{__name__}.{name}") is not None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from fedweigh.methods import registry
    from fedweigh.strategies.library import MethodStrategy

    offered = {**registry.PUBLIC, "MethodStrategy": MethodStrategy}
    if name not in offered:
        raise AttributeError(f"module 'fedweigh.strategies' has no attribute {name!r}; offered: {sorted(offered)}")
    return offered[name]


def __dir__() -> list[str]:
    from fedweigh.methods import registry

    return sorted([*globals(), *registry.PUBLIC, "MethodStrategy"])
