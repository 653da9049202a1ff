"""The methods by name, gathered from their packages; and what a run's settings add up to.

Every method package's ``server.py`` ends with a
:class:`~fedweigh.methods.declaration.Declaration`; this module gathers them
into the tables the apps read by name: :data:`METHODS` (``strategy``),
:data:`RULES` (``aggregation``), :data:`UPDATES`, :data:`STEP_SCHEDULES`,
:data:`METHOD_COSTS` and :data:`STRATEGY_CLASSES`. A name declared twice is
an error naming both packages.

:func:`plan_run` resolves a run's ``strategy``, ``aggregation`` and
``client-steps`` into one :class:`RunPlan`: the rule (the ``aggregation``
setting, else the method's), the client steps (the method's, those producing
the rule's signals, then ``client-steps``), each with the setting that asked
for it, so that an error can name it.

Example
-------
>>> from fedweigh.settings import validate
>>> plan = plan_run(validate({"strategy": "fedprox", "aggregation": "fednolowe"}))
>>> plan.rule.name, plan.proximal, plan.comma_list
('fednolowe', True, [])
>>> plan_run(validate({"strategy": "ufl", "aggregation": "fedoui"})).comma_list
['ufl', 'oui']
>>> RULES["uagg"].build(validate({"uagg.signal": "mean"})).signals
('uncertainty-mean',)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedweigh.methods.catalog import OPTION_TABLES, STEPS, by_name, gather, items, producers, refuse, where
from fedweigh.methods.costs import MethodCost
from fedweigh.methods.declaration import Method, RuleSpec
from fedweigh.options import comma_list
from fedweigh.rules.base import WeightingRule
from fedweigh.settings import Settings, SettingsError, validate
from fedweigh.strategies.schedules import Schedule
from fedweigh.strategies.updates import ServerUpdate


def _declared(field: str, entries: Callable[[Any], list[tuple[str, Any]]], kind: str) -> dict[str, Any]:
    return gather("server", "DECLARATION", lambda declaration: entries(getattr(declaration, field)), kind)


METHODS: dict[str, Method] = _declared("methods", by_name, "method")
"""Every method, by ``strategy`` name."""

RULES: dict[str, RuleSpec] = _declared("rules", by_name, "aggregation rule")
"""Every aggregation rule, by ``aggregation`` name."""

UPDATES: dict[str, type[ServerUpdate]] = _declared("updates", by_name, "server update")
"""Every server update, by the name its class gives."""

STEP_SCHEDULES: dict[str, Callable[[Settings], Schedule]] = _declared("schedules", items, "schedule")
"""The per-round values a client step needs from the server (FLood's λ(t) for ``asw``), by step name."""

METHOD_COSTS: dict[str, MethodCost] = _declared("costs", items, "FLOP model")
"""The FLOP model of the methods :func:`fedweigh.flops.round_flops` can count, by ``strategy`` name."""

STRATEGY_CLASSES: dict[str, type[Any]] = _declared(
    "strategies", lambda strategies: [(strategy.method.name, strategy) for strategy in strategies], "strategy class"
)
"""The library's Flower strategies by ``strategy`` name; the run-config app builds every other method as a
:class:`~fedweigh.strategies.library.MethodStrategy`."""

PUBLIC: dict[str, Any] = gather(
    "server",
    "DECLARATION",
    lambda declaration: [(s.__name__, s) for s in declaration.strategies] + items(declaration.public),
    "public name",
)
"""What :mod:`fedweigh.strategies` offers a user's ServerApp from the packages, by name (``FedOUI``, ``DAC``)."""


def _consistency_problems() -> list[str]:
    problems = []
    for rule in RULES.values():
        if rule.table is not None and rule.table not in OPTION_TABLES:
            problems.append(
                f"aggregation rule {rule.name!r} ({where('aggregation rule', rule.name)}) reads the "
                f"options table {rule.table!r}, which no protocol.py declares"
            )
    for method in METHODS.values():
        unknown = [step for step in method.steps if step not in STEPS]
        if unknown:
            problems.append(
                f"method {method.name!r} ({where('method', method.name)}) runs the client steps {unknown}, "
                "which no protocol.py declares"
            )
        if RULES.get(method.rule.name) is not method.rule:
            problems.append(
                f"method {method.name!r} ({where('method', method.name)}) weighs with the rule "
                f"{method.rule.name!r}, which no DECLARATION lists in its rules"
            )
    return problems


refuse(_consistency_problems())


def aggregation(name: str, **options: Any) -> WeightingRule:
    """An aggregation rule by its run-config name (``fednolowe``, ``dac``, ...), its options as keyword arguments.

    >>> aggregation("uagg", signal="mean").signals
    ('uncertainty-mean',)
    """
    if name not in RULES:
        raise SettingsError([f"aggregation = {name!r}: unknown aggregation rule; accepted: {', '.join(sorted(RULES))}"])
    table = RULES[name].table
    if options and table is None:
        raise SettingsError([f"aggregation = {name!r} has no options; accepted: none, got {sorted(options)}"])
    flat = {f"{table}.{key.replace('_', '-')}": value for key, value in options.items()}
    return RULES[name].build(validate(flat))


@dataclass(frozen=True)
class RunPlan:
    """What a run's settings add up to.

    Attributes
    ----------
    method : Method
    rule : RuleSpec
        The aggregation rule.
    rule_origin : str
        The setting that chose it (``strategy = 'fedoui'`` or ``aggregation = 'uagg'``).
    steps : tuple of (str, str)
        Each client step with the setting that asked for it, in order.
    """

    method: Method
    rule: RuleSpec
    rule_origin: str
    steps: tuple[tuple[str, str], ...]

    @property
    def comma_list(self) -> list[str]:
        return [name for name, _ in self.steps]

    @property
    def proximal(self) -> bool:
        return self.method.proximal

    @property
    def update(self) -> type[ServerUpdate]:
        return self.method.update


def plan_run(settings: Settings) -> RunPlan:
    """Resolve ``strategy``, ``aggregation`` and ``client-steps`` (names already checked)."""
    method = METHODS[settings.strategy]
    if settings.aggregation:
        rule, rule_origin = RULES[settings.aggregation], f"aggregation = {settings.aggregation!r}"
    else:
        rule, rule_origin = method.rule, f"strategy = {settings.strategy!r}"
    signals = rule.build(settings).signals
    wanted = [(name, f"strategy = {settings.strategy!r}") for name in method.steps]
    wanted += [(name, rule_origin) for name in producers(signals)]
    wanted += [(name, f"client-steps = {settings.client_steps!r}") for name in comma_list(settings.client_steps)]
    steps: list[tuple[str, str]] = []
    for name, origin in wanted:
        if name not in [step for step, _ in steps]:
            steps.append((name, origin))
    return RunPlan(method, rule, rule_origin, tuple(steps))
