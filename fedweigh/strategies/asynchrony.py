"""Asynchronous clients, for every strategy: updates that arrive rounds late, and which models they need.

A strategy's clients are asynchronous in one of two ways, so that every arm
of a comparison sees the same delays:

* **simulated** (``delay_std`` > 0): each sampled client's update is held back
  a seeded, half-normal number of rounds (:mod:`fedweigh.strategies.delays`);
  the client is sent its instruction (the model and values of the round it
  was sampled in) only in the round its update arrives, and an update later
  than ``max_staleness`` rounds is left out;
* **real** (a :class:`~fedweigh.strategies.deadline.Deadline`): a round
  closes at its deadline and late replies join later rounds
  (:class:`~fedweigh.strategies.deadline.DeadlineGrid`).

Either way a client is not sampled while its update is on its way, and a
late update is applied relative to the model it started from: the strategy
keeps the global models that updates on their way may still need
(:meth:`Asynchrony.rounds_to_keep`). :class:`Asynchrony` holds all of this
for :class:`~fedweigh.strategies.base.WeightedFedAvg`, which asks it whom not
to sample, whom to hold back, who arrives, and what it must keep; its state
(the updates on their way, with the faults they carry) goes into the
checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flwr.serverapp import Grid

from fedweigh.strategies.deadline import Deadline, DeadlineGrid
from fedweigh.strategies.delays import Dispatches, delay
from fedweigh.strategies.sampling import NodeDirectory

logger = logging.getLogger("flwr.fedweigh")


@dataclass
class Arrivals:
    """What arrives in a round under simulated delays.

    Attributes
    ----------
    by_round : dict
        Model round to the nodes whose update (trained from that round's model) arrives now.
    faults : dict
        Node to the fault it was told to commit when sampled (fault injection).
    left_out : dict
        Partition (as text) to why its update is left out (too late, or its node left).
    """

    by_round: dict[int, list[int]] = field(default_factory=dict)
    faults: dict[int, str] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)


class Asynchrony:
    """The asynchrony of one strategy (see the module docstring); synchronous when neither way is on.

    Parameters
    ----------
    delay_std : float
        σ (rounds) of the simulated half-normal delay; 0: none.
    deadline : Deadline, optional
        Real asynchrony: training rounds close at this deadline.
    max_staleness : int
        Rounds an update may lag behind and still be used.
    seed : int
        Seeds the simulated delays (with the round and the partition).
    """

    def __init__(
        self, delay_std: float = 0.0, deadline: Deadline | None = None, max_staleness: int = 0, seed: int = 0
    ) -> None:
        self.delay_std = delay_std
        self.deadline = deadline
        self.max_staleness = max_staleness
        self.seed = seed
        self.deadline_grid: DeadlineGrid | None = None
        self.dispatches = Dispatches()  # simulated: clients whose update is on its way
        self.pending_faults: dict[tuple[int, int], str] = {}  # (partition, round sampled) -> fault, while delayed

    @property
    def on(self) -> bool:
        """True when updates may arrive late, one way or the other."""
        return self.delay_std > 0 or self.deadline is not None

    def grid(self, grid: Grid) -> Grid:
        """The grid a run uses: with a deadline, a :class:`DeadlineGrid` around ``grid``."""
        if self.deadline is not None:
            self.deadline_grid = DeadlineGrid(grid, self.deadline)
            return self.deadline_grid
        return grid

    def busy_nodes(self, directory: NodeDirectory) -> set[int]:
        """Nodes whose update is still on its way: not to be sampled (spec: no re-sampling in flight)."""
        busy = set(self.deadline_grid.busy_nodes()) if self.deadline_grid else set()
        in_flight = self.dispatches.in_flight()
        if in_flight:
            busy |= {node for node, partition in directory.partition_of.items() if partition in in_flight}
        return busy

    def in_flight(self, directory: NodeDirectory) -> list[int]:
        """The partitions whose update is on its way, sorted."""
        nodes = self.deadline_grid.busy_nodes() if self.deadline_grid else set()
        return sorted(self.dispatches.in_flight() | {directory.partition_of.get(node, -1) for node in nodes})

    def origins(self) -> dict[str, int]:
        """Message id to node of every instruction a deadline left in flight (none otherwise)."""
        return self.deadline_grid.origins() if self.deadline_grid else {}

    def hold_back(
        self, current: int, chosen: Sequence[int], partitions: Sequence[int], faults: Mapping[int, str]
    ) -> list[int]:
        """The sampled nodes to send an instruction now; the others' updates are dispatched to arrive later.

        ``partitions`` are the ``chosen`` nodes' partitions, ``faults`` the
        fault each of some nodes is told to commit (kept until it arrives).
        """
        if self.delay_std <= 0:
            return list(chosen)
        now = []
        for node, partition in zip(chosen, partitions, strict=True):
            late = delay(self.seed, current, partition, self.delay_std)
            if late == 0:
                now.append(node)
                continue
            self.dispatches.send(partition, current, current + late)
            if node in faults:
                self.pending_faults[(partition, current)] = faults[node]
        return now

    def arrivals(self, current: int, directory: NodeDirectory) -> Arrivals:
        """The updates dispatched earlier that arrive in round ``current`` (simulated delays)."""
        node_of = {partition: node for node, partition in directory.partition_of.items()}
        connected = set(directory.connected)
        arrived = Arrivals()
        for dispatch in self.dispatches.arriving(current):
            late = current - dispatch.round
            node = node_of.get(dispatch.partition)
            fault = self.pending_faults.pop((dispatch.partition, dispatch.round), "")
            if fault and node is not None:
                arrived.faults[node] = fault
            if late > self.max_staleness:
                why = (
                    f"its update arrives {late} rounds after it was sent; "
                    f"accepted: at most max-staleness = {self.max_staleness}"
                )
            elif node is None or node not in connected:
                why = "the node left the federation before its update arrived"
            else:
                arrived.by_round.setdefault(dispatch.round, []).append(node)
                continue
            logger.warning("round %d: left out partition %d: %s", current, dispatch.partition, why)
            arrived.left_out[str(dispatch.partition)] = why
        return arrived

    def rounds_to_keep(self, current: int, held: Sequence[int]) -> set[int]:
        """The rounds among ``held`` whose global model an update may still be applied against, and this round's.

        Synchronously: the last ``max_staleness`` rounds'. Asynchronously:
        the ones updates on their way started from (never older than
        ``max_staleness`` rounds), and this round's.
        """
        oldest = current - self.max_staleness
        if not self.on:
            return {r for r in held if r >= oldest}
        needed = self.dispatches.rounds()
        if self.deadline_grid is not None:
            needed |= set(range(oldest, current + 1))  # replies in flight name their round only on arrival
        return {r for r in needed if r >= oldest} | {current}

    def state(self) -> dict[str, Any]:
        """The updates on their way and the faults they carry (nothing when none is)."""
        state: dict[str, Any] = {}
        if len(self.dispatches):
            state["dispatches"] = self.dispatches.state()
        if self.pending_faults:
            state["pending-faults"] = [[p, r, kind] for (p, r), kind in sorted(self.pending_faults.items())]
        return state

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.dispatches.load_state(state.get("dispatches", []))
        self.pending_faults = {(int(p), int(r)): str(kind) for p, r, kind in state.get("pending-faults", [])}
