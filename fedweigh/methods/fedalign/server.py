"""FedAlign, the FedOUI paper's third baseline, as its authors ran it: weights by update alignment.

Each round the server computes every valid client's ``cos(Δ_k, Δ̄)``
(:func:`update_cosines`), with ``Δ_k`` the client's update and ``Δ̄`` the
round's size-weighted mean update, and weighs with
``w_k ∝ n_k^rho (max(0, cos_k) + eps)^eta`` (FedOUI spec §7; the same score
rule as FedOUI's, :func:`~fedweigh.rules.base.score_weights`, on another
signal). The cosines are a *server* signal: the rule derives them from the
replies' models (:meth:`AlignmentRule.derive_signals`), so any strategy can
use it (``aggregation = "fedalign"``) and clients train plainly.

This is *not* Mendieta et al.'s FedAlign (the paper's ref. [9], a local
regulariser); the name follows the authors' code, whose results the paper's
tables report.

Example
-------
>>> import numpy as np
>>> alignment_weights(np.array([1.0, -0.5]), np.array([10, 10])).round(4)
array([0.999, 0.001])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from fedweigh.methods.declaration import Declaration, Method, RuleSpec
from fedweigh.rules.base import NamedArrays, RoundSignals, RuleOutcome, WeightingRule, score_weights

if TYPE_CHECKING:
    from fedweigh.settings import Settings

ALIGNMENT = "alignment"
"""Server signal: cosine of each client's update with the round's mean update."""


def update_cosines(
    models: Sequence[Mapping[str, np.ndarray]], reference: Mapping[str, np.ndarray], num_examples: np.ndarray
) -> np.ndarray:
    """``cos(Δ_k, Δ̄)`` for each client, over all floating tensors of the model.

    ``Δ_k = θ_k - θ`` (client model minus the global model it started from),
    ``Δ̄ = Σ_k (n_k / Σ n) Δ_k`` (the round's size-weighted mean update,
    including client k). The tensors are treated as one concatenated vector,
    computed tensor by tensor in float64 (no concatenated copy). A cosine is
    0 when either vector is zero; values are clipped to ``[-1, 1]``.

    Parameters
    ----------
    models : sequence of mappings
        Client models (same keys and shapes as ``reference``).
    reference : mapping
        The global model of the round.
    num_examples : np.ndarray
        Sample count per client, shape ``(K,)``.

    Examples
    --------
    >>> g = {"w": np.zeros(2)}
    >>> update_cosines([{"w": np.array([1.0, 0.0])}, {"w": np.array([0.0, 1.0])}], g, np.array([1, 1])).round(4)
    array([0.7071, 0.7071])
    """
    sizes = np.asarray(num_examples, dtype=np.float64)
    if len(models) == 0 or sizes.shape != (len(models),):
        raise ValueError(f"need one sample count per model, got {len(models)} models and shape {sizes.shape}")
    shares = sizes / sizes.sum() if sizes.sum() > 0 else np.full(len(models), 1.0 / len(models))
    dots = np.zeros(len(models))
    squared = np.zeros(len(models))
    mean_squared = 0.0
    for name, anchor in reference.items():
        if not np.issubdtype(np.asarray(anchor).dtype, np.floating):
            continue
        anchor64 = np.asarray(anchor, dtype=np.float64)
        deltas = [np.asarray(model[name], dtype=np.float64) - anchor64 for model in models]
        mean = sum(share * delta for share, delta in zip(shares, deltas, strict=True))
        mean_squared += float(np.vdot(mean, mean))
        for k, delta in enumerate(deltas):
            dots[k] += float(np.vdot(delta, mean))
            squared[k] += float(np.vdot(delta, delta))
    norms = np.sqrt(squared) * math.sqrt(mean_squared)
    cosines = np.divide(dots, norms, out=np.zeros(len(models)), where=norms > 0)
    return np.clip(cosines, -1.0, 1.0)


def alignment_weights(
    cosines: np.ndarray, num_examples: np.ndarray, *, epsilon: float = 1e-3, eta: float = 1.0, rho: float = 1.0
) -> np.ndarray:
    """``w_k ∝ max(n_k, 1)^rho (max(0, cos_k) + epsilon)^eta``, normalised (spec §7)."""
    cosines = np.asarray(cosines, dtype=np.float64)
    if cosines.ndim == 1 and (not np.all(np.isfinite(cosines)) or np.any(np.abs(cosines) > 1)):
        raise ValueError(f"cosines = {cosines.tolist()} is invalid: accepted values are finite and in [-1, 1]")
    return score_weights(cosines, num_examples, epsilon=epsilon, exponent=eta, rho=rho)


class AlignmentRule(WeightingRule):
    """:func:`alignment_weights` on the ``alignment`` signal it derives from the replies' models.

    The signal comes from the server, not from the replies, so the rule asks
    the clients for nothing.
    """

    name = "update-alignment"

    def __init__(self, *, epsilon: float = 1e-3, alignment_exponent: float = 1.0, size_exponent: float = 1.0) -> None:
        alignment_weights(np.ones(1), np.ones(1), epsilon=epsilon, eta=alignment_exponent, rho=size_exponent)
        self.epsilon = epsilon
        self.alignment_exponent = alignment_exponent
        self.size_exponent = size_exponent

    def derive_signals(
        self, models: Sequence[NamedArrays], reference: NamedArrays, num_examples: np.ndarray
    ) -> dict[str, np.ndarray]:
        return {ALIGNMENT: update_cosines(models, reference, num_examples)}

    def __call__(self, round_signals: RoundSignals) -> RuleOutcome:
        if ALIGNMENT not in round_signals.values:
            raise ValueError(f"the {self.name} rule needs the '{ALIGNMENT}' signal of derive_signals")
        cosines = round_signals.values[ALIGNMENT]
        weights = alignment_weights(
            cosines,
            round_signals.num_examples,
            epsilon=self.epsilon,
            eta=self.alignment_exponent,
            rho=self.size_exponent,
        )
        return RuleOutcome(weights, {"alignment-mean": float(np.mean(cosines))})


def build_rule(settings: Settings) -> WeightingRule:
    """The rule ``[fedalign]`` describes."""
    options = settings.fedalign
    return AlignmentRule(
        epsilon=options.epsilon, alignment_exponent=options.alignment_exponent, size_exponent=options.size_exponent
    )


FEDALIGN_RULE = RuleSpec("fedalign", build_rule, "fedalign", "FedAlign: w ∝ n_k (ε + max(0, cos(Δ_k, Δ̄)))")

DECLARATION = Declaration(
    methods=(
        Method("fedalign", FEDALIGN_RULE, meaning="FedAlign (the FedOUI paper's baseline): update-alignment weights"),
    ),
    rules=(FEDALIGN_RULE,),
)
