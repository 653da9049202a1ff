"""FedAsl (Talukder and Islam, 2022), the FedNolowe paper's closest baseline, as that paper's code runs it.

FedNolowe itself (Le et al., PLOS ONE 2025) weighs each client by its mean
local training loss ``L_k`` alone: ``p_k = (1 - L_k / sum_j L_j) / (K - 1)``,
:func:`~fedweigh.rules.base.complement_share_weights` on ``train_loss``
(:class:`~fedweigh.rules.base.ComplementShareRule`), the same function U-Agg
applies to uncertainty; it has no hyperparameters and keeps nothing across
rounds, and the generic training loop reports ``train_loss`` as the paper
defines it (each batch's mean cross-entropy before its step, times the batch
size, summed over all local epochs, divided by epochs times samples).

FedAsl (Talukder and Islam, 2022), as the FedNolowe paper's reference code
runs it, favours losses near the round's *median* rather than low losses:
with ``med`` the median and ``sigma`` the population standard deviation of
the round's losses, a client inside the "good region" ``|L_k - med| <= alpha
* sigma`` gets the distance ``d_k = beta * sigma``, any other client ``d_k =
|L_k - med|``, and ``p_k = (1/d_k) / sum_j (1/d_j)``; equal losses give equal
weights. The paper's code uses ``alpha = 0.5`` and ``beta = 0.2``.

Edge cases, for both rules, follow the FedNolowe spec (section 4.3): one
client gets weight 1; all losses zero gives uniform weights; a reply whose
``train_loss`` is missing, non-finite or negative is left out of the round
with a warning by the base strategy's reply validation (it never reaches the
weights); a round with no valid reply keeps the global model.

Example
-------
>>> import numpy as np
>>> from fedweigh.rules.base import complement_share_weights
>>> complement_share_weights(np.array([0.5, 1.0, 1.5, 2.0])).round(6)
array([0.3     , 0.266667, 0.233333, 0.2     ])
>>> loss_deviation_weights(np.array([0.5, 1.0, 1.5, 2.0])).round(4)
array([0.0649, 0.4351, 0.4351, 0.0649])

The paper's sensitivity analysis also runs FedAsl's distances through
FedNolowe's subtraction inversion; the two functions compose directly (both
are scale-invariant, so distances in units of ``sigma`` are fine):

>>> complement_share_weights(loss_deviation_distances(np.array([0.5, 1.0, 1.5, 2.0]))).round(4)
array([0.1883, 0.3117, 0.3117, 0.1883])
"""

from __future__ import annotations

import math

import numpy as np

from fedweigh.methods.costs import MethodCost
from fedweigh.methods.declaration import Declaration, Method, RuleSpec
from fedweigh.protocol import TRAIN_LOSS
from fedweigh.rules.base import RoundSignals, RuleOutcome, WeightingRule, normalized

FEDASL_ALPHA = 0.5
"""Half-width of FedAsl's good region, in standard deviations (the paper's code)."""

FEDASL_BETA = 0.2
"""FedAsl's distance inside the good region, in standard deviations (the paper's code)."""


# ---------------------------------------------------------------------------
# pure functions
# ---------------------------------------------------------------------------


def _check_deviation_parameters(alpha: float, beta: float) -> None:
    if not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"fedasl alpha = {alpha!r} is not accepted; it must be a finite number >= 0")
    if not (math.isfinite(beta) and beta > 0):
        raise ValueError(f"fedasl beta = {beta!r} is not accepted; it must be a finite number > 0")


def loss_deviation_distances(losses: np.ndarray, alpha: float = FEDASL_ALPHA, beta: float = FEDASL_BETA) -> np.ndarray:
    """FedAsl's distance of each client's loss from the round's median, in units of sigma.

    ``d_k / sigma = beta`` when ``|L_k - med| <= alpha * sigma`` (the good
    region), else ``|L_k - med| / sigma``; ``med`` is the median and ``sigma``
    the population standard deviation (``ddof=0``) of ``losses``. Expressing
    the distances in units of sigma leaves the weights unchanged (they are
    ratios) and keeps every distance positive and finite; when all losses are
    equal (``sigma = 0``) every client is in the good region and gets ``beta``.

    Parameters
    ----------
    losses : np.ndarray
        Finite loss per client, shape (K,).
    alpha : float
        Half-width of the good region in standard deviations, ``>= 0``.
    beta : float
        Distance given to clients inside the good region, in standard
        deviations, ``> 0``.

    Returns
    -------
    np.ndarray
        Positive float64 distances, shape (K,).

    Examples
    --------
    >>> loss_deviation_distances(np.array([0.5, 1.0, 1.5, 2.0])).round(4)
    array([1.3416, 0.2   , 0.2   , 1.3416])
    """
    _check_deviation_parameters(alpha, beta)
    relative = _relative_deviations(losses)
    return np.where(relative <= alpha, float(beta), relative)


