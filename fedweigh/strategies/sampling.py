"""Seeded client sampling that is the same for every strategy.

Flower's own sampler draws node ids with Python's unseeded ``random`` module,
and node ids are random per run, so two runs never train the same clients in
the same order. Comparisons in the papers are paired: every method sees the
same sequence of clients. Here a node is known by its *partition id* (asked
once per node with a ``query`` message, or in a simulation read from the
engine that registered the nodes, see :class:`NodeDirectory`) and the
clients of round t are drawn over the sorted partition ids, one of two ways
(``client-sampling``):

``"per-round"`` (the default)
    from ``numpy.random.default_rng([seed, t])``;
``"python-sequence"``
    the t-th draw of ``random.Random(seed).sample(range(N), n)``, one draw a
    round from one generator, as the FedNolowe authors' code samples
    (seed 42 gives their rounds, spec fednolowe §6.4). Round t replays the
    t - 1 draws before it with this round's N and n, so it is the authors'
    sequence while these stay the same.

Either way the draw depends on (seed, round, the set of connected
partitions, the sample size) only: not on the strategy, not on what earlier
rounds did, so a resumed run draws exactly what an uninterrupted one would.

Example
-------
>>> sample_partitions(seed=1, server_round=1, partitions=range(20), sample_size=5)
[5, 6, 8, 11, 12]
>>> sample_partitions(seed=1, server_round=1, partitions=range(20), sample_size=5)
[5, 6, 8, 11, 12]
>>> sample_partitions(42, 1, range(50), 5, sampler="python-sequence")  # the authors' round 1: 40, 7, 1, 47, 17
[1, 7, 17, 40, 47]
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable

import numpy as np
from flwr.app import Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedweigh.flower.engine import simulated_partitions
from fedweigh.protocol import NUM_PARTITIONS, PARTITION_ID
from fedweigh.settings import CLIENT_SAMPLERS

logger = logging.getLogger("flwr.fedweigh")


def sample_partitions(
    seed: int, server_round: int, partitions: Iterable[int], sample_size: int, sampler: str = "per-round"
) -> list[int]:
    """Draw ``sample_size`` distinct partitions for one round, sorted (``sampler``: see the module docstring)."""
    pool = sorted(partitions)
    if not 0 < sample_size <= len(pool):
        raise ValueError(f"cannot sample {sample_size} of {len(pool)} clients")
    if sampler == "per-round":
        chosen = np.random.default_rng([seed, server_round]).choice(len(pool), size=sample_size, replace=False)
    elif sampler == "python-sequence":
        sequence = random.Random(seed)
        for _ in range(server_round - 1):
            sequence.sample(range(len(pool)), sample_size)
        chosen = sequence.sample(range(len(pool)), sample_size)
    else:
        raise ValueError(f"invalid setting client-sampling = {sampler!r}; accepted: {', '.join(CLIENT_SAMPLERS)}")
    return sorted(pool[i] for i in chosen)


def sample_size(num_available: int, fraction: float, minimum: int) -> int:
    """Flower's convention: ``max(int(N * fraction), minimum)``, capped at N."""
    return min(num_available, max(int(num_available * fraction), minimum))


