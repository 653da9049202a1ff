"""FedNolowe and FedAsl: the spec's vectors and edge cases, the train_loss definition, FLOP counts."""

from __future__ import annotations

import tomllib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import REPO, FakeGrid, reply
from flwr.app import Array, ArrayRecord, ConfigRecord
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

from fedweigh.arrays import decode
from fedweigh.client.training import train_locally
from fedweigh.data.description import DatasetInfo
from fedweigh.data.loader import batches
from fedweigh.data.tensors import ImageTensors
from fedweigh.data.transforms import BatchTransform
from fedweigh.flops import local_training_flops, round_flops, training_step_flops
from fedweigh.methods.costs import PROXIMAL_FLOPS_PER_PARAMETER
from fedweigh.methods.fedasl.protocol import FedAslSettings
from fedweigh.methods.fedasl.server import (
    FEDASL_ALPHA,
    FEDASL_BETA,
    LossDeviationRule,
    loss_deviation_distances,
    loss_deviation_weights,
)
from fedweigh.preflight import parse_settings
from fedweigh.protocol import TrainRecipe
from fedweigh.rules.base import ComplementShareRule, RoundSignals, complement_share_weights
from fedweigh.settings import SettingsError
from fedweigh.strategies.base import WeightedFedAvg
from fedweigh.strategies.build import build_strategy

# ---------------------------------------------------------------------------
# FedNolowe weights: spec section 12
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("losses", "expected"),
    [
        ([0.5, 1.0, 1.5, 2.0], [0.3, 0.266667, 0.233333, 0.2]),
        ([1, 3], [0.75, 0.25]),
        ([0.2, 0.2, 0.2], [1 / 3] * 3),
        ([0, 0, 0], [1 / 3] * 3),
        ([0, 1, 1, 1], [0.333333, 0.222222, 0.222222, 0.222222]),
        ([0, 0, 1], [0.5, 0.5, 0.0]),
        ([0.1, 0.2, 0.3, 0.4, 0.5], [0.233333, 0.216667, 0.2, 0.183333, 0.166667]),
        ([0.01, 0.02, 0.3, 0.5, 0.8], [0.248466, 0.246933, 0.203988, 0.173313, 0.127301]),
        ([1e-6, 0.5, 0.5, 0.5, 0.5], [0.25, 0.1875, 0.1875, 0.1875, 0.1875]),
        ([2.0], [1.0]),
    ],
)
def test_spec_weight_vectors(losses, expected):
    weights = complement_share_weights(np.array(losses, dtype=float))
    np.testing.assert_allclose(weights, expected, atol=1e-6)
    assert abs(weights.sum() - 1) < 1e-9


@pytest.mark.parametrize("losses", [[0.3, np.nan, 0.2], [0.3, np.inf, 0.2], [-0.1, 0.5]])
def test_spec_bad_losses_are_refused_by_the_pure_function(losses):
    # the strategy leaves such clients out before weighting (tests below)
    with pytest.raises(ValueError, match="finite and >= 0"):
        complement_share_weights(np.array(losses))


def test_values_near_the_float_limit_do_not_overflow():
    huge = complement_share_weights(np.array([1.7e308, 1.7e308, 1.0e308]))
    np.testing.assert_allclose(huge, complement_share_weights(np.array([1.7, 1.7, 1.0])), rtol=1e-12)


# properties the spec adds to those in test_weighting.py (sum, bounds, scale, permutation)
losses_with_zeros = st.lists(
    st.one_of(st.just(0.0), st.floats(min_value=1e-9, max_value=1e300)), min_size=2, max_size=25
).filter(lambda values: max(values) > 0)


