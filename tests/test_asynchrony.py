"""Asynchronous clients, for every strategy: seeded simulated delays, and round deadlines in a deployment.

The simulated runs go through the in-process federation (:mod:`loopback`):
the real ServerApp and ClientApp, messages serialised as on the wire. The
deadline grid is tested against a fake SuperLink and a fake clock, so that
nothing waits for real; ``test_deployment.py`` runs it for real, one node slow.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable

import numpy as np
import pytest
import torch
from conftest import Clock, OfflineGrid
from flwr.app import Message, Metadata, MetricRecord, RecordDict
from flwr.app.message.message import make_message
from loopback import run_in_process

from fedweigh.results import read_metrics
from fedweigh.strategies.deadline import Deadline, DeadlineGrid
from fedweigh.strategies.delays import Dispatch, Dispatches, delay

ASYNC = {
    "num-server-rounds": 8,
    "fraction-train": 0.5,
    "seed": 4,
    "delay-std": 2.0,
    "max-staleness": 20,
}
FEDDLE = {"server-data": "id", "server-data-size": 60, "feddle.search-epochs": 1}


def test_delays_are_half_normal_seeded_and_the_same_for_every_strategy():
    draws = np.array([delay(seed=1, server_round=r, partition=p, std=20.0) for r in range(300) for p in range(10)])
    assert draws.min() == 0 and abs(draws.mean() - 20.0 * np.sqrt(2 / np.pi)) < 1.0  # E|z|σ = σ sqrt(2/π)
    assert [delay(1, 5, p, 20.0) for p in range(6)] == [delay(1, 5, p, 20.0) for p in range(6)]
    assert [delay(1, 5, p, 20.0) for p in range(6)] != [delay(2, 5, p, 20.0) for p in range(6)]
    assert delay(1, 5, 3, 0.0) == 0


def test_dispatches_arrive_in_their_round_and_round_trip():
    flights = Dispatches()
    for partition, sent, arrival in [(1, 1, 3), (2, 1, 2), (3, 2, 3)]:
        flights.send(partition, sent, arrival)
    assert flights.arriving(1) == [] and flights.in_flight() == {1, 2, 3} and flights.rounds() == {1, 2}
    assert flights.arriving(2) == [Dispatch(2, 1, 2)] and flights.in_flight() == {1, 3}
    restored = Dispatches()
    restored.load_state(flights.state())
    assert restored.arriving(3) == [Dispatch(1, 1, 3), Dispatch(3, 2, 3)] and len(restored) == 0


@pytest.fixture(scope="module")
def output_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("asynchrony")


@pytest.fixture(scope="module")
def async_runs(output_dir):
    runs = {}
    for index, strategy in enumerate(["fedavg", "fedbuff", "feddle", "fedasync"]):
        config = {**ASYNC, "strategy": strategy, "output-dir": str(output_dir), "run-name": strategy}
        config.update(FEDDLE if strategy == "feddle" else {})
        runs[strategy] = read_metrics(run_in_process(config, num_nodes=8, node_seed=index))
    return runs


def test_a_client_is_not_sampled_while_its_update_is_on_its_way(async_runs):
    for rows in async_runs.values():
        assert any(row["in_flight"] for row in rows)
        for before, row in zip(rows, rows[1:], strict=False):
            assert not set(row["sampled"]) & set(before["in_flight"]), (
                row["round"],
                row["sampled"],
                before["in_flight"],
            )


def test_each_update_arrives_its_seeded_delay_after_it_was_sent(async_runs):
    for rows in async_runs.values():
        sent = [(row["round"], partition) for row in rows for partition in row["sampled"]]
        arrived = [(row["round"] - c["staleness"], c["partition"]) for row in rows for c in row["clients"]]
        for dispatched, partition in arrived:
            late = [row["round"] - dispatched for row in rows for c in row["clients"] if c["partition"] == partition]
            assert delay(ASYNC["seed"], dispatched, partition, ASYNC["delay-std"]) in late
        still_out = [(r, p) for r, p in sent if (r, p) not in arrived]
        assert sorted(p for _, p in still_out) == sorted(rows[-1]["in_flight"])  # nothing lost, nothing twice
        assert any(c["staleness"] > 0 for row in rows for c in row["clients"])


def test_every_strategy_sees_the_same_delays_and_samples(async_runs):
    sequences = {name: [(row["sampled"], row["in_flight"]) for row in rows] for name, rows in async_runs.items()}
    assert len({json.dumps(sequence) for sequence in sequences.values()}) == 1


def test_the_server_reports_what_it_holds_for_the_updates_on_their_way(async_runs):
    for row in async_runs["fedbuff"]:
        report = row["diagnostics"]
        assert report["in-flight"] == len(row["in_flight"])
        # one global model per round an update on its way started from, and this round's; no client's update
        assert 1 <= report["held-models"] <= report["in-flight"] + 1 and report["held-mb"] > 0
        assert report["held-models"] == 1 or report["in-flight"] > 0


def test_updates_later_than_max_staleness_are_left_out_with_the_reason(output_dir):
    config = {**ASYNC, "delay-std": 3.0, "max-staleness": 1, "output-dir": str(output_dir), "run-name": "bound"}
    rows = read_metrics(run_in_process(config, num_nodes=8))
    reasons = [why for row in rows for why in row["left_out"].values()]
    assert reasons and all("rounds after it was sent; accepted: at most max-staleness = 1" in why for why in reasons)
    assert all(int(p) not in row["in_flight"] for row in rows for p in row["left_out"])  # free to be sampled again
    assert all(c["staleness"] <= 1 for row in rows for c in row["clients"])


def test_a_resumed_asynchronous_run_ends_where_the_uninterrupted_one_does(output_dir, async_runs):
    half = {**ASYNC, "strategy": "fedbuff", "output-dir": str(output_dir), "run-name": "half", "num-server-rounds": 4}
    folder = run_in_process(half, num_nodes=8, node_seed=7)
    run_in_process({**half, "num-server-rounds": 8, "resume-from": str(folder)}, num_nodes=8, node_seed=8)
    resumed, straight = read_metrics(folder), async_runs["fedbuff"]
    assert [(r["sampled"], r["in_flight"], r["accuracy"]) for r in resumed] == [
        (r["sampled"], r["in_flight"], r["accuracy"]) for r in straight
    ]
    final = torch.load(folder / "model.pt")
    expected = torch.load(output_dir / "fedbuff" / "model.pt")
    assert all(torch.equal(final[name], expected[name]) for name in expected)


# ---------------------------------------------------------------------------
# the deadline grid, against a fake SuperLink and a fake clock
# ---------------------------------------------------------------------------


class SlowLink(OfflineGrid):
    """A SuperLink whose node ``n`` replies ``latency[n]`` fake seconds after an instruction (never if None)."""

    def __init__(self, clock: Clock, latency: dict[int, float | None]) -> None:
        self.clock, self.latency = clock, latency
        self.pushed: dict[str, tuple[Message, float]] = {}
        self.passed_through: list[list[Message]] = []

    def get_node_ids(self) -> Iterable[int]:
        return list(self.latency)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            message_id = uuid.uuid4().hex
            self.pushed[message_id] = (message, self.clock())
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        replies = []
        for message_id in message_ids:
            message, pushed_at = self.pushed[message_id]
            latency = self.latency[message.metadata.dst_node_id]
            if latency is not None and self.clock() >= pushed_at + latency:
                replies.append(answer(message_id, message.metadata.dst_node_id))
                del self.pushed[message_id]
        return replies

    def send_and_receive(self, messages, *, timeout=None):
        self.passed_through.append(list(messages))
        return []


def answer(message_id: str, node: int) -> Message:
    metadata = Metadata(
        run_id=1,
        message_id=uuid.uuid4().hex,
        src_node_id=node,
        dst_node_id=0,
        reply_to_message_id=message_id,
        group_id="",
        created_at=0.0,
        ttl=60,
        message_type="train",
    )
    return make_message(metadata=metadata, content=RecordDict({"metrics": MetricRecord({"node": node})}))


def instructions(nodes: Iterable[int], kind: str = "train") -> list[Message]:
    return [Message(RecordDict(), dst_node_id=node, message_type=kind) for node in nodes]


def senders(replies: Iterable[Message]) -> list[int]:
    return sorted(reply.metadata.src_node_id for reply in replies)


def deadline_grid(latency, **deadline) -> tuple[DeadlineGrid, Clock]:
    clock = Clock()
    options = {"seconds": 1.0, "poll": 0.1, **deadline}
    return DeadlineGrid(SlowLink(clock, latency), Deadline(**options), clock=clock, sleep=clock.sleep), clock


def test_a_round_with_every_reply_in_time_closes_at_once():
    grid, clock = deadline_grid({1: 0.2, 2: 0.3})
    assert senders(grid.send_and_receive(instructions([1, 2]), timeout=60)) == [1, 2]
    assert clock.now < 0.5 and grid.busy_nodes() == set()


def test_a_round_closes_at_its_deadline_and_the_straggler_joins_a_later_round():
    grid, clock = deadline_grid({1: 0.2, 2: 0.3, 3: 1.15}, max_staleness=3)
    first = grid.send_and_receive(instructions([1, 2, 3]), timeout=60)
    assert senders(first) == [1, 2] and 1.0 <= clock.now < 1.2 and grid.busy_nodes() == {3}
    assert list(grid.origins().values()) == [3]
    second = grid.send_and_receive(instructions([1, 2]), timeout=60)  # the strategy does not resend to 3
    assert senders(second) == [1, 2, 3] and grid.busy_nodes() == set()


def test_a_round_waits_past_its_deadline_for_the_minimum_number_of_replies():
    grid, clock = deadline_grid({1: 0.2, 2: 2.5, 3: 4.0}, min_replies=2)
    assert senders(grid.send_and_receive(instructions([1, 2, 3]), timeout=60)) == [1, 2]
    assert 2.5 <= clock.now < 2.7 and grid.busy_nodes() == {3}


def test_an_instruction_older_than_max_staleness_is_given_up_and_its_node_is_free():
    grid, _ = deadline_grid({1: 0.1, 2: None}, max_staleness=1)
    for _ in range(2):
        grid.send_and_receive(instructions([1] if grid.busy_nodes() else [1, 2]), timeout=60)
    assert grid.busy_nodes() == {2} and grid.given_up == 0
    grid.send_and_receive(instructions([1]), timeout=60)
    assert grid.busy_nodes() == set() and grid.given_up == 1


def test_instructions_carry_a_time_to_live_and_other_messages_pass_through():
    grid, _ = deadline_grid({1: 0.1}, seconds=5.0, max_staleness=2)
    messages = instructions([1])
    grid.send_and_receive(messages, timeout=60)
    assert messages[0].metadata.ttl == 5.0 * 4
    queries = instructions([1], kind="query")
    assert grid.send_and_receive(queries, timeout=60) == [] and grid.grid.passed_through == [queries]


def test_an_instruction_lives_at_least_as_long_as_the_server_waits_for_its_round():
    """``round-deadline=5.0`` gave instructions 10 s to live: shorter than Ray took to start its workers, so rounds 1
    and 2 lost every client ("Message Unavailable ... expired due to its TTL") and the run still ended completed."""
    grid, _ = deadline_grid({1: 0.1}, seconds=5.0, max_staleness=0, timeout=3600.0)
    messages = instructions([1])
    grid.send_and_receive(messages, timeout=3600.0)
    assert messages[0].metadata.ttl == 3600.0
    assert Deadline(5.0, max_staleness=800, timeout=60.0).ttl == 5.0 * 802  # a long staleness bound keeps its own


def test_a_round_still_waiting_after_a_minute_says_whom_it_waits_for(caplog):
    """A stalled client held its round silently (an hour, by default): now every minute names who is missing."""
    grid, clock = deadline_grid({1: 0.2, 2: None, 3: 130.0}, seconds=300.0)
    grid.set_node_label(lambda node: f"node {node} (partition {node - 1})")
    with caplog.at_level(logging.WARNING, logger="flwr.fedweigh"):
        replies = grid.send_and_receive(instructions([1, 2, 3]), timeout=200.0)
    assert senders(replies) == [1, 3] and 200.0 <= clock.now < 200.2
    reports = [record.getMessage() for record in caplog.records if "still waiting" in record.getMessage()]
    assert reports == [
        "[fedweigh] still waiting after 60 s for 2 of 3 replies: node 2 (partition 1), node 3 (partition 2)",
        "[fedweigh] still waiting after 120 s for 2 of 3 replies: node 2 (partition 1), node 3 (partition 2)",
        "[fedweigh] still waiting after 180 s for 1 of 3 replies: node 2 (partition 1)",
    ]