def _relative_deviations(losses: np.ndarray) -> np.ndarray:
    """``|L_k - med| / sigma``; all zeros when every loss is the same (``sigma = 0``)."""
    losses = np.asarray(losses, dtype=np.float64)
    if losses.ndim != 1 or len(losses) == 0:
        raise ValueError(f"need a non-empty 1-D array of losses, got shape {losses.shape}")
    if not np.all(np.isfinite(losses)):
        raise ValueError(f"losses must be finite, got {losses.tolist()}")
    magnitude = np.abs(losses).max()
    if magnitude == 0:
        return np.zeros(len(losses))
    scaled = losses / magnitude  # in [-1, 1]: the statistics below cannot overflow
    ordered = np.sort(scaled)  # statistics that do not depend on the reply order
    median = float(np.median(ordered))
    spread = float(np.std(ordered))
    if spread == 0:
        return np.zeros(len(losses))
    return np.abs(scaled - median) / spread


def loss_deviation_weights(losses: np.ndarray, alpha: float = FEDASL_ALPHA, beta: float = FEDASL_BETA) -> np.ndarray:
    """FedAsl's weights: ``p_k = (1/d_k) / sum_j (1/d_j)`` with the distances of :func:`loss_deviation_distances`.

    Clients whose loss lies within ``alpha`` standard deviations of the
    round's median share the largest weight (when ``beta <= alpha``); the
    further a loss lies outside, the smaller its weight. Invariant to
    scaling and to shifting all losses; one client gets weight 1; equal
    losses give uniform weights.

    Parameters
    ----------
    losses : np.ndarray
        Finite loss per client, shape (K,).
    alpha, beta : float
        See :func:`loss_deviation_distances`.

    Returns
    -------
    np.ndarray
        float64 weights, shape (K,), summing to 1.
    """
    return normalized(1.0 / loss_deviation_distances(losses, alpha, beta))


# ---------------------------------------------------------------------------
# rules
# ---------------------------------------------------------------------------


class LossDeviationRule(WeightingRule):
    """FedAsl's rule on ``train_loss``: :func:`loss_deviation_weights`.

    Records the round's loss median and standard deviation, and each
    client's distance (in standard deviations) and whether it was inside the
    good region.

    Parameters
    ----------
    alpha, beta : float
        See :func:`loss_deviation_distances`.
    """

    name = "loss-deviation"
    signals = (TRAIN_LOSS,)

    def __init__(self, alpha: float = FEDASL_ALPHA, beta: float = FEDASL_BETA) -> None:
        _check_deviation_parameters(alpha, beta)
        self.alpha = float(alpha)
        self.beta = float(beta)

    def __call__(self, round_signals: RoundSignals) -> RuleOutcome:
        losses = round_signals.values[TRAIN_LOSS]
        relative = _relative_deviations(losses)
        inside = relative <= self.alpha
        distances = np.where(inside, self.beta, relative)
        return RuleOutcome(
            normalized(1.0 / distances),
            {
                "loss-median": float(np.median(losses)),
                "loss-std": float(np.std(losses)),
                "fedasl-distance": distances.tolist(),
                "fedasl-in-region": inside.astype(float).tolist(),
            },
        )


def loss_deviation_weighting(num_clients: int) -> int:
    median = 2 if num_clients % 2 == 0 else 0  # mean of the two middle values
    standard_deviation = 4 * num_clients + 1  # mean, subtract, square, sum, divide, sqrt
    scale = num_clients  # divide by the largest magnitude
    deviations = 2 * num_clients  # subtract the median, divide by sigma
    reciprocal_and_normalize = num_clients + (2 * num_clients - 1)
    return scale + median + standard_deviation + deviations + reciprocal_and_normalize


FEDASL_RULE = RuleSpec(
    "fedasl",
    lambda settings: LossDeviationRule(settings.fedasl.alpha, settings.fedasl.beta),
    "fedasl",
    "FedAsl: w ∝ 1/distance of the loss from the round's median",
)

DECLARATION = Declaration(
    methods=(Method("fedasl", FEDASL_RULE, meaning="FedAsl (the FedNolowe paper's baseline): loss-deviation weights"),),
    rules=(FEDASL_RULE,),
    costs={"fedasl": MethodCost(loss_deviation_weighting)},
)