@settings(max_examples=150, deadline=None)
@given(losses_with_zeros)
def test_closed_forms_and_ordering(losses):
    losses = np.array(losses)
    count = len(losses)
    weights = complement_share_weights(losses)
    share = (losses / losses.max()) / (losses / losses.max()).sum()
    # p_k - 1/n = (1/n - Lhat_k) / (n - 1), and 0 <= p_k <= 1/(n-1), zeros included
    np.testing.assert_allclose(weights - 1 / count, (1 / count - share) / (count - 1), atol=1e-12)
    assert np.all(weights >= 0) and np.all(weights <= 1 / (count - 1) + 1e-12)
    assert abs(weights.sum() - 1) < 1e-9
    # max/min ratio = (1 - Lhat_min) / (1 - Lhat_max) whenever the smallest weight is positive
    if weights.min() > 1e-9:
        assert weights.max() / weights.min() == pytest.approx((1 - share.min()) / (1 - share.max()), rel=1e-9)
    # lower loss, no smaller weight
    order = np.argsort(losses, kind="stable")
    assert np.all(np.diff(weights[order]) <= 1e-12)
    # equal losses, equal weights
    for value in np.unique(losses):
        assert np.ptp(weights[losses == value]) < 1e-12


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.floats(min_value=0.0, max_value=1e6), min_size=2, max_size=25).filter(lambda values: max(values) > 0),
    st.floats(min_value=1e-3, max_value=1e3),
)
def test_adding_a_constant_pulls_toward_uniform(losses, shift):
    losses = np.array(losses)
    uniform = 1 / len(losses)
    before = np.abs(complement_share_weights(losses) - uniform).max()
    after = np.abs(complement_share_weights(losses + shift) - uniform).max()
    assert after <= before + 1e-12


