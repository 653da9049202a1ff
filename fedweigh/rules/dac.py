"""FLood's server half: DAC, aggregation weights from sample counts and the clients' OOD scores.

DAC (dynamic aggregation correction, FLood paper Eq. 11, spec §3.2) mixes
each client's share of the round's samples with its share of the round's OOD
scores φ (the mean energy score of its trained model on its own data, the
``ood-score`` signal of :mod:`fedweigh.client.flood`):
``p_c = (u_c + α v_c) / (1 + α)`` with ``u_c = n_c / Σ n`` and ``v_c`` the
share of φ_c. A client more confident on its own data weighs more.

The paper's share is ``v_c = φ_c / Σ φ``, well defined only when every φ is
positive; an energy score can be negative or near zero (a model with small
logits), where that gives negative or exploding weights. The mapping from φ to
shares is therefore an option (``dac.mapping``), each well defined for any
finite scores:

* ``"sum"`` (default, the paper's): ``v ∝ φ`` when every φ is positive;
  otherwise the scores are first shifted by the round's minimum,
  ``φ − min φ + ε`` (the spec's resolution), so the least confident client's
  share is about 0;
* ``"shift"``: always ``v ∝ φ − min φ + ε``: only differences between the
  round's scores matter;
* ``"softmax"``: ``v = softmax(φ / τ)`` with ``τ = dac.temperature``: smooth,
  shift-invariant, and never 0.

All equal scores give uniform shares; one client gets weight 1.

Example
-------
>>> import numpy as np
>>> dac_weights(np.array([100, 300, 600]), np.array([2.0, 3.0, 5.0]), alpha=0.5).round(4)  # spec §3.2
array([0.1333, 0.3   , 0.5667])
"""

from __future__ import annotations

import math

import numpy as np

from fedweigh.protocol import OOD_SCORE
from fedweigh.rules.base import RoundSignals, RuleOutcome, WeightingRule, normalized, uniform_weights

SHIFT_EPSILON = 1e-8
"""Added after a shift by the round's minimum, so that no share is exactly 0 in ``sum`` and ``shift``."""
MAPPINGS = ("sum", "shift", "softmax")


def score_shares(scores: np.ndarray, mapping: str = "sum", temperature: float = 1.0) -> np.ndarray:
    """The clients' shares of the round's OOD scores, ``v``, summing to 1 (see the module docstring).

    Examples
    --------
    >>> score_shares(np.array([-1.0, 0.0, 1.0])).round(4)  # not all positive: shifted by the minimum
    array([0.    , 0.3333, 0.6667])
    >>> score_shares(np.array([1.0, 3.0]), "softmax", temperature=1.0).round(4)
    array([0.1192, 0.8808])
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 1 or scores.size == 0 or not np.all(np.isfinite(scores)):
        raise ValueError(f"OOD scores must be a non-empty 1-D array of finite values, got {scores.tolist()}")
    if mapping not in MAPPINGS:
        raise ValueError(f"dac.mapping = {mapping!r} is not accepted; accepted: {', '.join(MAPPINGS)}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"dac.temperature = {temperature!r} is not accepted; accepted: a finite number > 0")
    if np.all(scores == scores[0]):
        return uniform_weights(scores.size)
    if mapping == "softmax":
        scaled = (scores - scores.max()) / temperature
        exponentials = np.exp(scaled)
        return exponentials / exponentials.sum()
    if mapping == "shift" or np.any(scores <= 0):
        scores = scores - scores.min() + SHIFT_EPSILON
    return normalized(scores)


def dac_weights(
    num_examples: np.ndarray, scores: np.ndarray, *, alpha: float = 0.5, mapping: str = "sum", temperature: float = 1.0
) -> np.ndarray:
    """``p = (u + α v) / (1 + α)``: the sample-count shares mixed with the OOD-score shares (Eq. 11).

    Parameters
    ----------
    num_examples : np.ndarray
        n_c per client, finite and >= 0.
    scores : np.ndarray
        φ_c per client, finite.
    alpha : float
        The mix, >= 0 (0 is FedAvg).
    mapping, temperature
        How scores become shares (:func:`score_shares`).
    """
    if not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"dac.alpha = {alpha!r} is not accepted; accepted: a finite number >= 0")
    sizes = np.asarray(num_examples, dtype=np.float64)
    shares = score_shares(scores, mapping, temperature)
    if sizes.shape != shares.shape:
        raise ValueError(f"need one sample count per score, got {sizes.shape} and {shares.shape}")
    return normalized((normalized(sizes) + alpha * shares) / (1.0 + alpha))


class DACRule(WeightingRule):
    """:func:`dac_weights` on the clients' ``ood-score`` signal; records each client's share of the scores."""

    name = "dac"
    signals = (OOD_SCORE,)

    def __init__(self, alpha: float = 0.5, mapping: str = "sum", temperature: float = 1.0) -> None:
        dac_weights(np.ones(1), np.ones(1), alpha=alpha, mapping=mapping, temperature=temperature)  # checks them
        self.alpha, self.mapping, self.temperature = alpha, mapping, temperature

    def __call__(self, round_signals: RoundSignals) -> RuleOutcome:
        scores = round_signals.values[OOD_SCORE]
        weights = dac_weights(
            round_signals.num_examples, scores, alpha=self.alpha, mapping=self.mapping, temperature=self.temperature
        )
        shares = score_shares(scores, self.mapping, self.temperature)
        return RuleOutcome(weights, {"ood-share": [float(v) for v in shares], "ood-score-mean": float(np.mean(scores))})
