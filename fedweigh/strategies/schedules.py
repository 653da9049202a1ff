"""Train-config values that change from round to round.

A *schedule* maps the server round to config entries sent with that round's
train instruction (and written to the round's record in ``metrics.jsonl``).
The learning rate under ``lr-decay`` is one; FLood's pseudo-OOD weight λ(t)
(:class:`fedweigh.methods.flood.server.PseudoOODWeight`, sent whenever the
``asw`` client step runs) is another: a method package declares the
schedules its client steps need (``Declaration.schedules``).

Example
-------
>>> decay = LearningRateDecay(learning_rate=0.01, decay=0.5)
>>> [decay(t)["learning-rate"] for t in (1, 2, 3)]
[0.01, 0.005, 0.0025]
"""

from __future__ import annotations

from dataclasses import dataclass

from fedweigh.protocol import ConfigValue, recipe_key


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


class Schedules(tuple[Schedule, ...]):
    """A strategy's schedules: ``schedules(t)`` is every one's config entries for round t, later ones winning.

    >>> Schedules([LearningRateDecay(0.1, 0.5), LearningRateDecay(0.2)])(3)
    {'learning-rate': 0.2}
    """

    def __call__(self, server_round: int) -> dict[str, ConfigValue]:
        values: dict[str, ConfigValue] = {}
        for schedule in self:
            values.update(schedule(server_round))
        return values