@settings(max_examples=100, deadline=None)
@given(st.floats(min_value=1e-6, max_value=1e6), st.floats(min_value=1e-6, max_value=1e6))
def test_two_clients_is_inverse_loss_weighting(first, second):
    weights = complement_share_weights(np.array([first, second]))
    inverse = np.array([1 / first, 1 / second])
    np.testing.assert_allclose(weights, inverse / inverse.sum(), rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------------------
# FedAsl weights
# ---------------------------------------------------------------------------


def test_fedasl_spec_vector():
    # spec section 12: alpha 0.5, beta 0.2 on [0.5, 1, 1.5, 2] -> [0.0649, 0.4351, 0.4351, 0.0649]
    weights = loss_deviation_weights(np.array([0.5, 1.0, 1.5, 2.0]), alpha=0.5, beta=0.2)
    np.testing.assert_allclose(weights, [0.0649, 0.4351, 0.4351, 0.0649], atol=5e-5)
    # by hand: med 1.25, sigma = sqrt(0.3125); inner clients d = 0.2 sigma, outer d = 0.75
    sigma = np.sqrt(0.3125)
    inverse = np.array([1 / 0.75, 1 / (0.2 * sigma), 1 / (0.2 * sigma), 1 / 0.75])
    np.testing.assert_allclose(weights, inverse / inverse.sum(), rtol=1e-12)


def test_fedasl_defaults_are_the_papers_code():
    assert (FEDASL_ALPHA, FEDASL_BETA) == (0.5, 0.2)
    assert (FedAslSettings().alpha, FedAslSettings().beta) == (0.5, 0.2)
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["tool"]["flwr"]["app"]["config"]["fedasl"] == {"alpha": 0.5, "beta": 0.2}


def test_fedasl_favours_the_median_not_the_lowest_loss():
    weights = loss_deviation_weights(np.array([0.01, 1.0, 1.0, 1.1, 3.0]))
    assert weights.argmax() in (1, 2) and weights[0] < weights[1]


@pytest.mark.parametrize("losses", [[2.0], [0.7, 0.7, 0.7], [0.0, 0.0]])
def test_fedasl_single_client_and_equal_losses(losses):
    np.testing.assert_allclose(loss_deviation_weights(np.array(losses)), [1 / len(losses)] * len(losses))


@pytest.mark.parametrize(
    ("alpha", "beta", "fragment"),
    [(-0.1, 0.2, "alpha"), (np.nan, 0.2, "alpha"), (0.5, 0.0, "beta"), (0.5, np.inf, "beta")],
)
def test_fedasl_bad_parameters(alpha, beta, fragment):
    with pytest.raises(ValueError, match=f"fedasl {fragment}"):
        loss_deviation_weights(np.array([0.1, 0.2]), alpha, beta)
    with pytest.raises(ValueError, match=f"fedasl {fragment}"):
        LossDeviationRule(alpha, beta)


def test_fedasl_refuses_non_finite_losses():
    with pytest.raises(ValueError, match="finite"):
        loss_deviation_distances(np.array([0.1, np.nan]))


fedasl_losses = st.lists(st.floats(min_value=0.0, max_value=1e3), min_size=1, max_size=25)


@settings(max_examples=150, deadline=None)
@given(fedasl_losses, st.floats(min_value=1e-2, max_value=1e2), st.floats(min_value=-10, max_value=10))
def test_fedasl_invariants(losses, scale, shift):
    losses = np.array(losses)
    weights = loss_deviation_weights(losses)
    assert np.all(np.isfinite(weights)) and np.all(weights > 0) and abs(weights.sum() - 1) < 1e-9
    order = np.random.default_rng(len(losses)).permutation(len(losses))
    np.testing.assert_allclose(loss_deviation_weights(losses[order]), weights[order], rtol=1e-9)
    # clients inside the good region share the largest weight (beta <= alpha)
    distances = loss_deviation_distances(losses)
    inside = distances == FEDASL_BETA
    assert np.all(weights[inside] >= weights.max() * (1 - 1e-9))
    # scale and shift invariance, away from the region's edge where rounding may flip a client
    spread = losses.std()
    assume(spread > 1e-6 * max(1.0, np.abs(losses).max()))
    edge = np.abs(np.abs(losses - np.median(losses)) / spread - FEDASL_ALPHA)
    assume(edge.min() > 1e-6)
    np.testing.assert_allclose(loss_deviation_weights(losses * scale + shift), weights, rtol=1e-6)


# ---------------------------------------------------------------------------
# through the strategy: replies, edge cases, aggregation
# ---------------------------------------------------------------------------


def client_model(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "conv.weight": rng.normal(size=(2, 1, 3, 3)).astype(np.float32),
        "bn.running_mean": rng.normal(size=2).astype(np.float32),
        "bn.running_var": rng.uniform(0.5, 2.0, size=2).astype(np.float32),
        "bn.num_batches_tracked": np.array(10 + 3 * seed, dtype=np.int64),
    }


def strategy_for(name: str, **config) -> WeightedFedAvg:
    strategy = build_strategy(parse_settings({"strategy": name, **config}))
    global_model = ArrayRecord({k: Array(v) for k, v in client_model(99).items()})
    list(strategy.configure_train(1, global_model, ConfigRecord(), FakeGrid({1000 + i: i for i in range(6)})))
    return strategy


def train_replies(losses, sizes=None):
    sizes = sizes or [100] * len(losses)
    return [
        reply(1000 + i, client_model(i), {"num-examples": n, "train_loss": loss, "partition-id": i})
        for i, (loss, n) in enumerate(zip(losses, sizes, strict=True))
    ]


def recorded_weights(strategy: WeightedFedAvg) -> list[float]:
    return [client["weight"] for client in strategy.records[1].clients]


def test_registry_builds_fednolowe_and_fedasl():
    fednolowe = build_strategy(parse_settings({"strategy": "fednolowe"}))
    assert isinstance(fednolowe.rule, ComplementShareRule) and set(fednolowe.rule.signals) == {"train_loss"}
    assert fednolowe.recipe["proximal-mu"] == 0.0 and "client-steps" not in fednolowe.recipe
    fedasl = build_strategy(parse_settings({"strategy": "fedasl", "fedasl.alpha": 1.0, "fedasl.beta": 0.1}))
    assert isinstance(fedasl.rule, LossDeviationRule) and (fedasl.rule.alpha, fedasl.rule.beta) == (1.0, 0.1)


@pytest.mark.parametrize(
    ("config", "fragments"),
    [
        ({"fedasl.alpha": -1.0}, ["fedasl.alpha", "-1.0", "greater than or equal to 0"]),
        ({"fedasl.beta": 0.0}, ["fedasl.beta", "0.0", "greater than 0"]),
    ],
)
def test_bad_fedasl_settings_are_named(config, fragments):
    with pytest.raises(SettingsError) as caught:
        parse_settings(config)
    assert all(fragment in str(caught.value) for fragment in fragments)


def test_spec_vector_through_the_strategy_ignores_sample_counts():
    strategy = strategy_for("fednolowe")
    strategy.aggregate_train(1, train_replies([0.5, 1.0, 1.5, 2.0], sizes=[10, 5000, 20, 700]))
    assert recorded_weights(strategy) == pytest.approx([0.3, 0.266667, 0.233333, 0.2], abs=1e-6)


def test_aggregate_is_the_p_weighted_state_including_batchnorm_buffers():
    strategy = strategy_for("fednolowe")
    result, metrics = strategy.aggregate_train(1, train_replies([3.0, 1.0]))  # p = [0.25, 0.75]
    assert recorded_weights(strategy) == pytest.approx([0.25, 0.75])
    averaged, a, b = decode(result), client_model(0), client_model(1)
    for name in ("conv.weight", "bn.running_mean", "bn.running_var"):
        np.testing.assert_allclose(averaged[name], 0.25 * a[name] + 0.75 * b[name], rtol=1e-6)
        assert averaged[name].dtype == np.float32
    assert averaged["bn.num_batches_tracked"].dtype == np.int64
    assert int(averaged["bn.num_batches_tracked"]) == round(0.25 * 10 + 0.75 * 13)
    assert metrics["num-clients"] == 2


def test_one_client_gets_weight_one():
    strategy = strategy_for("fednolowe", **{"min-train-nodes": 1})  # one reply is a quorum
    result, _ = strategy.aggregate_train(1, train_replies([2.0]))
    assert recorded_weights(strategy) == [1.0]
    for name, value in client_model(0).items():
        np.testing.assert_array_equal(decode(result)[name], value)


def test_all_zero_losses_give_uniform_weights():
    strategy = strategy_for("fednolowe")
    strategy.aggregate_train(1, train_replies([0.0, 0.0, 0.0]))
    assert recorded_weights(strategy) == pytest.approx([1 / 3] * 3)


@pytest.mark.parametrize(
    ("losses", "expected", "bad"),
    [
        ([0.3, float("nan"), 0.2], [0.4, 0.6], "1"),  # spec: drop, then [0.3, 0.2] -> [0.4, 0.6]
        ([0.3, float("inf"), 0.2], [0.4, 0.6], "1"),
        ([-0.1, 0.5, 0.3], [0.375, 0.625], "0"),  # negative: a client error, left out
    ],
)
@pytest.mark.parametrize("name", ["fednolowe", "fedasl"])
def test_bad_loss_is_left_out_with_a_warning(name, losses, expected, bad, caplog):
    strategy = strategy_for(name)
    with caplog.at_level("WARNING", logger="flwr.fedweigh"):
        result, metrics = strategy.aggregate_train(1, train_replies(losses))
    assert set(strategy.records[1].left_out) == {bad}
    assert "train_loss" in strategy.records[1].left_out[bad]
    assert f"left out node {1000 + int(bad)}" in caplog.text
    assert metrics["num-left-out"] == 1 and result is not None
    assert [c["partition"] for c in strategy.records[1].clients] == [i for i in range(3) if str(i) != bad]
    if name == "fednolowe":
        assert recorded_weights(strategy) == pytest.approx(expected)
    else:  # FedAsl on two clients: both at distance sigma from the median, so equal weights
        assert recorded_weights(strategy) == pytest.approx([0.5, 0.5])


def test_no_valid_loss_keeps_the_global_model():
    strategy = strategy_for("fednolowe")
    assert strategy.aggregate_train(1, train_replies([float("nan"), -1.0])) == (None, None)
    assert not strategy.records[1].aggregated


def test_fedasl_through_the_strategy_records_its_diagnostics():
    strategy = strategy_for("fedasl")
    strategy.aggregate_train(1, train_replies([0.5, 1.0, 1.5, 2.0]))
    record = strategy.records[1]
    assert recorded_weights(strategy) == pytest.approx([0.0649, 0.4351, 0.4351, 0.0649], abs=5e-5)
    assert [c["fedasl-in-region"] for c in record.clients] == [0.0, 1.0, 1.0, 0.0]
    assert record.diagnostics["loss-median"] == pytest.approx(1.25)
    assert record.diagnostics["loss-std"] == pytest.approx(np.sqrt(0.3125))


def test_fedasl_rule_reads_train_loss_only():
    rule = LossDeviationRule()
    outcome = rule(RoundSignals(np.array([1.0, 1.0, 1.0]), {"train_loss": np.array([0.5, 0.5, 0.5])}))
    np.testing.assert_allclose(outcome.weights, [1 / 3] * 3)
    assert set(rule.signals) == {"train_loss"}


# ---------------------------------------------------------------------------
# the reported train_loss is the spec's L_k (section 3)
# ---------------------------------------------------------------------------

TINY_INFO = DatasetInfo(3, 1, 2, (0.5,), (0.25,), "none", "image", "label")


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))


