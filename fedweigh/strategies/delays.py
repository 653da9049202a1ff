"""Simulated asynchrony: every client's update arrives a seeded, half-normal number of rounds late.

The Feddle paper's clients are asynchronous: a client dispatched in round k
reports τ rounds later, τ = round(|z| σ) with z ~ N(0, 1) (half-normal, σ = 5
or 20 rounds; spec ``specs/feddle.md`` §3.9), and is not sampled again while
its update is on its way. A simulation reproduces that exactly without
keeping anyone waiting and without holding anyone's update: the server keeps
the *dispatch* (:class:`Dispatches`: which client, the round it was sampled
in, the round its update arrives) and the global model of that round, and
sends the client its instruction in the arrival round, with the model and
the round's configuration of the dispatch round. A client is a stateless
trainer, seeded by (seed, round, partition), so what it sends back is what it
would have sent in round k; the server applies it as a stale update relative
to the model of round k (:func:`fedweigh.strategies.updates.rebase`). τ = 0
arrives in its own round.

The server's memory thus grows with the global models still referenced (at
most one per round of the longest delay), not with the number of clients in
flight. τ depends on (seed, round, partition) only (:func:`delay`), not on the
strategy, so every arm of a comparison sees the same delays, the same clients
in flight, and so the same client sampling.

Example
-------
>>> [delay(seed=1, server_round=1, partition=p, std=20.0) for p in range(5)]
[4, 14, 4, 49, 33]
>>> flights = Dispatches()
>>> flights.send(partition=3, server_round=1, arrival=4)
>>> flights.send(partition=7, server_round=1, arrival=2)
>>> sorted(flights.in_flight()), flights.arriving(2), sorted(flights.in_flight())
([3, 7], [Dispatch(partition=7, round=1, arrival=2)], [3])
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

DELAY_STREAM = 104729
"""Seed stream of the delays (apart from client sampling's)."""


def delay(seed: int, server_round: int, partition: int, std: float) -> int:
    """Rounds by which the update of ``partition``, dispatched in ``server_round``, is late: round(|z| σ)."""
    if std <= 0:
        return 0
    z = np.random.default_rng([seed, DELAY_STREAM, server_round, max(partition, 0)]).standard_normal()
    return int(round(abs(float(z)) * std))


@dataclass(frozen=True)
class Dispatch:
    """A client sampled in ``round`` whose update arrives in round ``arrival``."""

    partition: int
    round: int
    arrival: int


class Dispatches:
    """The clients whose update is on its way."""

    def __init__(self) -> None:
        self.entries: list[Dispatch] = []

    def __len__(self) -> int:
        return len(self.entries)

    def send(self, partition: int, server_round: int, arrival: int) -> None:
        self.entries.append(Dispatch(partition, server_round, arrival))

    def arriving(self, server_round: int) -> list[Dispatch]:
        """The dispatches whose update arrives by ``server_round``, in the order sent; they are no longer in flight."""
        due = [entry for entry in self.entries if entry.arrival <= server_round]
        self.entries = [entry for entry in self.entries if entry.arrival > server_round]
        return due

    def in_flight(self) -> set[int]:
        """Partitions whose update has not arrived yet (not to be sampled again)."""
        return {entry.partition for entry in self.entries}

    def rounds(self) -> set[int]:
        """The rounds whose global model an update on its way started from."""
        return {entry.round for entry in self.entries}

    def state(self) -> list[dict[str, Any]]:
        return [asdict(entry) for entry in self.entries]

    def load_state(self, state: list[dict[str, Any]]) -> None:
        self.entries = [Dispatch(int(e["partition"]), int(e["round"]), int(e["arrival"])) for e in state]
