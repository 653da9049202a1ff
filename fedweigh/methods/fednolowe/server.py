"""FedNolowe: normalised-loss weights ``w = (1 − L_k/ΣL)/(K−1)`` on the clients' training losses.

The rule is the complement share of :mod:`fedweigh.rules.base` on
``train_loss``, which every reply carries: no client step.

>>> FEDNOLOWE_RULE.build(None).signals
('train_loss',)
"""

from __future__ import annotations

from typing import Any

from fedweigh.methods.costs import MethodCost, complement_share_weighting
from fedweigh.methods.declaration import Declaration, Method, RuleSpec
from fedweigh.protocol import TRAIN_LOSS
from fedweigh.rules.base import ComplementShareRule
from fedweigh.strategies.library import MethodStrategy

FEDNOLOWE_RULE = RuleSpec(
    "fednolowe",
    lambda settings: ComplementShareRule(TRAIN_LOSS),
    None,
    "FedNolowe: w = (1 − L_k/ΣL)/(K−1) on the training losses",
)
FEDNOLOWE = Method("fednolowe", FEDNOLOWE_RULE, meaning="FedNolowe: normalised-loss weights")


class FedNolowe(MethodStrategy):
    """FedNolowe: normalised-loss weights, ``w = (1 − L_k/ΣL)/(K−1)`` on the clients' ``train_loss``.

    Nothing beyond Flower's quickstart reply is needed from the client: its
    mean training loss is the signal.
    """

    method = FEDNOLOWE

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)


DECLARATION = Declaration(
    methods=(FEDNOLOWE,),
    rules=(FEDNOLOWE_RULE,),
    costs={"fednolowe": MethodCost(complement_share_weighting)},
    strategies=(FedNolowe,),
)