def test_train_loss_is_the_size_weighted_pre_step_mean_over_all_epochs():
    generator = torch.Generator().manual_seed(5)
    data = ImageTensors(
        torch.randint(0, 256, (10, 1, 2, 2), dtype=torch.uint8, generator=generator),
        torch.randint(0, 3, (10,), generator=generator),
    )
    recipe = TrainRecipe(local_epochs=2, batch_size=4, learning_rate=0.5, momentum=0.9, weight_decay=1e-3)
    transform = BatchTransform(TINY_INFO, augment=False)

    trained = tiny_model()
    stats = train_locally(trained, data, recipe, transform, torch.device("cpu"), torch.Generator().manual_seed(11))

    # independent computation on the same seeded batches (sizes 4, 4, 2 per epoch)
    reference = tiny_model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5, momentum=0.9, weight_decay=1e-3)
    order = torch.Generator().manual_seed(11)
    batch_means, batch_sizes = [], []
    for _ in range(recipe.local_epochs):
        for images, labels, _ in batches(data, recipe.batch_size, shuffle=True, generator=order):
            loss = F.cross_entropy(reference(transform(images, train=True)), labels)  # mean, before the step
            batch_means.append(loss.item())
            batch_sizes.append(len(labels))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    batch_means, batch_sizes = np.array(batch_means), np.array(batch_sizes)
    assert batch_sizes.tolist() == [4, 4, 2, 4, 4, 2]
    expected = float((batch_sizes * batch_means).sum() / (recipe.local_epochs * len(data)))

    for mine, theirs in zip(trained.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs)  # same batches, same steps
    assert stats.train_loss == pytest.approx(expected, rel=1e-6)
    assert stats.num_examples == 10 and stats.steps == 6

    # ... and not one of the quantities it could be confused with
    with torch.no_grad():
        final_model_loss = F.cross_entropy(reference(transform(data.images, train=False)), data.labels).item()
    confusions = {
        "unweighted mean of batch losses": batch_means.mean(),
        "last epoch only": float((batch_sizes[3:] * batch_means[3:]).sum() / len(data)),
        "loss of the final model": final_model_loss,
    }
    for what, value in confusions.items():
        assert abs(stats.train_loss - value) > 1e-4, what


