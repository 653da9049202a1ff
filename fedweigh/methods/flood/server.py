"""FLood's server half: DAC, aggregation weights from sample counts and the clients' OOD scores.

DAC (dynamic aggregation correction, FLood paper Eq. 11, spec §3.2) mixes
each client's share of the round's samples with its share of the round's OOD
scores φ (the mean energy score of its trained model on its own data, the
``ood-score`` signal of :mod:`fedweigh.methods.flood.client`):
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fedweigh.methods.declaration import Declaration, Method, RuleSpec
from fedweigh.methods.flood.protocol import ASW_LAMBDA, OOD_SCORE, DACSettings, FLoodSettings
from fedweigh.protocol import ConfigValue
from fedweigh.strategies.library import MethodStrategy, checked_settings
from fedweigh.strategies.schedules import Schedule

if TYPE_CHECKING:
    from fedweigh.settings import Settings
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


PSEUDO_OOD_SHAPES = ("cosine", "linear", "quadratic", "exponential", "logistic")
"""Growth shapes of FLood's λ(t): the paper's cosine (Eq. 9) and its four alternatives (Sec. IV-B)."""
EXPONENTIAL_RATE = 5.0
"""k of the exponential shape (the authors' code)."""
LOGISTIC_STEEPNESS = 10.0
"""s of the logistic shape (the authors' code; the paper calls it alpha)."""


def pseudo_ood_weight(t: float, a: float, halt: int, shape: str = "cosine") -> float:
    """FLood's λ at step ``t``: from 0 at ``t = 0`` to ``2a`` at ``t = halt``, then constant.

    ``t' = min(t, T)``; cosine ``a (1 − cos(π t'/T))``; linear ``2a t'/T``;
    quadratic ``2a (t'/T)²``; exponential ``2a (1 − e^{−k t'}) / (1 − e^{−k T})``
    (k = 5); logistic ``2a (σ(s (t' − T/2)) − σ(−s T/2)) / (σ(s T/2) − σ(−s T/2))``
    (s = 10). Values as in spec §3.1.

    Examples
    --------
    >>> [round(pseudo_ood_weight(t, 200, 1000), 2) for t in (0, 32, 100, 250, 500, 750, 1000, 5000)]
    [0.0, 1.01, 9.79, 58.58, 200.0, 341.42, 400.0, 400.0]
    """
    if shape not in PSEUDO_OOD_SHAPES:
        raise ValueError(f"flood.schedule = {shape!r} is not accepted; accepted: {', '.join(PSEUDO_OOD_SHAPES)}")
    if not (math.isfinite(a) and a >= 0):
        raise ValueError(f"flood.a = {a!r} is not accepted; accepted: a finite number >= 0")
    if halt < 1:
        raise ValueError(f"flood.halt-round = {halt!r} is not accepted; accepted: an integer >= 1")
    x = min(max(t, 0.0), halt) / halt
    if shape == "cosine":
        return a * (1.0 - math.cos(math.pi * x))
    if shape == "linear":
        return 2.0 * a * x
    if shape == "quadratic":
        return 2.0 * a * x**2
    if shape == "exponential":
        k = EXPONENTIAL_RATE
        return 2.0 * a * (1.0 - math.exp(-k * x * halt)) / (1.0 - math.exp(-k * halt))
    s = LOGISTIC_STEEPNESS

    def sigmoid(value: float) -> float:
        return 0.5 * (1.0 + math.tanh(value / 2.0))  # no overflow for large |value|

    low, high = sigmoid(-s * halt / 2.0), sigmoid(s * halt / 2.0)
    return 2.0 * a * (sigmoid(s * (x * halt - halt / 2.0)) - low) / (high - low)


@dataclass(frozen=True)
class PseudoOODWeight(Schedule):
    """FLood's λ(t) for the ``asw`` step, with ``t = server round − 1`` (:func:`pseudo_ood_weight`).

    ``lag`` reproduces the authors' code: λ = 1 in the first round, then the
    value of the round before, ``f(min(t − 1, T))``.
    """

    a: float
    halt: int
    shape: str = "cosine"
    lag: bool = False

    def __call__(self, server_round: int) -> dict[str, ConfigValue]:
        t = server_round - 1
        if self.lag:
            value = 1.0 if t == 0 else pseudo_ood_weight(t - 1, self.a, self.halt, self.shape)
        else:
            value = pseudo_ood_weight(t, self.a, self.halt, self.shape)
        return {ASW_LAMBDA: value}


def pseudo_ood_weight_schedule(settings: Settings) -> Schedule:
    options = settings.flood
    return PseudoOODWeight(options.a, options.halt_round, options.schedule, options.lag)


DAC_RULE = RuleSpec(
    "dac",
    lambda settings: DACRule(settings.dac.alpha, settings.dac.mapping, settings.dac.temperature),
    "dac",
    "FLood's DAC: w = (n_k/Σn + α·share of the OOD score φ_k)/(1 + α)",
)
FLOOD = Method(
    "flood", DAC_RULE, steps=("asw",), meaning="FLood: pseudo-OOD samples weighted by λ(t) (ASW), DAC weights"
)
_FLOOD, _DAC = FLoodSettings(), DACSettings()
SCHEDULES = {"asw": pseudo_ood_weight_schedule}
"""What FLood's client steps need from the server each round: λ(t) for ``asw``."""


class DAC(DACRule):
    """FLood's DAC aggregation, usable with any strategy here: its clients then report ``ood-score`` (φ).

    ``w = (n_k/Σn + α · share of φ_k) / (1 + α)``; options as ``[dac]``.
    """

    def __init__(
        self, alpha: float = _DAC.alpha, mapping: str = _DAC.mapping, temperature: float = _DAC.temperature
    ) -> None:
        options = checked_settings({"dac": {"alpha": alpha, "mapping": mapping, "temperature": temperature}}).dac
        super().__init__(options.alpha, options.mapping, options.temperature)


class FLood(MethodStrategy):
    """FLood: pseudo-OOD samples weighted by λ(t) in the loss (ASW), and DAC weights.

    Every instruction carries λ of its round (``asw-lambda``, from 0 to
    ``2a`` by round ``halt_round``): the client weighs the lowest-scoring
    ``q`` share of each batch by λ (:func:`fedweigh.client.asw_sample_weights`)
    and after training reports ``ood-score``, its model's mean energy score φ
    (:func:`fedweigh.client.ood_score_signal`). DAC mixes sample counts with
    the φ shares by ``alpha``. Options as ``[flood]`` and ``[dac]``.
    """

    method = FLOOD

    @classmethod
    def step_schedules(cls) -> dict[str, Callable[[Settings], Schedule]]:
        return SCHEDULES

    def __init__(
        self,
        *,
        q: float = _FLOOD.q,
        a: float = _FLOOD.a,
        halt_round: int = _FLOOD.halt_round,
        schedule: str = _FLOOD.schedule,
        lag: bool = _FLOOD.lag,
        score: str = _FLOOD.score,
        temperature: float = _FLOOD.temperature,
        mask: str = _FLOOD.mask,
        phi_augment: bool = _FLOOD.phi_augment,
        alpha: float = _DAC.alpha,
        mapping: str = _DAC.mapping,
        **kwargs: Any,
    ) -> None:
        flood = {
            "q": q,
            "a": a,
            "halt_round": halt_round,
            "schedule": schedule,
            "lag": lag,
            "score": score,
            "temperature": temperature,
            "mask": mask,
            "phi_augment": phi_augment,
        }
        super().__init__(options={"flood": flood, "dac": {"alpha": alpha, "mapping": mapping}}, **kwargs)


DECLARATION = Declaration(
    methods=(FLOOD,),
    rules=(DAC_RULE,),
    schedules=SCHEDULES,
    strategies=(FLood,),
    public={"DAC": DAC},
)
