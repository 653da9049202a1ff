"""What a method package declares: its entries in the tables, bound to its code.

A package's ``server.py`` ends with one :class:`Declaration`: the methods
(``strategy`` values) it defines, its aggregation rules, server updates,
the per-round values its steps need from the server,
its FLOP model and its Flower strategies. :mod:`fedweigh.methods.registry`
gathers every package's into the tables by name. What the client must know
too (options, signals, step names) is declared one layer down, in the
package's ``protocol.py`` (:mod:`fedweigh.methods.catalog`).

Example
-------
>>> from fedweigh.methods.fedavg.server import FEDAVG, SAMPLE_COUNT
>>> FEDAVG.rule is SAMPLE_COUNT, FEDAVG.update.name, FEDAVG.steps
(True, 'mean', ())
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fedweigh.rules.base import WeightingRule
from fedweigh.strategies.schedules import Schedule
from fedweigh.strategies.updates import ServerUpdate, WeightedMean

if TYPE_CHECKING:
    from fedweigh.methods.costs import MethodCost
    from fedweigh.settings import Settings


@dataclass(frozen=True)
class RuleSpec:
    """One aggregation rule (an ``aggregation`` value).

    Attributes
    ----------
    name : str
        The ``aggregation`` value.
    build : callable
        Settings to a ready :class:`~fedweigh.rules.base.WeightingRule`.
    table : str or None
        The run-config table holding its options.
    meaning : str
        One line for the docs.
    """

    name: str
    build: Callable[[Settings], WeightingRule]
    table: str | None
    meaning: str


@dataclass(frozen=True)
class Method:
    """One ``strategy`` value.

    Attributes
    ----------
    name : str
        The ``strategy`` value.
    rule : RuleSpec
        Its aggregation rule (``aggregation`` may choose another).
    steps : tuple of str
        Client steps of its local objective (the rule's own signals add theirs).
    proximal : bool
        Adds FedProx's proximal term (``fedprox.proximal-mu``) to local training.
    update : type of ServerUpdate
        Its server update, from the weighed replies to the new global model.
    meaning : str
        One line for the docs.
    """

    name: str
    rule: RuleSpec
    steps: tuple[str, ...] = ()
    proximal: bool = False
    update: type[ServerUpdate] = WeightedMean
    meaning: str = ""


@dataclass(frozen=True)
class Declaration:
    """A package's entries in the tables (every field may be left empty).

    Attributes
    ----------
    methods : tuple of Method
        Its ``strategy`` values.
    rules : tuple of RuleSpec
        Its ``aggregation`` values.
    updates : tuple of ServerUpdate classes
        Its server updates (by their ``name``).
    schedules : mapping
        Client step name to the per-round values it needs from the server
        (settings to a :class:`~fedweigh.strategies.schedules.Schedule`).
    costs : mapping
        ``strategy`` value to its FLOP model (:class:`fedweigh.flops.MethodCost`).
    strategies : tuple of MethodStrategy classes
        Its Flower strategies for a user's ServerApp, each naming its
        :class:`Method` (:attr:`~fedweigh.strategies.library.MethodStrategy.method`).
    public : mapping
        Other names the library offers (``DAC``), by name.
    """

    methods: tuple[Method, ...] = ()
    rules: tuple[RuleSpec, ...] = ()
    updates: tuple[type[ServerUpdate], ...] = ()
    schedules: Mapping[str, Callable[[Settings], Schedule]] = field(default_factory=dict)
    costs: Mapping[str, MethodCost] = field(default_factory=dict)
    strategies: tuple[type[Any], ...] = ()
    public: Mapping[str, Any] = field(default_factory=dict)