# ---------------------------------------------------------------------------
# FLOPs
# ---------------------------------------------------------------------------

DIGITS_INFO = DatasetInfo(10, 1, 8, (0.5,), (0.25,), "none", "image", "label")
MNIST_INFO = DatasetInfo(10, 1, 28, (0.1307,), (0.3081,), "none", "image", "label")


def mlp_hand_count(inputs: int, hidden: int, classes: int) -> int:
    """Per sample: forward 2(ih + hc); backward 2ih (weights only: no gradient for the image) + 4hc."""
    return 2 * (inputs * hidden + hidden * classes) + 2 * inputs * hidden + 4 * hidden * classes


def test_training_step_of_a_tiny_mlp_matches_the_hand_count():
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3))
    assert training_step_flops(model, (6,), batch_size=5) == 5 * mlp_hand_count(6, 4, 3)
    assert next(model.parameters()).device.type == "cpu"  # the caller's model is untouched


def test_local_training_counts_the_smaller_last_batch():
    def per_step(batch: int) -> int:
        return 1000 * batch + 1  # +1 makes the number of steps visible

    # 70 samples, B = 32: batches 32, 32, 6 per epoch
    assert local_training_flops(per_step, 70, 2, 32) == 2 * (2 * (32_001) + 6_001)
    assert local_training_flops(per_step, 20, 1, 32) == 20_001


