"""FedDisco (Ye et al., "FedDisco: Federated Learning with Discrepancy-Aware Collaboration", arXiv 2305.19229).

Weights from each client's share of the data and its label discrepancy
``d_k`` (the ``label-discrepancy`` signal, :mod:`.client`):

    p_k = ReLU(n_k / N − a · d_k + b) / Σ_j ReLU(n_j / N − a · d_j + b).

A client whose labels are far from the global distribution weighs less;
``b`` keeps every client in (all weights zero give uniform weights). A rule:
any strategy here can weigh with it (``aggregation = "feddisco"``).

>>> import numpy as np
>>> disco_weights(np.array([30.0, 10.0]), np.array([0.0, 0.5]), a=0.5, b=0.1).round(4)  # 0.85 and 0.1
array([0.8947, 0.1053])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedweigh.methods.costs import MethodCost
from fedweigh.methods.declaration import Declaration, Method, RuleSpec
from fedweigh.methods.feddisco.protocol import LABEL_DISCREPANCY, FedDiscoSettings
from fedweigh.rules.base import RoundSignals, RuleOutcome, WeightingRule, normalized
from fedweigh.strategies.library import MethodStrategy


def disco_weights(num_examples: np.ndarray, discrepancy: np.ndarray, a: float, b: float) -> np.ndarray:
    """``ReLU(n_k/N − a d_k + b)``, normalised; all zero gives uniform weights."""
    share = np.asarray(num_examples, dtype=np.float64) / float(np.sum(num_examples))
    return normalized(np.maximum(share - a * np.asarray(discrepancy, dtype=np.float64) + b, 0.0))


class DiscrepancyRule(WeightingRule):
    """:func:`disco_weights` on ``num-examples`` and ``label-discrepancy``."""

    name = "feddisco"
    signals = (LABEL_DISCREPANCY,)

    def __init__(self, a: float = FedDiscoSettings().a, b: float = FedDiscoSettings().b) -> None:
        self.a, self.b = a, b

    def __call__(self, round_signals: RoundSignals) -> RuleOutcome:
        weights = disco_weights(round_signals.num_examples, round_signals.values[LABEL_DISCREPANCY], self.a, self.b)
        return RuleOutcome(weights)


def _disco_weighting(num_clients: int) -> int:
    return 6 * num_clients  # share (sum, divide), a·d, subtract, add b, then normalise (sum, divide)


FEDDISCO_RULE = RuleSpec(
    "feddisco",
    lambda settings: DiscrepancyRule(settings.feddisco.a, settings.feddisco.b),
    "feddisco",
    "FedDisco: w ∝ ReLU(n_k/N − a·d_k + b), d_k the label distribution's distance from uniform",
)
FEDDISCO = Method("feddisco", FEDDISCO_RULE, meaning="FedDisco: data-size and label-discrepancy weights")
_FEDDISCO = FedDiscoSettings()


class FedDisco(MethodStrategy):
    """FedDisco (Ye et al., arXiv 2305.19229): ``w ∝ ReLU(n_k/N − a d_k + b)``.

    The client reports ``label-discrepancy`` (:func:`fedweigh.client.label_discrepancy`), its label
    distribution's L2 distance from the uniform one. Options as ``[feddisco]``.
    """

    method = FEDDISCO

    def __init__(self, *, a: float = _FEDDISCO.a, b: float = _FEDDISCO.b, **kwargs: Any) -> None:
        super().__init__(options={"feddisco": {"a": a, "b": b}}, **kwargs)


DECLARATION = Declaration(
    methods=(FEDDISCO,),
    rules=(FEDDISCO_RULE,),
    costs={"feddisco": MethodCost(_disco_weighting)},
    strategies=(FedDisco,),
)
