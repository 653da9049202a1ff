"""Weighting rules: from one round's client signals to aggregation weights.

A *weighting rule* reads what the sampled clients reported this round (their
sample counts and the *signals* the rule asks for, such as ``train_loss`` or
``oui``) and returns one weight per client. Weights are finite, non-negative,
sum to 1, and follow the clients if they are permuted.

The math lives in small pure functions (``*_weights``) that the tests check
against the specs' vectors; the rule classes wrap them with the name of the
signal they read, a validity check for that signal, and what to record.

Example
-------
>>> import numpy as np
>>> complement_share_weights(np.array([0.1, 0.2, 0.3, 0.4, 0.5])).round(4)
array([0.2333, 0.2167, 0.2   , 0.1833, 0.1667])
>>> by_sample_count = SampleCountRule()
>>> by_sample_count(RoundSignals(np.array([10.0, 30.0]), {})).weights
array([0.25, 0.75])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

Diagnostics = dict[str, Any]


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


def normalized(raw: np.ndarray) -> np.ndarray:
    """Scale non-negative ``raw`` to sum to 1; all zeros give uniform weights."""
    raw = np.asarray(raw, dtype=np.float64)
    if raw.ndim != 1 or len(raw) == 0:
        raise ValueError(f"weights need a non-empty 1-D array, got shape {raw.shape}")
    if np.any(raw < 0) or not np.all(np.isfinite(raw)):
        raise ValueError(f"raw weights must be finite and >= 0, got {raw.tolist()}")
    total = raw.sum()
    if total <= 0:
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


# ---------------------------------------------------------------------------
# rules
# ---------------------------------------------------------------------------

SignalCheck = Callable[[float], bool]


def finite_non_negative(value: float) -> bool:
    """Signal check: a finite value >= 0 (losses, uncertainties)."""
    return bool(np.isfinite(value) and value >= 0)


def in_unit_interval(value: float) -> bool:
    """Signal check: a finite value in [0, 1] (OUI)."""
    return bool(np.isfinite(value) and 0.0 <= value <= 1.0)


class WeightingRule:
    """Base of every rule.

    Subclasses set ``signals`` (metric keys each reply must carry, mapped to a
    check that a value must pass; a reply failing a check is left out of the
    round) and implement :meth:`__call__`. Rules that keep state across rounds
    override :meth:`state` and :meth:`load_state` so that a resumed run
    continues exactly.
    """

    name: ClassVar[str] = "rule"
    signals: ClassVar[Mapping[str, SignalCheck]] = {}

    def __call__(self, round_signals: RoundSignals) -> RuleOutcome:
        raise NotImplementedError

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
        The metric key to read from each reply.
    """

    name = "complement-share"

    def __init__(self, signal: str) -> None:
        self.signal = signal
        self.signals = {signal: finite_non_negative}

    def __call__(self, round_signals: RoundSignals) -> RuleOutcome:
        return RuleOutcome(complement_share_weights(round_signals.values[self.signal]))