@pytest.mark.parametrize(
    ("strategy", "weighting", "proximal"),
    [("fedavg", 2 * 3 - 1, False), ("fedprox", 2 * 3 - 1, True), ("fednolowe", 6 * 3 - 2, False)],
)
def test_round_flops_of_the_digits_mlp_match_the_hand_count(strategy, weighting, proximal):
    sizes = [70, 33, 64]  # steps per epoch: 3, 2, 2
    cost = round_flops("mlp", DIGITS_INFO, 3, sizes, local_epochs=2, batch_size=32, strategy=strategy)
    trainable = 64 * 64 + 64 + 64 * 10 + 10  # mlp: Linear(64, 64) -> ReLU -> Linear(64, 10)
    steps = 2 * (3 + 2 + 2)
    assert cost["local_training"] == 2 * sum(sizes) * mlp_hand_count(64, 64, 10)
    assert cost["trainable_parameters"] == cost["averaged_entries"] == trainable
    assert cost["local_steps"] == steps
    assert cost["server_averaging"] == 2 * 3 * trainable
    assert cost["server_weighting"] == weighting
    assert cost["client_extra"] == (PROXIMAL_FLOPS_PER_PARAMETER * trainable * steps if proximal else 0)
    assert cost["server_matching"] == 0
    parts = ("local_training", "client_extra", "server_averaging", "server_weighting", "server_matching")
    assert cost["total"] == sum(cost[part] for part in parts)


def row_matching_hand_count(rows: int, length: int) -> int:
    """One other client, one tensor: r^2 distances of 3c - 1 operations and a square root each; 2 r^3 assignment."""
    return rows * rows * (3 * length - 1) + rows * rows + 2 * rows**3


@pytest.mark.parametrize(("skip_layers", "matched"), [((), [(64, 64), (10, 64)]), (("fc2",), [(64, 64)])])
def test_fedma_simplified_adds_the_matching_of_its_matched_tensors_only(skip_layers, matched):
    sizes = [70, 33, 64]
    cost = round_flops("mlp", DIGITS_INFO, 3, sizes, 2, 32, strategy="fedma-simplified", skip_layers=skip_layers)
    uniform = round_flops("mlp", DIGITS_INFO, 3, sizes, 2, 32, strategy="uniform")
    assert cost["server_matching"] == 2 * sum(row_matching_hand_count(r, c) for r, c in matched)  # K - 1 = 2
    assert cost["total"] - uniform["total"] == cost["server_matching"]


