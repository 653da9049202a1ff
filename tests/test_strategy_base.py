"""The strategy base: same result as Flower's FedAvg, bad replies left out, seeded sampling."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FakeGrid, reply
from flwr.app import Array, ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import FedAvg

from fedweigh.arrays import decode
from fedweigh.rules.base import ComplementShareRule, SampleCountRule, UniformRule
from fedweigh.strategies.averaging import weighted_average
from fedweigh.strategies.base import WeightedFedAvg
from fedweigh.strategies.sampling import sample_partitions


def model(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "conv.weight": rng.normal(size=(4, 3, 3, 3)).astype(np.float32),
        "bn.running_mean": rng.normal(size=4).astype(np.float32),
        "bn.num_batches_tracked": np.array(10 + seed, dtype=np.int64),
        "fc.bias": rng.normal(size=5).astype(np.float32),
    }


def global_record() -> ArrayRecord:
    return ArrayRecord({k: Array(v) for k, v in model(100).items()})


def prime(strategy: WeightedFedAvg, num_nodes: int = 6) -> FakeGrid:
    grid = FakeGrid({1000 + i: i for i in range(num_nodes)})
    list(strategy.configure_train(1, global_record(), ConfigRecord(), grid))
    return grid


def replies(sizes, losses=None, seeds=None):
    losses = losses or [0.5] * len(sizes)
    seeds = seeds or list(range(len(sizes)))
    return [
        reply(1000 + i, model(s), {"num-examples": n, "train_loss": loss, "partition-id": i})
        for i, (n, loss, s) in enumerate(zip(sizes, losses, seeds, strict=True))
    ]


def test_matches_flower_fedavg_on_same_replies():
    strategy = WeightedFedAvg(SampleCountRule(), min_available_nodes=2)
    prime(strategy)
    ours, metrics = strategy.aggregate_train(1, replies([10, 30, 60]))
    theirs, _ = FedAvg().aggregate_train(1, replies([10, 30, 60]))
    ours_arrays, theirs_arrays = decode(ours), decode(theirs)
    for name, value in theirs_arrays.items():
        if np.issubdtype(ours_arrays[name].dtype, np.floating):
            np.testing.assert_allclose(ours_arrays[name], value, rtol=1e-6, atol=1e-7)
            assert ours_arrays[name].dtype == value.dtype
    # integer buffers are rounded and keep their dtype (Flower's turns them into floats)
    assert ours_arrays["bn.num_batches_tracked"].dtype == np.int64
    assert int(ours_arrays["bn.num_batches_tracked"]) == round(0.1 * 10 + 0.3 * 11 + 0.6 * 12)
    assert metrics["num-clients"] == 3


def test_record_holds_weights_and_signals():
    strategy = WeightedFedAvg(ComplementShareRule("train_loss"), min_available_nodes=2)
    prime(strategy)
    strategy.aggregate_train(1, replies([10, 20], losses=[1.0, 3.0]))
    record = strategy.records[1]
    assert [c["weight"] for c in record.clients] == pytest.approx([0.75, 0.25])
    assert [c["train_loss"] for c in record.clients] == [1.0, 3.0]
    assert [c["partition"] for c in record.clients] == [0, 1]
    assert record.aggregated


@pytest.mark.parametrize(
    ("bad_metrics", "bad_arrays", "reason"),
    [
        ({"num-examples": 10}, None, "train_loss"),
        ({"num-examples": 10, "train_loss": float("nan")}, None, "train_loss"),
        ({"num-examples": 10, "train_loss": float("inf")}, None, "train_loss"),
        ({"num-examples": 0, "train_loss": 1.0}, None, "num-examples"),
        ({"num-examples": 10, "train_loss": 1.0}, "nan", "NaN"),
        ({"num-examples": 10, "train_loss": 1.0}, "shape", "shape"),
        ({"num-examples": 10, "train_loss": 1.0}, "missing", "missing"),
    ],
)
def test_bad_reply_is_left_out_and_never_corrupts(bad_metrics, bad_arrays, reason, caplog):
    strategy = WeightedFedAvg(SampleCountRule(), min_available_nodes=2)
    prime(strategy)
    arrays = model(7)
    if bad_arrays == "nan":
        arrays["fc.bias"][0] = np.nan
    elif bad_arrays == "shape":
        arrays["fc.bias"] = np.zeros(6, dtype=np.float32)
    elif bad_arrays == "missing":
        del arrays["fc.bias"]
    good = replies([10, 30])
    bad = reply(1005, arrays, bad_metrics)
    with caplog.at_level("WARNING", logger="flwr.fedweigh"):
        result, _ = strategy.aggregate_train(1, [*good, bad])
    left_out = dict(strategy.records[1].left_out)
    expected, _ = strategy.aggregate_train(1, replies([10, 30]))
    for name, value in decode(expected).items():
        np.testing.assert_array_equal(decode(result)[name], value)
    assert reason in left_out["5"]
    assert "left out node 1005" in caplog.text


def test_error_reply_is_left_out():
    strategy = WeightedFedAvg(SampleCountRule(), min_available_nodes=2)
    prime(strategy)
    result, metrics = strategy.aggregate_train(1, [*replies([10, 30]), reply(1003, None, {}, error="boom")])
    assert metrics["num-clients"] == 2 and metrics["num-left-out"] == 1
    assert "boom" in strategy.records[1].left_out["3"]


def test_no_valid_reply_keeps_the_model():
    strategy = WeightedFedAvg(SampleCountRule(), min_available_nodes=2)
    prime(strategy)
    bad = reply(1000, model(0), {"num-examples": 5, "train_loss": float("nan")})
    assert strategy.aggregate_train(1, [bad]) == (None, None)


def test_signal_rule_rejects_clients_without_the_signal():
    strategy = WeightedFedAvg(ComplementShareRule("uncertainty"), min_available_nodes=2)
    prime(strategy)
    good = [
        reply(1000 + i, model(i), {"num-examples": 5, "train_loss": 1.0, "uncertainty": u})
        for i, u in enumerate([1.0, 3.0])
    ]
    missing = reply(1002, model(2), {"num-examples": 5, "train_loss": 1.0})
    negative = reply(1003, model(3), {"num-examples": 5, "train_loss": 1.0, "uncertainty": -1.0})
    strategy.aggregate_train(1, [*good, missing, negative])
    assert set(strategy.records[1].left_out) == {"2", "3"}
    assert [c["weight"] for c in strategy.records[1].clients] == pytest.approx([0.75, 0.25])


def test_same_seed_same_clients_for_every_strategy():
    sequences = []
    for rule in (SampleCountRule(), UniformRule(), ComplementShareRule("train_loss")):
        strategy = WeightedFedAvg(rule, seed=3, fraction_train=0.25, min_train_nodes=2, min_available_nodes=2)
        # node ids differ per run; partitions are what must match
        grid = FakeGrid(
            {int(node): p for p, node in enumerate(np.random.default_rng(len(sequences)).permutation(20) + 500)}
        )
        rounds = []
        for server_round in range(1, 6):
            messages = strategy.configure_train(server_round, global_record(), ConfigRecord(), grid)
            rounds.append(sorted(grid.partitions[m.metadata.dst_node_id] for m in messages))
        sequences.append(rounds)
    assert sequences[0] == sequences[1] == sequences[2]
    assert all(len(r) == 5 for r in sequences[0])
    assert len({tuple(r) for r in sequences[0]}) > 1  # rounds differ from each other


def test_different_seed_different_clients_and_resume_offset():
    assert sample_partitions(1, 4, range(50), 5) != sample_partitions(2, 4, range(50), 5)
    fresh = WeightedFedAvg(SampleCountRule(), seed=9, fraction_train=0.3, min_available_nodes=2)
    resumed = WeightedFedAvg(SampleCountRule(), seed=9, fraction_train=0.3, min_available_nodes=2, round_offset=3)
    grid = FakeGrid({10 + i: i for i in range(10)})
    fresh_round4 = [m.metadata.dst_node_id for m in fresh.configure_train(4, global_record(), ConfigRecord(), grid)]
    resumed_round1 = list(resumed.configure_train(1, global_record(), ConfigRecord(), grid))
    assert [m.metadata.dst_node_id for m in resumed_round1] == fresh_round4
    assert resumed_round1[0].content["config"]["server-round"] == 4


def test_recipe_reaches_the_clients():
    strategy = WeightedFedAvg(SampleCountRule(), {"proximal-mu": 0.01, "client-steps": ["oui"]}, min_available_nodes=2)
    grid = FakeGrid({1: 0, 2: 1})
    messages = list(strategy.configure_train(2, global_record(), ConfigRecord({"x": 1}), grid))
    config = messages[0].content["config"]
    assert config["proximal-mu"] == 0.01 and list(config["client-steps"]) == ["oui"] and config["x"] == 1


def test_weighted_average_is_exact_for_floats():
    models = [model(i) for i in range(4)]
    weights = np.array([0.1, 0.2, 0.3, 0.4])
    average = weighted_average(models, weights)
    expected = sum(w * m["conv.weight"].astype(np.float64) for w, m in zip(weights, models, strict=True))
    np.testing.assert_allclose(average["conv.weight"], expected, rtol=1e-5, atol=1e-6)


def test_await_federation_waits_for_every_announced_partition():
    class SlowGrid(FakeGrid):
        """Nodes register one per call of get_node_ids, as simulated SuperNodes do."""

        def __init__(self, partitions):
            super().__init__(partitions)
            self.visible = 1

        def get_node_ids(self):
            self.visible = min(self.visible + 1, len(self.partitions))
            return list(self.partitions)[: self.visible]

    from fedweigh.strategies.sampling import NodeDirectory

    grid = SlowGrid({100 + i: i for i in range(6)})
    nodes = NodeDirectory().await_federation(grid, min_nodes=2, timeout=30)
    assert sorted(nodes) == [100 + i for i in range(6)]


def test_aggregation_does_not_depend_on_reply_order():
    strategy = WeightedFedAvg(SampleCountRule(), min_available_nodes=2)
    prime(strategy)
    forward, _ = strategy.aggregate_train(1, replies([10, 30, 60]))
    backward, _ = strategy.aggregate_train(1, list(reversed(replies([10, 30, 60]))))
    for name, value in decode(forward).items():
        np.testing.assert_array_equal(decode(backward)[name], value)


def test_a_round_record_is_the_metrics_row_under_the_keys_readers_use():
    from fedweigh.results import WAIT_SECONDS
    from fedweigh.strategies.base import RoundRecord

    fields = RoundRecord(round=1).to_dict()
    assert WAIT_SECONDS in fields and {"sampled", "clients", "left_out", "aggregated", "in_flight"} <= set(fields)
