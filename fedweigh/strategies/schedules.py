"""Train-config values that change from round to round.

A *schedule* maps the server round to config entries sent with that round's
train instruction (and written to the round's record in ``metrics.jsonl``).
The learning rate under ``lr-decay`` is one; FLood's pseudo-OOD weight λ(t)
(:class:`PseudoOODWeight`, sent whenever the ``asw`` client step runs) is
another.

Example
-------
>>> decay = LearningRateDecay(learning_rate=0.01, decay=0.5)
>>> [decay(t)["learning-rate"] for t in (1, 2, 3)]
[0.01, 0.005, 0.0025]
>>> weight = PseudoOODWeight(a=200.0, halt=1000)
>>> [round(weight(t)["asw-lambda"], 2) for t in (1, 101, 501, 2000)]
[0.0, 9.79, 200.0, 400.0]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fedweigh.protocol import ASW_LAMBDA, ConfigValue, recipe_key
from fedweigh.settings import Settings


class Schedule:
    """Base: ``schedule(server_round)`` gives the round's config entries."""

    def __call__(self, server_round: int) -> dict[str, ConfigValue]:
        raise NotImplementedError


@dataclass(frozen=True)
class LearningRateDecay(Schedule):
    """``learning-rate`` of round t: ``learning_rate · decay^(t − 1)``, t the server round (1-based)."""

    learning_rate: float
    decay: float = 1.0

    def __call__(self, server_round: int) -> dict[str, ConfigValue]:
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"lr-decay = {self.decay!r} is not accepted; accepted: 0 < lr-decay <= 1")
        return {recipe_key("learning_rate"): self.learning_rate * self.decay ** (server_round - 1)}


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


class Schedules(tuple[Schedule, ...]):
    """A strategy's schedules: ``schedules(t)`` is every one's config entries for round t, later ones winning.

    >>> Schedules([LearningRateDecay(0.1, 0.5), PseudoOODWeight(2.0, 4, shape="linear")])(3)
    {'learning-rate': 0.025, 'asw-lambda': 2.0}
    """

    def __call__(self, server_round: int) -> dict[str, ConfigValue]:
        values: dict[str, ConfigValue] = {}
        for schedule in self:
            values.update(schedule(server_round))
        return values


STEP_SCHEDULES: dict[str, Callable[[Settings], Schedule]] = {"asw": pseudo_ood_weight_schedule}
"""The schedules a client step needs from the server, by step name."""
