"""Methods by name: what ``strategy = "..."`` means, and what a run's settings add up to.

A *method* is data: the aggregation rule it weighs with by default, the client
steps of its local objective, whether it adds FedProx's proximal term, and its
server update. :func:`plan_run` resolves a run's ``strategy``, ``aggregation``
and ``client-steps`` into one :class:`RunPlan`: the rule (the ``aggregation``
setting, else the method's), the client steps (the method's, those producing
the rule's signals, then ``client-steps``), each with the setting that asked
for it, so that an error can name it.

Example
-------
>>> from fedweigh.settings import validate
>>> plan = plan_run(validate({"strategy": "fedprox", "aggregation": "fednolowe"}))
>>> plan.rule, plan.proximal, plan.comma_list
('fednolowe', True, [])
>>> plan_run(validate({"strategy": "ufl", "aggregation": "fedoui"})).comma_list
['ufl', 'oui']
"""

from __future__ import annotations

from dataclasses import dataclass

from fedweigh.options import comma_list
from fedweigh.protocol import producers
from fedweigh.rules.registry import RULES
from fedweigh.settings import Settings


@dataclass(frozen=True)
class Method:
    """One ``strategy`` value.

    Attributes
    ----------
    name : str
        The ``strategy`` value.
    rule : str
        Its aggregation rule (a key of :data:`fedweigh.rules.registry.RULES`).
    steps : tuple of str
        Client steps of its local objective (the rule's own signals add theirs).
    proximal : bool
        Adds FedProx's proximal term (``fedprox.proximal-mu``) to local training.
    update : str
        Its server update (a key of :data:`fedweigh.strategies.registry.UPDATES`).
    meaning : str
        One line for the docs.
    """

    name: str
    rule: str
    steps: tuple[str, ...] = ()
    proximal: bool = False
    update: str = "mean"
    meaning: str = ""


METHODS: dict[str, Method] = {
    method.name: method
    for method in (
        Method("fedavg", "sample-count", meaning="FedAvg"),
        Method("fedprox", "sample-count", proximal=True, meaning="FedProx: FedAvg with a proximal term"),
        Method("uniform", "uniform", meaning="plain mean of the client models"),
        Method("fedoui", "fedoui", meaning="FedOUI: OUI-typicality weights"),
        Method("fedalign", "fedalign", meaning="FedAlign (the FedOUI paper's baseline): update-alignment weights"),
        Method("fednolowe", "fednolowe", meaning="FedNolowe: normalised-loss weights"),
        Method("fedasl", "fedasl", meaning="FedAsl (the FedNolowe paper's baseline): loss-deviation weights"),
        Method(
            "fedma-simplified",
            "uniform",
            update="fedma-simplified",
            meaning="the FedNolowe authors' code's 'FedMa' (not FedMA): rows matched to one client's, uniform mean",
        ),
        Method("ufl", "uagg", steps=("ufl",), meaning="UFL: uncertainty-weighted local loss, U-Agg weights"),
        Method("ufl-fedavg", "sample-count", steps=("ufl",), meaning="UFL's local loss with FedAvg's weights"),
        Method("flood", "dac", steps=("asw",), meaning="FLood: pseudo-OOD samples weighted by λ(t) (ASW), DAC weights"),
        Method("feddle", "sample-count", update="feddle", meaning="Feddle: atlas merging searched on server data"),
        Method(
            "fedbuff",
            "sample-count",
            update="fedbuff",
            meaning="FedBuff: a step with the staleness-weighted mean of every K buffered updates",
        ),
        Method("fedasync", "sample-count", update="fedasync", meaning="FedAsync: staleness-discounted mixing"),
        Method("center", "sample-count", update="center", meaning="Center: trained on the server's data alone"),
        Method("fedft", "sample-count", update="fedft", meaning="Fed+FT: FedAvg, then fine-tuned on server data"),
    )
}
"""Every method, by ``strategy`` name."""


@dataclass(frozen=True)
class RunPlan:
    """What a run's settings add up to.

    Attributes
    ----------
    method : Method
    rule : str
        The aggregation rule.
    rule_origin : str
        The setting that chose it (``strategy = 'fedoui'`` or ``aggregation = 'uagg'``).
    steps : tuple of (str, str)
        Each client step with the setting that asked for it, in order.
    """

    method: Method
    rule: str
    rule_origin: str
    steps: tuple[tuple[str, str], ...]

    @property
    def comma_list(self) -> list[str]:
        return [name for name, _ in self.steps]

    @property
    def proximal(self) -> bool:
        return self.method.proximal

    @property
    def update(self) -> str:
        return self.method.update


def plan_run(settings: Settings) -> RunPlan:
    """Resolve ``strategy``, ``aggregation`` and ``client-steps`` (names already checked)."""
    method = METHODS[settings.strategy]
    if settings.aggregation:
        rule, rule_origin = settings.aggregation, f"aggregation = {settings.aggregation!r}"
    else:
        rule, rule_origin = method.rule, f"strategy = {settings.strategy!r}"
    signals = RULES[rule].build(settings).signals
    wanted = [(name, f"strategy = {settings.strategy!r}") for name in method.steps]
    wanted += [(name, rule_origin) for name in producers(signals)]
    wanted += [(name, f"client-steps = {settings.client_steps!r}") for name in comma_list(settings.client_steps)]
    steps: list[tuple[str, str]] = []
    for name, origin in wanted:
        if name not in [step for step, _ in steps]:
            steps.append((name, origin))
    return RunPlan(method, rule, rule_origin, tuple(steps))