class NodeDirectory:
    """Node id to partition id, learned by one ``query`` message per new node.

    In a simulation, where the ServerApp runs in the engine's process, the
    engine's own mapping is read instead (:func:`fedweigh.flower.engine.simulated_partitions`):
    the same answers without a message per node, which made start-up grow by
    about 31 ms per virtual node.

    Nodes of a simulation know their ``partition-id`` from the node config; a
    SuperNode started with ``--node-config "partition-id=3 num-partitions=10"``
    does too. A node that has none (a real site with its own data folder) is
    placed after all known partitions, in the order of its node id.

    With ``ask = False`` no node is asked anything (any Flower ClientApp, which
    answers no ``query``): each node is known by its node id, which then
    stands for its partition in sampling, delays and the round records.
    """

    def __init__(self, query_timeout: float = 600.0, ask: bool = True) -> None:
        self.query_timeout = query_timeout
        self.ask = ask
        self.partition_of: dict[int, int] = {}
        self.num_partitions: int | None = None
        self.connected: list[int] = []  # the nodes connected at the last refresh

    def refresh(self, grid: Grid, min_nodes: int, wait_timeout: float = 3600.0) -> list[int]:
        """Wait for ``min_nodes`` connected nodes, learn new ones, return connected ids."""
        deadline = time.monotonic() + wait_timeout
        reported = -1
        while len(node_ids := list(grid.get_node_ids())) < min_nodes:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(node_ids)} of the {min_nodes} required nodes connected")
            if len(node_ids) != reported:  # say it when the count changes, not every second
                logger.info("waiting for nodes: %d connected, %d required", len(node_ids), min_nodes)
                reported = len(node_ids)
            time.sleep(1.0)
        unknown = [node for node in node_ids if node not in self.partition_of]
        if unknown:
            self._learn(grid, unknown)
        self.connected = node_ids
        return node_ids

    def await_federation(self, grid: Grid, min_nodes: int, timeout: float = 300.0) -> list[int]:
        """Before round 1: wait until every partition the nodes announce is connected.

        Simulated SuperNodes register one by one while the ServerApp starts;
        sampling before all are in would give round 1 a different client set
        than an otherwise identical run. Nodes say how many partitions the
        federation has (``num-partitions``), so the server waits for all of
        them, up to ``timeout`` seconds, then goes on with those present.
        """
        deadline = time.monotonic() + timeout
        while True:
            node_ids = self.refresh(grid, min_nodes)
            known = {self.partition_of[node] for node in node_ids if self.partition_of.get(node, -1) >= 0}
            if self.num_partitions is None or len(known) >= self.num_partitions:
                return node_ids
            if time.monotonic() > deadline:
                logger.warning(
                    "only %d of %d partitions connected after %.0fs; starting without the rest",
                    len(known),
                    self.num_partitions,
                    timeout,
                )
                return node_ids
            time.sleep(0.2)

    def _learn(self, grid: Grid, node_ids: list[int]) -> None:
        if not self.ask:
            self.partition_of.update({node: node for node in node_ids})
            return
        started = time.monotonic()
        if (simulated := simulated_partitions(grid, node_ids)) is not None:
            # A simulation: the engine in this process registered the nodes and says what each would answer.
            self.partition_of.update(simulated[0])
            self.num_partitions = simulated[1]
            logger.info(
                "[fedweigh] learned the partition of %d nodes from the simulation engine in %.2fs",
                len(node_ids),
                time.monotonic() - started,
            )
            return
        messages = [
            Message(content=RecordDict(), message_type=MessageType.QUERY, dst_node_id=node) for node in node_ids
        ]
        replies = list(grid.send_and_receive(messages, timeout=self.query_timeout))
        # One message per new node: a start-up cost that grows with the federation (see docs/benchmarks.md).
        logger.info("[fedweigh] asked %d nodes for their partition in %.2fs", len(node_ids), time.monotonic() - started)
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error():
                logger.warning("node %d did not describe itself: %s", node, reply.error.reason)
                continue
            metrics = next(iter(reply.content.metric_records.values()), {})
            self.partition_of[node] = int(metrics.get(PARTITION_ID, -1))
            if NUM_PARTITIONS in metrics and int(metrics[NUM_PARTITIONS]) > 0:
                self.num_partitions = int(metrics[NUM_PARTITIONS])

    def label(self, node_id: int) -> str:
        """``node 7 (partition 3)``, or ``node 7`` when its partition is not known."""
        partition = self.partition_of.get(node_id, -1)
        return f"node {node_id} (partition {partition})" if self.ask and partition >= 0 else f"node {node_id}"

    def sort_key(self, node_id: int) -> tuple[int, int]:
        """Known partitions first, in partition order; then unknown nodes by id."""
        partition = self.partition_of.get(node_id, -1)
        return (0, partition) if partition >= 0 else (1, node_id)


def sample_nodes(
    directory: NodeDirectory, node_ids: list[int], seed: int, server_round: int, size: int, sampler: str = "per-round"
) -> list[int]:
    """Seeded sample of ``size`` connected nodes, by their rank in partition order."""
    ranked = sorted(node_ids, key=directory.sort_key)
    chosen = sample_partitions(seed, server_round, range(len(ranked)), size, sampler)
    return [ranked[i] for i in chosen]