def test_the_authors_fedma_costs_under_one_percent_more_than_fednolowe_on_lenet5():
    """The paper's "40 % fewer FLOPs than FedMa" cannot hold once local training is counted."""
    arguments = ("lenet5", MNIST_INFO, 5, 1200, 2, 32)
    fedma = round_flops(*arguments, strategy="fedma-simplified", skip_layers=("fc3",))
    fednolowe = round_flops(*arguments, strategy="fednolowe")
    matched = [(32, 25), (64, 800), (256, 1024), (128, 256)]  # conv1, conv2, fc1, fc2; BatchNorm and biases are not
    assert fedma["server_matching"] == 4 * sum(row_matching_hand_count(r, c) for r, c in matched)
    assert 0.001 < (fedma["total"] - fednolowe["total"]) / fedma["total"] < 0.01


def test_lenet5_step_matches_a_per_layer_count():
    # forward MACs per sample: conv1 24*24*32*25, conv2 8*8*64*800, fc 1024*256 + 256*128 + 128*10
    forward = 2 * (24 * 24 * 32 * 25 + 8 * 8 * 64 * 32 * 25 + 1024 * 256 + 256 * 128 + 128 * 10)
    no_input_gradient = 2 * 24 * 24 * 32 * 25  # conv1 needs no gradient for the image
    cost = round_flops("lenet5", MNIST_INFO, 5, 1200, local_epochs=2, batch_size=32, strategy="fedavg")
    assert cost["step_forward_backward"] == 32 * (3 * forward - no_input_gradient)
    assert cost["local_training"] == 5 * 1200 * 2 * (3 * forward - no_input_gradient)
    # BatchNorm buffers are averaged too: running mean and var of 32 + 64 channels, 2 counters
    assert cost["averaged_entries"] == cost["trainable_parameters"] + 2 * (32 + 64) + 2


def test_fednolowe_costs_what_fedavg_costs_up_to_scalar_work():
    arguments = ("lenet5", MNIST_INFO, 5, 1200, 2, 32)
    fedavg, fednolowe, fedprox = (round_flops(*arguments, strategy=s) for s in ("fedavg", "fednolowe", "fedprox"))
    assert fednolowe["total"] - fedavg["total"] == fednolowe["server_weighting"] - fedavg["server_weighting"]
    assert 0 < fednolowe["total"] - fedavg["total"] < 100
    assert 0 < (fedprox["total"] - fedavg["total"]) / fedavg["total"] < 0.01


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({"strategy": "fedma"}, "strategy = 'fedma'"),
        ({"num_clients": 0}, "num_clients = 0"),
        ({"samples_per_client": [10, 20]}, "samples_per_client"),
        ({"batch_size": 0}, "batch_size = 0"),
    ],
)
def test_round_flops_refuses_bad_arguments(arguments, fragment):
    call = {
        "model_name": "mlp",
        "dataset": DIGITS_INFO,
        "num_clients": 3,
        "samples_per_client": 10,
        "local_epochs": 1,
        "batch_size": 4,
        "strategy": "fedavg",
    }
    with pytest.raises(ValueError, match=fragment):
        round_flops(**{**call, **arguments})


# ---------------------------------------------------------------------------
# persist-optimizer-state: the authors' clients keep SGD momentum between rounds (spec A12); Adam too
# ---------------------------------------------------------------------------


def tiny_data(seed: int = 5) -> ImageTensors:
    generator = torch.Generator().manual_seed(seed)
    return ImageTensors(
        torch.randint(0, 256, (10, 1, 2, 2), dtype=torch.uint8, generator=generator),
        torch.randint(0, 3, (10,), generator=generator),
    )


