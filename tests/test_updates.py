"""The server-update step, stale replies, and train-config values that change per round."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from conftest import FakeGrid, reply
from flwr.app import Array, ArrayRecord, ConfigRecord

from fedweigh.arrays import decode
from fedweigh.preflight import parse_settings
from fedweigh.rules.base import SampleCountRule
from fedweigh.strategies.averaging import weighted_average
from fedweigh.strategies.base import WeightedFedAvg
from fedweigh.strategies.build import build_strategy
from fedweigh.strategies.schedules import LearningRateDecay
from fedweigh.strategies.updates import RoundUpdate, ServerUpdate, WeightedMean, rebase


def model(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.normal(size=(3, 2)).astype(np.float32),
        "steps": np.array(10 + seed, dtype=np.int64),
    }


def record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(v) for k, v in arrays.items()})


GRID = FakeGrid({1000 + i: i for i in range(4)})


def configure(strategy: WeightedFedAvg, server_round: int, global_seed: int) -> list:
    return list(strategy.configure_train(server_round, record(model(global_seed)), ConfigRecord(), GRID))


def train_reply(node: int, seed: int, model_round: int | None = None, size: int = 10):
    metrics = {"num-examples": size, "train_loss": 0.5, "partition-id": node - 1000}
    if model_round is not None:
        metrics["model-round"] = model_round
    return reply(node, model(seed), metrics)


# ---------------------------------------------------------------------------
# the update step on its own
# ---------------------------------------------------------------------------


def test_weighted_mean_of_fresh_replies_is_the_plain_weighted_average_bit_for_bit():
    models = [model(1), model(2), model(3)]
    weights = np.array([0.2, 0.3, 0.5])
    update = RoundUpdate(1, model(0), models, [1, 1, 1], weights, np.full(3, 10.0))
    mine, plain = WeightedMean()(update), weighted_average(models, weights)
    assert all(np.array_equal(mine[name], plain[name]) for name in plain)


def test_a_stale_reply_counts_as_its_update_on_the_current_model():
    start, current, stale = model(0), model(5), model(7)
    update = RoundUpdate(
        3, current, [model(8), stale], [3, 1], np.array([0.5, 0.5]), np.ones(2), start_models={1: start}
    )
    result = WeightedMean()(update)
    rebased_w = current["w"] + (stale["w"] - start["w"])
    np.testing.assert_allclose(result["w"], 0.5 * model(8)["w"] + 0.5 * rebased_w, rtol=1e-6)
    # integer buffers move by the stale client's own count, then are averaged and rounded
    expected_steps = round(0.5 * int(model(8)["steps"]) + 0.5 * (15 + (17 - 10)))
    assert int(result["steps"]) == expected_steps


def test_rebase_onto_the_model_a_reply_started_from_gives_the_reply_back():
    current = model(4)
    moved = rebase(model(6), current, current)
    np.testing.assert_allclose(moved["w"], model(6)["w"], rtol=1e-6)  # up to float rounding: a + (b - a)
    assert int(moved["steps"]) == int(model(6)["steps"])
    # which is why fresh replies are never rebased: they enter the mean as they are
    fresh = model(6)
    assert RoundUpdate(2, current, [fresh], [2], np.ones(1), np.ones(1)).current_models()[0] is fresh


# ---------------------------------------------------------------------------
# stale replies through the strategy
# ---------------------------------------------------------------------------


def test_replies_without_a_model_round_are_fresh_and_change_nothing():
    with_round, without = WeightedFedAvg(SampleCountRule(), seed=1), WeightedFedAvg(SampleCountRule(), seed=1)
    configure(with_round, 1, 0)
    configure(without, 1, 0)
    a, _ = with_round.aggregate_train(1, [train_reply(1000, 1, 1), train_reply(1001, 2, 1)])
    b, _ = without.aggregate_train(1, [train_reply(1000, 1), train_reply(1001, 2)])
    assert all(np.array_equal(x, y) for x, y in zip(decode(a).values(), decode(b).values(), strict=True))
    assert [c["staleness"] for c in without.records[1].clients] == [0, 0]


def test_a_stale_reply_within_max_staleness_is_rebased_on_the_round_it_trained():
    strategy = WeightedFedAvg(SampleCountRule(), seed=1, max_staleness=2)
    configure(strategy, 1, 0)  # round 1 sent model(0)
    strategy.aggregate_train(1, [train_reply(1000, 1, 1)])
    configure(strategy, 2, 5)  # round 2 sent model(5)
    arrays, _ = strategy.aggregate_train(2, [train_reply(1000, 8, 2), train_reply(1001, 7, model_round=1)])
    expected = 0.5 * model(8)["w"] + 0.5 * (model(5)["w"] + model(7)["w"] - model(0)["w"])
    np.testing.assert_allclose(decode(arrays)["w"], expected, rtol=1e-6)
    assert [c["staleness"] for c in strategy.records[2].clients] == [0, 1]


def test_replies_too_old_or_from_the_future_are_left_out(caplog):
    strategy = WeightedFedAvg(SampleCountRule(), seed=1, max_staleness=1)
    for server_round in (1, 2, 3):
        configure(strategy, server_round, server_round)
    assert sorted(strategy.global_models) == [2, 3]  # round 1's model is no longer needed
    replies = [train_reply(1000, 1, 3), train_reply(1001, 2, 1), train_reply(1002, 3, 4), train_reply(1003, 4, 2)]
    with caplog.at_level(logging.WARNING, logger="flwr.fedweigh"):
        strategy.aggregate_train(3, replies)
    left_out = strategy.records[3].left_out
    assert sorted(left_out) == ["1", "2"]
    assert "2 round(s) old" in left_out["1"] and "max-staleness" in left_out["1"]
    assert "round 3 never sent" in left_out["2"]
    assert [c["partition"] for c in strategy.records[3].clients] == [0, 3]


def test_synchronous_strategies_refuse_any_stale_reply():
    strategy = WeightedFedAvg(SampleCountRule(), seed=1)
    configure(strategy, 1, 0)
    configure(strategy, 2, 1)
    arrays, _ = strategy.aggregate_train(2, [train_reply(1000, 1, 1)])
    assert arrays is None and "max-staleness" in strategy.records[2].left_out["0"]


def test_the_checkpoint_keeps_the_models_stale_replies_may_still_need():
    strategy = WeightedFedAvg(SampleCountRule(), seed=1, max_staleness=2)
    for server_round in (1, 2, 3):
        configure(strategy, server_round, server_round)
    state = strategy.state()
    assert sorted(state["global_models"]) == [2, 3]  # round 4 accepts replies to the models of rounds 2 and 3
    resumed = WeightedFedAvg(SampleCountRule(), seed=1, max_staleness=2, round_offset=3, min_train_nodes=1)
    resumed.load_state(state)
    configure(resumed, 1, 9)  # round 4
    arrays, _ = resumed.aggregate_train(1, [train_reply(1000, 5, model_round=2)])
    np.testing.assert_allclose(decode(arrays)["w"], model(9)["w"] + model(5)["w"] - model(2)["w"], rtol=1e-6)
    assert WeightedFedAvg(SampleCountRule()).state()["global_models"] == {}  # synchronous: nothing extra


def test_a_replaced_update_step_gets_everything_the_round_produced():
    seen = []

    class Recording(ServerUpdate):
        name = "recording"

        def __call__(self, update: RoundUpdate) -> dict[str, np.ndarray]:
            seen.append(update)
            return dict(update.global_model)

        def state(self):
            return {"calls": len(seen)}

    strategy = WeightedFedAvg(SampleCountRule(), update=Recording(), server_data="held-out data", seed=1)
    configure(strategy, 1, 0)
    arrays, _ = strategy.aggregate_train(1, [train_reply(1000, 1, 1, size=10), train_reply(1001, 2, 1, size=30)])
    (update,) = seen
    assert update.server_round == 1 and update.server_data == "held-out data"
    np.testing.assert_allclose(update.weights, [0.25, 0.75])
    assert update.model_rounds == [1, 1] and update.num_examples.tolist() == [10.0, 30.0]
    assert np.array_equal(decode(arrays)["w"], model(0)["w"])  # the update's result is the new model
    assert strategy.state()["update"] == {"calls": 1}


# ---------------------------------------------------------------------------
# round-varying train config
# ---------------------------------------------------------------------------


def test_learning_rate_decay_follows_the_server_round():
    decay = LearningRateDecay(0.01, 0.998**40)
    assert decay(1)["learning-rate"] == 0.01
    assert decay(26)["learning-rate"] == pytest.approx(0.01 * 0.998**1000)
    with pytest.raises(ValueError, match="lr-decay = 1.5"):
        LearningRateDecay(0.01, 1.5)(1)


def test_each_round_sends_and_records_its_learning_rate():
    strategy = build_strategy(parse_settings({"learning-rate": 0.1, "lr-decay": 0.5, "min-train-nodes": 2}))
    for server_round in (1, 2, 3):
        messages = configure(strategy, server_round, 0)
        assert {m.content["config"]["learning-rate"] for m in messages} == {0.1 * 0.5 ** (server_round - 1)}
        assert strategy.records[server_round].diagnostics["learning-rate"] == 0.1 * 0.5 ** (server_round - 1)
    resumed = build_strategy(parse_settings({"learning-rate": 0.1, "lr-decay": 0.5}), round_offset=3)
    assert resumed.round_values(4)["learning-rate"] == 0.1 * 0.5**3  # a resumed run continues the schedule
