"""Weighting rules: from one round's client signals to aggregation weights.

A *weighting rule* reads what the round's valid replies carry (sample counts
and the *signals* the rule asks for, such as ``train_loss`` or ``oui``) and
returns one weight per client. Weights are finite, non-negative, sum to 1,
and follow the clients if they are permuted.

The math lives in small pure functions (``*_weights``) that the tests check
against the specs' vectors; a rule class wraps one with the names of the
signals it reads (:data:`fedweigh.methods.catalog.SIGNALS` says which client step
produces each and which values are valid) and what to record.

Two shapes cover every rule of the five papers:

* :func:`complement_share_weights`: weights fall as a client's share of the
  round's total grows (FedNolowe on losses, U-Agg on uncertainties);
* :func:`score_weights`: ``w ∝ n^rho (max(score, 0) + eps)^gamma`` (FedOUI on
  typicality scores, FedAlign on update cosines).

Example
-------
>>> import numpy as np
>>> complement_share_weights(np.array([0.1, 0.2, 0.3, 0.4, 0.5])).round(4)
array([0.2333, 0.2167, 0.2   , 0.1833, 0.1667])
>>> SampleCountRule()(RoundSignals(np.array([10.0, 30.0]), {})).weights
array([0.25, 0.75])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

Diagnostics = dict[str, Any]
NamedArrays = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class RoundSignals:
    """What the valid replies of one round carry, in reply order.

    Attributes
    ----------
    num_examples : np.ndarray
        Training sample count n_k of each client, shape (K,).
    values : Mapping[str, np.ndarray]
        One float64 array of shape (K,) per signal name.
    """

    num_examples: np.ndarray
    values: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.num_examples)


@dataclass(frozen=True)
class RuleOutcome:
    """Weights for the round, plus what the rule wants recorded.

    ``diagnostics`` holds round-level numbers (``{"beta-alpha": 1.3}``) and
    per-client lists in reply order (``{"oui-score": [...]}``).
    """

    weights: np.ndarray
    diagnostics: Diagnostics = field(default_factory=dict)


# ---------------------------------------------------------------------------
# pure functions
# ---------------------------------------------------------------------------


def normalized(raw: np.ndarray, uniform_at_or_below: float = 0.0) -> np.ndarray:
    """Scale non-negative ``raw`` to sum to 1; a sum at or below the threshold gives uniform weights.

    >>> normalized(np.array([1.0, 3.0])).tolist(), normalized(np.zeros(2)).tolist()
    ([0.25, 0.75], [0.5, 0.5])
    """
    raw = np.asarray(raw, dtype=np.float64)
    if raw.ndim != 1 or len(raw) == 0:
        raise ValueError(f"weights need a non-empty 1-D array, got shape {raw.shape}")
    if np.any(raw < 0) or not np.all(np.isfinite(raw)):
        raise ValueError(f"raw weights must be finite and >= 0, got {raw.tolist()}")
    total = raw.sum()
    if not total > uniform_at_or_below:
        return np.full(len(raw), 1.0 / len(raw))
    return raw / total


def sample_count_weights(num_examples: np.ndarray) -> np.ndarray:
    """FedAvg: w_k = n_k / sum_j n_j."""
    return normalized(num_examples)


def uniform_weights(num_clients: int) -> np.ndarray:
    """Plain mean: w_k = 1 / K."""
    return np.full(num_clients, 1.0 / num_clients)


def complement_share_weights(values: np.ndarray) -> np.ndarray:
    """Weights that fall as a client's share of the round's total grows.

    The two-stage L1 normalisation of FedNolowe (signal: training loss) and
    of U-Agg (signal: accumulated sample uncertainty): ``share_k = v_k /
    sum_j v_j``, then ``w_k = (1 - share_k) / sum_j (1 - share_j)``, which
    equals ``(1 - share_k) / (K - 1)``. Edge cases as both specs prescribe:
    one client gets weight 1; an all-zero round gives uniform weights. The
    weights are invariant to scaling all values (the values are divided by
    their maximum first, so that even values near the float64 limit cannot
    overflow the sum) and lie in ``[0, 1/(K-1)]``.

    Parameters
    ----------
    values : np.ndarray
        Non-negative finite signal per client, shape (K,).

    Returns
    -------
    np.ndarray
        float64 weights, shape (K,), summing to 1.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1 or len(values) == 0:
        raise ValueError(f"need a non-empty 1-D array, got shape {values.shape}")
    if np.any(values < 0) or not np.all(np.isfinite(values)):
        raise ValueError(f"values must be finite and >= 0, got {values.tolist()}")
    count = len(values)
    if count == 1:
        return np.ones(1)
    largest = values.max()
    if largest == 0:
        return uniform_weights(count)
    scaled = values / largest
    share = scaled / scaled.sum()
    complement = 1.0 - share
    return complement / complement.sum()


SCORE_UNIFORM_AT_OR_BELOW = 1e-12
"""Raw score weights summing to at most this give uniform weights (FedOUI spec §4 step 4)."""


