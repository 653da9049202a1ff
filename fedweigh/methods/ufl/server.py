"""U-Agg, UFL's server half: weights fall as a client's share of the round's uncertainty grows.

UFL ("UFL: Uncertainty-Driven Federated Learning", spec ``specs/ufl.md`` §3)
weighs client k by ``w_k = (1 - U_k / Σ_j U_j) / (K - 1)``, with ``U_k`` the
summed uncertainty of its selected samples (the ``uncertainty`` signal,
measured by the ``ufl`` client step, :mod:`fedweigh.methods.ufl.client`). That is
:class:`~fedweigh.rules.base.ComplementShareRule` on ``uncertainty``, the rule
FedNolowe applies to losses. Options (``[uagg]``): the per-sample mean ``U_k /
m_k`` instead of the sum (``signal = "mean"``), and FedAvg's size factor kept
(``size-aware``, spec A13): ``w_k ∝ n_k (1 - Û_k)``.

Example
-------
>>> import numpy as np
>>> size_aware_complement_share_weights(np.array([1.0, 1.0, 2.0]), np.array([10, 20, 10])).round(4)
array([0.2727, 0.5455, 0.1818])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedweigh.methods.declaration import Declaration, Method, RuleSpec
from fedweigh.methods.fedavg.server import SAMPLE_COUNT
from fedweigh.methods.ufl.protocol import UNCERTAINTY, UNCERTAINTY_MEAN, UAggSettings, UFLSettings
from fedweigh.rules.base import ComplementShareRule, RoundSignals, RuleOutcome, complement_share_weights, normalized
from fedweigh.strategies.library import MethodStrategy


def size_aware_complement_share_weights(values: np.ndarray, num_examples: np.ndarray) -> np.ndarray:
    """``w_k ∝ n_k (1 - v_k / Σ_j v_j)``: U-Agg keeping FedAvg's size factor (spec §3, A13).

    The same edge cases as :func:`~fedweigh.rules.base.complement_share_weights`
    (one client: 1; all values 0: the complement shares are uniform, so the
    weights are FedAvg's).
    """
    return normalized(np.asarray(num_examples, dtype=np.float64) * complement_share_weights(values))


class SizeAwareComplementShareRule(ComplementShareRule):
    """:func:`size_aware_complement_share_weights` on one signal (U-Agg with ``size-aware = true``)."""

    name = "complement-share-size-aware"

    def __call__(self, round_signals: RoundSignals) -> RuleOutcome:
        return RuleOutcome(
            size_aware_complement_share_weights(round_signals.values[self.signal], round_signals.num_examples)
        )


def u_agg_rule(options: UAggSettings) -> ComplementShareRule:
    """U-Agg as the settings ask: on ``U_k`` (sum) or ``U_k / m_k`` (mean), with or without ``n_k``."""
    signal = UNCERTAINTY if options.signal == "sum" else UNCERTAINTY_MEAN
    return SizeAwareComplementShareRule(signal) if options.size_aware else ComplementShareRule(signal)


UAGG_RULE = RuleSpec("uagg", lambda settings: u_agg_rule(settings.uagg), "uagg", "U-Agg: w = (1 − U_k/ΣU)/(K−1)")
UFL_METHOD = Method("ufl", UAGG_RULE, steps=("ufl",), meaning="UFL: uncertainty-weighted local loss, U-Agg weights")
_UFL, _UAGG = UFLSettings(), UAggSettings()


class UFL(MethodStrategy):
    """UFL: an uncertainty-weighted local loss, and U-Agg weights ``w = (1 − U_k/ΣU)/(K−1)``.

    Before training the client computes each sample's MC-dropout uncertainty
    ``u`` on the received model, up-weights its top ``ratio`` samples by
    ``1 + alpha·u`` in the loss, and reports ``uncertainty`` (U_k) and
    ``uncertainty-mean`` (:func:`fedweigh.client.ufl_weights`). Options as
    ``[ufl]`` (sent to the client) and ``[uagg]`` (the rule).
    """

    method = UFL_METHOD

    def __init__(
        self,
        *,
        mc_passes: int = _UFL.mc_passes,
        ratio: float = _UFL.ratio,
        alpha: float = _UFL.alpha,
        dropout: float = _UFL.dropout,
        normalize: bool = _UFL.normalize,
        cheap_path: bool = _UFL.cheap_path,
        signal: str = _UAGG.signal,
        size_aware: bool = _UAGG.size_aware,
        **kwargs: Any,
    ) -> None:
        ufl = {
            "mc_passes": mc_passes,
            "ratio": ratio,
            "alpha": alpha,
            "dropout": dropout,
            "normalize": normalize,
            "cheap_path": cheap_path,
        }
        super().__init__(options={"ufl": ufl, "uagg": {"signal": signal, "size_aware": size_aware}}, **kwargs)


DECLARATION = Declaration(
    methods=(
        UFL_METHOD,
        Method("ufl-fedavg", SAMPLE_COUNT, steps=("ufl",), meaning="UFL's local loss with FedAvg's weights"),
    ),
    rules=(UAGG_RULE,),
    strategies=(UFL,),
)
