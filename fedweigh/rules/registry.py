"""Aggregation rules by name: what ``aggregation = "..."`` in the run config picks.

A plain table: each entry names a rule, builds it from the run settings (its
options live in the run-config table :attr:`RuleSpec.table`), and says in one
line what it does. The client signals a rule needs are the built rule's
``signals``; :data:`fedweigh.protocol.SIGNALS` says which client step
produces each, so choosing a rule adds those steps (:mod:`fedweigh.methods`).

Example
-------
>>> from fedweigh.settings import validate
>>> rule = RULES["uagg"].build(validate({"uagg.signal": "mean"}))
>>> rule.signals
('uncertainty-mean',)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fedweigh.protocol import TRAIN_LOSS
from fedweigh.rules.base import ComplementShareRule, SampleCountRule, UniformRule, WeightingRule
from fedweigh.rules.dac import DACRule
from fedweigh.rules.fedalign import AlignmentRule
from fedweigh.rules.fedasl import LossDeviationRule
from fedweigh.rules.fedoui import OUIBetaRule
from fedweigh.rules.uagg import u_agg_rule
from fedweigh.settings import Settings


@dataclass(frozen=True)
class RuleSpec:
    """One aggregation rule.

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


def _fedoui(settings: Settings) -> WeightingRule:
    options = settings.fedoui
    return OUIBetaRule(
        epsilon=options.epsilon,
        score_exponent=options.score_exponent,
        size_exponent=options.size_exponent,
        window=options.window,
    )


def _fedalign(settings: Settings) -> WeightingRule:
    options = settings.fedalign
    return AlignmentRule(
        epsilon=options.epsilon, alignment_exponent=options.alignment_exponent, size_exponent=options.size_exponent
    )


RULES: dict[str, RuleSpec] = {
    spec.name: spec
    for spec in (
        RuleSpec("sample-count", lambda settings: SampleCountRule(), None, "FedAvg: w ∝ n_k"),
        RuleSpec("uniform", lambda settings: UniformRule(), None, "w = 1/K"),
        RuleSpec("fedoui", _fedoui, "fedoui", "FedOUI: Beta fit of the OUIs, w ∝ n_k (ε + typicality score)"),
        RuleSpec("fedalign", _fedalign, "fedalign", "FedAlign: w ∝ n_k (ε + max(0, cos(Δ_k, Δ̄)))"),
        RuleSpec(
            "fednolowe",
            lambda settings: ComplementShareRule(TRAIN_LOSS),
            None,
            "FedNolowe: w = (1 − L_k/ΣL)/(K−1) on the training losses",
        ),
        RuleSpec(
            "fedasl",
            lambda settings: LossDeviationRule(settings.fedasl.alpha, settings.fedasl.beta),
            "fedasl",
            "FedAsl: w ∝ 1/distance of the loss from the round's median",
        ),
        RuleSpec("uagg", lambda settings: u_agg_rule(settings.uagg), "uagg", "U-Agg: w = (1 − U_k/ΣU)/(K−1)"),
        RuleSpec(
            "dac",
            lambda settings: DACRule(settings.dac.alpha, settings.dac.mapping, settings.dac.temperature),
            "dac",
            "FLood's DAC: w = (n_k/Σn + α·share of the OOD score φ_k)/(1 + α)",
        ),
    )
}
"""Every aggregation rule, by name."""
