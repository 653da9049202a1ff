"""Train-config values that change from round to round.

A *schedule* maps the server round to config entries sent with that round's
train instruction (and written to the round's record in ``metrics.jsonl``).
The learning rate under ``lr-decay`` is one; FLood's pseudo-OOD weight λ(t)
is another kind of the same thing.

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
