"""U-Agg, UFL's server half: weights fall as a client's share of the round's uncertainty grows.

UFL ("UFL: Uncertainty-Driven Federated Learning", spec ``specs/ufl.md`` §3)
weighs client k by ``w_k = (1 - U_k / Σ_j U_j) / (K - 1)``, with ``U_k`` the
summed uncertainty of its selected samples (the ``uncertainty`` signal,
measured by the ``ufl`` client step, :mod:`fedweigh.client.ufl`). That is
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

import numpy as np

from fedweigh.options import UAggSettings
from fedweigh.protocol import UNCERTAINTY, UNCERTAINTY_MEAN
from fedweigh.rules.base import ComplementShareRule, RoundSignals, RuleOutcome, complement_share_weights, normalized


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