@pytest.mark.parametrize(
    ("options", "reference_optimizer", "slots"),
    [
        (
            {"learning_rate": 0.5, "momentum": 0.9},
            lambda parameters: torch.optim.SGD(parameters, lr=0.5, momentum=0.9),
            {"momentum_buffer"},
        ),
        (
            {"optimizer": "adam", "learning_rate": 0.01},
            lambda parameters: torch.optim.Adam(parameters, lr=0.01),
            {"step", "exp_avg", "exp_avg_sq"},
        ),
    ],
    ids=["sgd-momentum", "adam"],
)
def test_kept_optimizer_state_continues_one_optimizer_across_rounds(options, reference_optimizer, slots):
    """Two calls that hand the optimizer state on equal one optimizer living through both rounds."""
    data, transform = tiny_data(), BatchTransform(TINY_INFO, augment=False)
    recipe = TrainRecipe(local_epochs=1, batch_size=4, persist_optimizer_state=True, **options)
    cpu = torch.device("cpu")

    client = tiny_model()
    first = train_locally(client, data, recipe, transform, cpu, torch.Generator().manual_seed(1))
    kept = first.optimizer_state
    assert kept is not None and set(kept) == {f"{n}/{slot}" for n, _ in client.named_parameters() for slot in slots}
    global_model = tiny_model()  # the server's next model: the client starts round 2 from it
    client.load_state_dict(global_model.state_dict())
    train_locally(client, data, recipe, transform, cpu, torch.Generator().manual_seed(2), optimizer_state=kept)

    reference = tiny_model()
    optimizer = reference_optimizer(reference.parameters())
    for round_seed in (1, 2):
        if round_seed == 2:
            reference.load_state_dict(global_model.state_dict())
        for images, labels, _ in batches(data, 4, shuffle=True, generator=torch.Generator().manual_seed(round_seed)):
            loss = F.cross_entropy(reference(transform(images, train=True)), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    for mine, theirs in zip(client.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs)

    fresh = tiny_model()
    train_locally(fresh, data, recipe, transform, cpu, torch.Generator().manual_seed(2))
    assert any(not torch.allclose(a, b) for a, b in zip(fresh.parameters(), client.parameters(), strict=True))


def test_momentum_is_not_kept_unless_asked():
    data, transform = tiny_data(), BatchTransform(TINY_INFO, augment=False)
    stats = train_locally(
        tiny_model(), data, TrainRecipe(batch_size=4), transform, torch.device("cpu"), torch.Generator()
    )
    assert stats.optimizer_state is None


def test_adam_with_its_settings_is_torch_adam():
    data, transform = tiny_data(), BatchTransform(TINY_INFO, augment=False)
    recipe = TrainRecipe(
        local_epochs=1,
        batch_size=5,
        optimizer="adam",
        learning_rate=0.02,
        adam_beta1=0.8,
        adam_beta2=0.99,
        adam_eps=1e-6,
        weight_decay=1e-3,
    )
    mine = tiny_model()
    train_locally(mine, data, recipe, transform, torch.device("cpu"), torch.Generator().manual_seed(3))
    reference = tiny_model()
    optimizer = torch.optim.Adam(reference.parameters(), lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=1e-3)
    for images, labels, _ in batches(data, 5, shuffle=True, generator=torch.Generator().manual_seed(3)):
        loss = F.cross_entropy(reference(transform(images, train=True)), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for a, b in zip(mine.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="optimizer = 'lion'.*accepted: sgd, adam"):
        train_locally(
            tiny_model(), data, TrainRecipe(optimizer="lion"), transform, torch.device("cpu"), torch.Generator()
        )


def test_an_empty_partition_is_refused_with_what_to_change():
    """No examples: a clear refusal (the ClientApp's reply is an error, excluded), not a division by zero."""
    empty = ImageTensors(torch.zeros((0, 1, 2, 2), dtype=torch.uint8), torch.zeros(0, dtype=torch.long))
    model = tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    transform = BatchTransform(TINY_INFO, augment=False)
    with pytest.raises(ValueError, match="no training examples.*dirichlet-alpha"):
        train_locally(model, empty, TrainRecipe(), transform, torch.device("cpu"), torch.Generator())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