def size_factors(num_examples: np.ndarray, rho: float) -> np.ndarray:
    """``max(n_k, 1)^rho``, divided by the largest (same weights once normalised, no overflow)."""
    sizes = np.maximum(np.asarray(num_examples, dtype=np.float64), 1.0)
    return (sizes / sizes.max()) ** rho


def score_weights(
    scores: np.ndarray, num_examples: np.ndarray, *, epsilon: float, exponent: float, rho: float
) -> np.ndarray:
    """``w_k ∝ max(n_k, 1)^rho (max(s_k, 0) + epsilon)^exponent``, normalised.

    FedOUI weighs by typicality scores in ``[0, 1]`` (spec §4), FedAlign by
    update cosines in ``[-1, 1]`` (FedOUI spec §7); negative scores count as
    0. Raw weights summing to at most 1e-12 give uniform weights.

    Parameters
    ----------
    scores : np.ndarray
        Finite score per client, shape (K,).
    num_examples : np.ndarray
        Finite sample count per client, >= 0, shape (K,).
    epsilon : float
        Finite, >= 0; keeps a zero score from zeroing a client.
    exponent, rho : float
        Finite, >= 0: the score's and the size's exponent.

    Examples
    --------
    >>> score_weights(np.array([1.0, -0.5]), np.array([10, 10]), epsilon=1e-3, exponent=1.0, rho=1.0).round(4)
    array([0.999, 0.001])
    """
    scores = np.asarray(scores, dtype=np.float64)
    num_examples = np.asarray(num_examples, dtype=np.float64)
    if scores.ndim != 1 or scores.size == 0 or num_examples.shape != scores.shape:
        raise ValueError(f"need matching non-empty 1-D arrays, got {scores.shape} and {num_examples.shape}")
    if not np.all(np.isfinite(scores)):
        raise ValueError(f"scores = {scores.tolist()} are invalid: accepted values are finite")
    if not np.all(np.isfinite(num_examples)) or np.any(num_examples < 0):
        raise ValueError(f"num_examples = {num_examples.tolist()} is invalid: counts must be finite and >= 0")
    check_exponents(epsilon=epsilon, exponent=exponent, rho=rho)
    with np.errstate(over="ignore"):
        raw = size_factors(num_examples, rho) * (np.maximum(scores, 0.0) + epsilon) ** exponent
    if not np.all(np.isfinite(raw)):  # an exponent so large that a power overflows: no client stands out
        return uniform_weights(len(raw))
    return normalized(raw, SCORE_UNIFORM_AT_OR_BELOW)


def check_exponents(**values: float) -> None:
    """Every value finite and >= 0; the error names the first that is not."""
    for name, value in values.items():
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} = {value!r} is invalid: accepted values are finite and >= 0")


# ---------------------------------------------------------------------------
# rules
# ---------------------------------------------------------------------------


class WeightingRule:
    """Base of every rule.

    Subclasses set ``signals`` (the client signals each reply must carry;
    a reply without a valid one is left out of the round) and implement
    :meth:`__call__`. A rule that computes signals of its own from the
    replies' models (FedAlign's update cosines) overrides
    :meth:`derive_signals`. Rules that keep state across rounds override
    :meth:`state` and :meth:`load_state` so that a resumed run continues
    exactly.
    """

    name: ClassVar[str] = "rule"
    signals: tuple[str, ...] = ()

    def __call__(self, round_signals: RoundSignals) -> RuleOutcome:
        raise NotImplementedError

    def derive_signals(
        self, models: Sequence[NamedArrays], reference: NamedArrays, num_examples: np.ndarray
    ) -> dict[str, np.ndarray]:
        """Signals the server computes from the replies' models (none by default)."""
        return {}

    def state(self) -> dict[str, Any]:
        """Everything needed to continue after a restart (JSON-compatible)."""
        return {}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state` returned."""


class SampleCountRule(WeightingRule):
    """FedAvg's rule: weight by training sample count."""

    name = "sample-count"

    def __call__(self, round_signals: RoundSignals) -> RuleOutcome:
        return RuleOutcome(sample_count_weights(round_signals.num_examples))


class UniformRule(WeightingRule):
    """Every client counts the same, whatever its size."""

    name = "uniform"

    def __call__(self, round_signals: RoundSignals) -> RuleOutcome:
        return RuleOutcome(uniform_weights(len(round_signals)))


class ComplementShareRule(WeightingRule):
    """:func:`complement_share_weights` on one signal.

    FedNolowe is this rule on ``train_loss``; U-Agg is this rule on
    ``uncertainty``.

    Parameters
    ----------
    signal : str
        The signal to read from each reply.
    """

    name = "complement-share"

    def __init__(self, signal: str) -> None:
        self.signal = signal
        self.signals = (signal,)

    def __call__(self, round_signals: RoundSignals) -> RuleOutcome:
        return RuleOutcome(complement_share_weights(round_signals.values[self.signal]))
