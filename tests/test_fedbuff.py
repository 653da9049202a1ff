"""FedBuff as Nguyen et al. define it: a buffer of K updates, a staleness-weighted step when it is full.

The step is checked against values computed by hand; the buffer across
rounds (a round that only buffers keeps the model, one that overfills steps
twice), across a checkpoint (saved and loaded as a checkpoint file), and
under real asynchrony, a round deadline with a straggler, through the
strategy and a fake SuperLink on a fake clock. ``buffer-size = 0`` is the
FedBuff of before (Feddle's fallback step alone), and Feddle's own fallback
keeps its spec's settings, apart from FedBuff's. The settings: their
defaults written once, and a buffer no run can fill refused by name.
"""

from __future__ import annotations

import math
import tomllib
import uuid
from collections.abc import Iterable

import numpy as np
import pytest
from conftest import REPO, Clock, OfflineGrid
from flwr.app import ConfigRecord, Message, Metadata, MetricRecord, RecordDict
from flwr.app.message.message import make_message

from fedweigh.arrays import decode, encode
from fedweigh.methods.fedasync.protocol import FedAsyncSettings
from fedweigh.methods.fedbuff.protocol import FedBuffSettings
from fedweigh.methods.fedbuff.server import BufferedStep, buffered_step, staleness_weight
from fedweigh.methods.feddle.protocol import FeddleSettings
from fedweigh.methods.feddle.update import FallbackStep, FeddleUpdate
from fedweigh.preflight import check_run
from fedweigh.protocol import (
    ARRAYS,
    CONFIG,
    MODEL_ROUND,
    NUM_EXAMPLES,
    NUM_PARTITIONS,
    PARTITION_ID,
    SERVER_ROUND,
    TRAIN_LOSS,
)
from fedweigh.results import Checkpoint
from fedweigh.settings import SettingsError, validate
from fedweigh.strategies.build import build_strategy
from fedweigh.strategies.deadline import DeadlineGrid
from fedweigh.strategies.updates import RoundUpdate

# ---------------------------------------------------------------------------
# the step, by hand
# ---------------------------------------------------------------------------


def vector(*values: float) -> dict[str, np.ndarray]:
    return {"w": np.array(values, dtype=np.float32)}


def arrivals(server_round, current, clients, starts=None) -> RoundUpdate:
    """A round's arrivals: ``clients`` as (model round, Δ) pairs, each trained from ``starts[model round]``."""
    starts = {server_round: current, **(starts or {})}
    models = [{"w": starts[r]["w"] + np.array(delta, dtype=np.float32)} for r, delta in clients]
    count = len(models)
    return RoundUpdate(
        server_round,
        current,
        models,
        [r for r, _ in clients],
        np.full(count, 1.0 / count),
        np.full(count, 10.0),
        start_models={r: m for r, m in starts.items() if r != server_round},
    )


def test_staleness_weight_is_one_over_the_root_of_one_plus_tau():
    assert [staleness_weight(t) for t in (0, 1, 3, 8)] == pytest.approx([1.0, 1 / math.sqrt(2), 0.5, 1 / 3])


@pytest.mark.parametrize("scaled", [True, False])
def test_a_full_buffer_steps_by_the_server_lr_times_the_staleness_weighted_mean(scaled):
    """Three steps taken before (in rounds 3, 4, 4); round 5 brings a fresh update and two stale ones."""
    fedbuff = BufferedStep(buffer_size=3, server_lr=0.1, staleness_scaling=scaled)
    fedbuff.step_rounds = [3, 4, 4]
    current = vector(1.0, 2.0)
    starts = {4: vector(0.5, 0.5), 2: vector(-1.0, 3.0)}
    step = arrivals(5, current, [(5, [1.0, 0.0]), (4, [0.0, 3.0]), (2, [4.0, 4.0])], starts)
    new = fedbuff(step)
    # τ = steps since each model was sent: 0 (round 5), 2 (the two of round 4), 3 (rounds 3 and 4)
    assert step.diagnostics["staleness-steps"] == [0, 2, 3]
    if scaled:  # s = 1, 1/√3, 1/2: Σ sΔ = (1 + 0 + 2, 0 + 3/√3 + 2) = (3, 3.7320508)
        expected = [1.0 + 0.1 / 3 * 3.0, 2.0 + 0.1 / 3 * 3.7320508]
        assert step.diagnostics["staleness-weights"] == [1.0, 0.57735, 0.5]
    else:  # Σ Δ = (5, 7)
        expected = [1.0 + 0.1 / 3 * 5.0, 2.0 + 0.1 / 3 * 7.0]
        assert step.diagnostics["staleness-weights"] == [1.0, 1.0, 1.0]
    np.testing.assert_allclose(new["w"], expected, rtol=1e-6)
    assert new["w"].dtype == np.float32
    assert step.diagnostics | {"staleness-weights": None} == {
        "server-steps": 1,
        "buffered": 0,
        "model-version": 4,
        "staleness-steps": [0, 2, 3],
        "staleness-weights": None,
    }


def test_a_round_that_does_not_fill_the_buffer_keeps_the_model_and_a_later_one_steps():
    fedbuff = BufferedStep(buffer_size=4, server_lr=0.5)
    w1 = vector(0.0, 0.0)
    first = arrivals(1, w1, [(1, [1.0, 0.0]), (1, [0.0, 2.0]), (1, [3.0, 3.0])])
    np.testing.assert_array_equal(fedbuff(first)["w"], w1["w"])
    assert (first.diagnostics["server-steps"], first.diagnostics["buffered"]) == (0, 3)
    # round 2: the first arrival fills the buffer (a step), the other two wait, one step stale
    second = arrivals(2, w1, [(2, [1.0, 1.0]), (2, [2.0, 0.0]), (2, [0.0, 4.0])])
    w2 = fedbuff(second)
    np.testing.assert_allclose(w2["w"], [0.5 / 4 * 5.0, 0.5 / 4 * 6.0], rtol=1e-6)  # Σ Δ of the first four: (5, 6)
    assert second.diagnostics["staleness-steps"] == [0, 1, 1]
    assert (second.diagnostics["server-steps"], second.diagnostics["buffered"]) == (1, 2)
    # round 3: two fresh ones fill it again, with the two waiting at 1/√2
    third = arrivals(3, w2, [(3, [2.0, 0.0]), (3, [0.0, 2.0])])
    w3 = fedbuff(third)
    waiting = np.array([2.0, 4.0]) / math.sqrt(2)
    np.testing.assert_allclose(w3["w"], w2["w"] + 0.5 / 4 * (waiting + [2.0, 2.0]), rtol=1e-6)
    assert third.diagnostics["model-version"] == 2 and third.diagnostics["buffered"] == 0


def test_a_round_that_brings_two_buffers_full_steps_twice():
    fedbuff = BufferedStep(buffer_size=2, server_lr=1.0, staleness_scaling=False)
    step = arrivals(1, vector(0.0), [(1, [1.0]), (1, [3.0]), (1, [5.0]), (1, [7.0]), (1, [100.0])])
    np.testing.assert_allclose(fedbuff(step)["w"], [(1.0 + 3.0) / 2 + (5.0 + 7.0) / 2])
    assert step.diagnostics["staleness-steps"] == [0, 0, 1, 1, 2]
    assert (step.diagnostics["server-steps"], step.diagnostics["buffered"]) == (2, 1)


def test_integer_buffers_take_the_step_rounded():
    model = {"w": np.array([1.0], dtype=np.float32), "n": np.array(10, dtype=np.int64)}
    stepped = buffered_step(model, {"w": np.array([1.0]), "n": np.array(5.0)}, buffer_size=2, server_lr=1.0)
    assert stepped["n"].dtype == np.int64 and int(stepped["n"]) == 12  # 10 + 2.5, rounded to even
    assert stepped["w"].dtype == np.float32 and stepped["w"].tolist() == [1.5]


# ---------------------------------------------------------------------------
# the buffer across a checkpoint
# ---------------------------------------------------------------------------


def rounds_of_arrivals(seed: int = 0) -> list[RoundUpdate]:
    """Five rounds of 3 arrivals on a two-tensor model; some stale."""
    rng = np.random.default_rng(seed)
    models = {r: {"w": rng.normal(size=(3, 2)).astype(np.float32), "b": rng.normal(size=2)} for r in range(1, 6)}
    steps = []
    for server_round in range(1, 6):
        rounds = [max(1, server_round - int(rng.integers(0, 3))) for _ in range(3)]
        clients = [{k: v + rng.normal(size=v.shape).astype(v.dtype) for k, v in models[r].items()} for r in rounds]
        count = len(clients)
        steps.append(
            RoundUpdate(
                server_round,
                models[server_round],
                clients,
                rounds,
                np.full(count, 1.0 / count),
                np.full(count, 10.0),
                start_models={r: models[r] for r in rounds},
            )
        )
    return steps


def test_the_buffer_and_the_steps_taken_cross_a_checkpoint_file(tmp_path):
    straight = BufferedStep(buffer_size=4, server_lr=0.3)
    expected = [straight(step) for step in rounds_of_arrivals()]
    first = BufferedStep(buffer_size=4, server_lr=0.3)
    before = [first(step) for step in rounds_of_arrivals()[:2]]  # 6 arrivals: one step, 2 waiting
    assert first.buffer.count == 2 and first.steps == 1
    Checkpoint(2, before[-1], {"update": first.state()}).save(tmp_path / "checkpoint.pt")
    resumed = BufferedStep(buffer_size=4, server_lr=0.3)
    resumed.load_state(Checkpoint.load(tmp_path / "checkpoint.pt").strategy_state["update"])
    after = [resumed(step) for step in rounds_of_arrivals()[2:]]
    for got, want in zip(before + after, expected, strict=True):
        for name in want:
            assert got[name].tobytes() == want[name].tobytes(), name
    lost = BufferedStep(buffer_size=4, server_lr=0.3)  # the same rounds without the state end elsewhere
    assert lost(rounds_of_arrivals()[2])["w"].tobytes() != expected[2]["w"].tobytes()


# ---------------------------------------------------------------------------
# buffer-size 0, and Feddle's fallback
# ---------------------------------------------------------------------------


def test_buffer_size_zero_is_the_fedbuff_of_before_feddles_fallback_step_with_fedbuffs_settings():
    update = BufferedStep.build(validate({"strategy": "fedbuff", "fedbuff.buffer-size": 0, "fedbuff.server-lr": 0.5}))
    assert isinstance(update, FallbackStep) and not update.searches
    assert (update.server_lr, update.staleness_scaling) == (0.5, True)
    # Feddle's own fallback keeps the spec's η_g = 1 and no staleness weight (§3.4), whatever FedBuff's are
    feddle = FeddleUpdate.build(validate({"strategy": "feddle", "fedbuff.server-lr": 0.01}))
    assert (feddle.server_lr, feddle.staleness_scaling) == (1.0, False)
    tuned = validate({"feddle.fallback-server-lr": 0.1, "feddle.fallback-staleness-scaling": True})
    assert (FeddleUpdate.build(tuned).server_lr, FeddleUpdate.build(tuned).staleness_scaling) == (0.1, True)


def test_every_default_is_written_once_the_app_config_holds_the_settings_defaults():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert FedBuffSettings.model_validate(config["fedbuff"]) == FedBuffSettings()
    assert FeddleSettings.model_validate(config["feddle"]) == FeddleSettings()
    assert FedAsyncSettings.model_validate(config["fedasync"]) == FedAsyncSettings()
    assert (FedBuffSettings().buffer_size, FedBuffSettings().staleness_scaling) == (10, True)  # Nguyen et al.'s


# ---------------------------------------------------------------------------
# settings
# ---------------------------------------------------------------------------


def refusal(config, num_partitions=10) -> list[str]:
    with pytest.raises(SettingsError) as caught:
        check_run(config, num_partitions)
    return caught.value.problems


def test_a_buffer_no_run_of_this_length_can_fill_is_refused_naming_what_arrives():
    config = {"strategy": "fedbuff", "fedbuff.buffer-size": 50, "num-server-rounds": 4, "fraction-train": 0.5}
    (problem,) = refusal(config)
    assert problem == (
        "strategy = 'fedbuff' with fedbuff.buffer-size = 50 would never step: at most num-server-rounds = 4 x 5 "
        "clients a round (fraction-train = 0.5 of 10 nodes, at least min-train-nodes = 2) = 20 updates ever arrive; "
        "accepted: fedbuff.buffer-size <= 20, or 0 (a step every round on what arrived)"
    )
    check_run({**config, "fedbuff.buffer-size": 20}, 10)  # fills once, in the last round
    check_run({**config, "strategy": "fedavg"}, 10)  # another strategy ignores it


def test_a_negative_buffer_size_is_refused_by_name():
    (problem,) = refusal({"strategy": "fedbuff", "fedbuff.buffer-size": -1})
    assert problem == "fedbuff.buffer-size = -1: Input should be greater than or equal to 0"


# ---------------------------------------------------------------------------
# real asynchrony: rounds that close at a deadline
# ---------------------------------------------------------------------------

DELTAS = {p: np.array([p + 1.0, -(p + 1.0)], dtype=np.float32) for p in range(4)}
"""Partition p's client returns the model it got plus this."""


class SlowFederation(OfflineGrid):
    """Nodes 10..13 hold partitions 0..3; node 13 answers its first instruction 10.5 fake seconds late, every other
    instruction is answered after 1 s, with the model it carried plus the partition's :data:`DELTAS`."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.pushed: dict[str, tuple[Message, float]] = {}
        self.instructions: dict[int, int] = {}

    def get_node_ids(self) -> Iterable[int]:
        return [10, 11, 12, 13]

    def send_and_receive(self, messages, *, timeout=None):  # the partition queries
        return [
            self._reply(m, "", MetricRecord({PARTITION_ID: m.metadata.dst_node_id - 10, NUM_PARTITIONS: 4}))
            for m in messages
        ]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            node = message.metadata.dst_node_id
            self.instructions[node] = self.instructions.get(node, 0) + 1
            latency = 10.5 if node == 13 and self.instructions[node] == 1 else 1.0
            ids.append(message_id := uuid.uuid4().hex)
            self.pushed[message_id] = (message, self.clock() + latency)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        replies = []
        for message_id in message_ids:
            message, due = self.pushed[message_id]
            if self.clock() >= due:
                del self.pushed[message_id]
                replies.append(self._trained(message_id, message))
        return replies

    def _trained(self, message_id: str, message: Message) -> Message:
        partition = message.metadata.dst_node_id - 10
        model_round = int(message.content.config_records[CONFIG][SERVER_ROUND])
        model = decode(message.content.array_records[ARRAYS])
        metrics = {NUM_EXAMPLES: 10, TRAIN_LOSS: 0.5, PARTITION_ID: partition, MODEL_ROUND: model_round}
        return self._reply(message, message_id, MetricRecord(metrics), {"w": model["w"] + DELTAS[partition]})

    @staticmethod
    def _reply(message: Message, message_id: str, metrics: MetricRecord, arrays=None) -> Message:
        metadata = Metadata(
            run_id=1,
            message_id=uuid.uuid4().hex,
            src_node_id=message.metadata.dst_node_id,
            dst_node_id=0,
            reply_to_message_id=message_id,
            group_id="",
            created_at=0.0,
            ttl=60,
            message_type=message.metadata.message_type,
        )
        content = RecordDict({"metrics": metrics})
        if arrays is not None:
            content[ARRAYS] = encode(arrays)
        return make_message(metadata=metadata, content=content)


def test_with_a_round_deadline_a_straggler_joins_the_buffer_of_a_later_round_at_its_staleness():
    settings = validate(
        {
            "strategy": "fedbuff",
            "fedbuff.buffer-size": 3,
            "fedbuff.server-lr": 0.5,
            "round-deadline": 10.0,
            "max-staleness": 3,
            "fraction-train": 1.0,
        }
    )
    strategy = build_strategy(settings)
    clock = Clock()
    grid = strategy.asynchrony.deadline_grid = DeadlineGrid(
        SlowFederation(clock), strategy.deadline, clock, clock.sleep
    )
    arrays = encode({"w": np.zeros(2, dtype=np.float32)})
    models, records = [], []
    for server_round in (1, 2, 3):
        replies = grid.send_and_receive(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
        arrays, _ = strategy.aggregate_train(server_round, replies)
        models.append(decode(arrays)["w"].copy())
        records.append(strategy.records[server_round])
    # round 1 closes at its deadline with partitions 0-2: a full buffer, w1 = 0.5/3 (1 + 2 + 3) (1, -1)
    assert sorted(c["partition"] for c in records[0].clients) == [0, 1, 2] and records[0].in_flight == [3]
    np.testing.assert_allclose(models[0], [1.0, -1.0], rtol=1e-6)
    # round 2: 0-2 again (a step: w2 = w1 + 1 · (1, -1)), then 3's update of round 1's model: 2 steps stale, waiting
    assert [(c["partition"], c["staleness"]) for c in records[1].clients] == [(0, 0), (1, 0), (2, 0), (3, 1)]
    assert records[1].diagnostics["staleness-steps"] == [0, 0, 0, 2] and records[1].diagnostics["buffered"] == 1
    np.testing.assert_allclose(models[1], [2.0, -2.0], rtol=1e-6)
    # round 3: 0 and 1 fill the buffer with 3's (weighted 1/√3); then 2 and 3, one step stale, wait at 1/√2
    assert records[2].diagnostics["staleness-steps"] == [0, 0, 1, 1] and records[2].diagnostics["buffered"] == 2
    np.testing.assert_allclose(models[2], [2.8849002, -2.8849002], rtol=1e-6)  # 2 + (4/√3 + 1 + 2) / 6
    assert all(record.aggregated for record in records)
