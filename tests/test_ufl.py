"""UFL: uncertainty, selection, loss weights, MC dropout and U-Agg (spec ufl.md §2-§4)."""

from __future__ import annotations

import copy
import logging
import math

import numpy as np
import pytest
import torch
from conftest import FakeGrid, reply
from flwr.app import Array, ArrayRecord, ConfigRecord
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from fedweigh.client.mc_dropout import (
    HEAD_DROPOUT_ATTRIBUTE,
    DropoutMasks,
    DropoutSite,
    HeadDropout,
    dropout_sites,
    ensure_mc_dropout,
    mc_mean_probabilities,
)
from fedweigh.client.registry import STEP_CLASSES
from fedweigh.client.steps import StepContext
from fedweigh.client.training import train_locally, weighted_cross_entropy
from fedweigh.data.description import DatasetInfo
from fedweigh.data.tensors import ImageTensors
from fedweigh.data.transforms import BatchTransform
from fedweigh.methods.ufl.client import (
    UncertaintyWeighting,
    loss_weights,
    sample_uncertainty,
    select_uncertain,
    selection_size,
)
from fedweigh.methods.ufl.protocol import UNCERTAINTY, UNCERTAINTY_MEAN, UAggSettings
from fedweigh.methods.ufl.server import SizeAwareComplementShareRule, size_aware_complement_share_weights, u_agg_rule
from fedweigh.models import build_model
from fedweigh.preflight import parse_settings
from fedweigh.protocol import TrainRecipe
from fedweigh.rules.base import ComplementShareRule, RoundSignals, SampleCountRule
from fedweigh.settings import SettingsError
from fedweigh.strategies.base import WeightedFedAvg
from fedweigh.strategies.build import build_strategy

CPU = torch.device("cpu")
SPEC_U = [0.1, 0.9, 0.3, 0.8, 0.2, 0.7, 0.0, 0.4, 0.5, 0.6]


def transform_for(channels: int, size: int) -> BatchTransform:
    info = DatasetInfo(10, channels, size, (0.5,) * channels, (0.25,) * channels, "crop-flip", "img", "label")
    return BatchTransform(info, augment=True)


def random_data(count: int, channels: int, size: int, seed: int = 0) -> ImageTensors:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (count, channels, size, size), dtype=torch.uint8, generator=generator)
    return ImageTensors(images, torch.randint(0, 10, (count,), generator=generator))


def seeded_model(name: str, channels: int, size: int, **options) -> nn.Module:
    torch.manual_seed(3)
    return build_model(name, 10, channels, size, **options)


# ---------------------------------------------------------------------------
# spec vectors: uncertainty, selection, weights, loss
# ---------------------------------------------------------------------------


def test_uncertainty_is_true_label_nll_of_the_mean_with_a_floor():
    p = torch.tensor([[math.exp(-1.0), 1 - math.exp(-1.0)], [0.0, 1.0], [0.5, 0.5]], dtype=torch.float64)
    u = sample_uncertainty(p, torch.tensor([0, 0, 1]))
    assert u.tolist() == pytest.approx([1.0, -math.log(1e-12), math.log(2.0)])


def test_spec_selection_vector():
    u = torch.tensor(SPEC_U, dtype=torch.float64)
    selected = select_uncertain(u, 0.3)
    assert selection_size(10, 0.3) == 3
    assert sorted(selected.tolist()) == [1, 3, 5]
    assert float(u[selected].sum()) == pytest.approx(2.4)
    weights = loss_weights(u, selected, alpha=0.2)
    expected = [1.0] * 10
    for i in (1, 3, 5):
        expected[i] = 1 + 0.2 * SPEC_U[i]
    assert weights.tolist() == pytest.approx(expected)


def test_unit_uncertainty_in_the_top_set_weighs_one_point_two():
    u = torch.tensor([1.0, 0.0])
    assert loss_weights(u, torch.tensor([0]), alpha=0.2).tolist() == pytest.approx([1.2, 1.0])


def _logits_with_cross_entropy(values: list[float]) -> torch.Tensor:
    # two classes, label 0: CE = log(1 + e^z) for logits [0, z]
    return torch.tensor([[0.0, math.log(math.expm1(v))] for v in values])


@pytest.mark.parametrize(("normalize", "expected"), [(False, 2.0), (True, (1.0 + 3.0) / 2.5)])
def test_spec_batch_loss_vector(normalize, expected):
    logits = _logits_with_cross_entropy([1.0, 2.0])
    labels = torch.tensor([0, 0])
    weighting = UncertaintyWeighting(torch.tensor([9.0, 1.5, 7.0, 1.0]), normalize=normalize)
    weights = weighting(logits, labels, torch.tensor([3, 1]))  # looked up by local index
    assert weights.tolist() == [1.0, 1.5]
    assert float(weighted_cross_entropy(logits, labels, weights, weighting.normalize)) == pytest.approx(expected)


@given(
    st.lists(st.floats(0, 30, allow_nan=False), min_size=1, max_size=60),
    st.floats(0.01, 1.0),
    st.floats(0.0, 2.0),
)
@settings(max_examples=60, deadline=None)
def test_selection_and_weights_properties(values, ratio, alpha):
    u = torch.tensor(values, dtype=torch.float64)
    selected = select_uncertain(u, ratio)
    n = len(values)
    assert len(selected) == min(max(math.ceil(round(ratio * n, 9)), 1), n)
    rest = torch.ones(n, dtype=torch.bool)
    rest[selected] = False
    if rest.any():
        assert u[selected].min() >= u[rest].max()  # the selected are the largest
    weights = loss_weights(u, selected, alpha)
    assert torch.all(weights >= 1.0)
    assert torch.all(weights[rest] == 1.0)
    assert torch.allclose(weights[selected].double(), 1 + alpha * u[selected])


def test_bad_ratio_and_alpha_are_named():
    with pytest.raises(ValueError, match="ufl.ratio"):
        selection_size(10, 0.0)
    with pytest.raises(ValueError, match="ufl.alpha"):
        loss_weights(torch.zeros(3), torch.tensor([0]), -0.1)


# ---------------------------------------------------------------------------
# U-Agg
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uncertainties", "expected"),
    [
        ([1, 1, 2], [0.375, 0.375, 0.25]),
        ([1, 3], [0.75, 0.25]),
        ([2, 2, 2, 2], [0.25] * 4),
        ([0, 0, 5], [0.5, 0.5, 0.0]),
        ([0, 0, 0], [1 / 3] * 3),
        ([7], [1.0]),
    ],
)
def test_spec_u_agg_vectors(uncertainties, expected):
    rule = u_agg_rule(UAggSettings())
    assert isinstance(rule, ComplementShareRule) and rule.signal == UNCERTAINTY
    values = np.array(uncertainties, dtype=float)
    outcome = rule(RoundSignals(np.full(len(values), 10.0), {UNCERTAINTY: values}))
    np.testing.assert_allclose(outcome.weights, expected, atol=1e-12)


def test_size_aware_and_mean_forms():
    np.testing.assert_allclose(
        size_aware_complement_share_weights(np.array([1.0, 1.0, 2.0]), np.array([10, 20, 10])),
        np.array([7.5, 15.0, 5.0]) / 27.5,
    )
    # all U zero: the complement shares are uniform, so the weights are FedAvg's
    np.testing.assert_allclose(size_aware_complement_share_weights(np.zeros(2), np.array([1, 3])), [0.25, 0.75])
    rule = u_agg_rule(UAggSettings(signal="mean", size_aware=True))
    assert isinstance(rule, SizeAwareComplementShareRule) and rule.signal == UNCERTAINTY_MEAN
    assert rule.signals == (UNCERTAINTY_MEAN,)


def _arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"fc.weight": rng.normal(size=(3, 2)).astype(np.float32), "fc.bias": rng.normal(size=3).astype(np.float32)}


def _u_agg_round(uncertainties: list[float]) -> tuple[WeightedFedAvg, ArrayRecord | None]:
    strategy = build_strategy(parse_settings({"strategy": "ufl", "min-train-nodes": 1, "fraction-train": 1.0}))
    grid = FakeGrid({1000 + i: i for i in range(len(uncertainties))})
    global_arrays = ArrayRecord({k: Array(v) for k, v in _arrays(99).items()})
    list(strategy.configure_train(1, global_arrays, ConfigRecord(), grid))
    replies = [
        reply(
            1000 + i,
            _arrays(i),
            {
                "num-examples": 10 * (i + 1),
                "train_loss": 0.5,
                "partition-id": i,
                UNCERTAINTY: value,
                UNCERTAINTY_MEAN: 0.1,
            },
        )
        for i, value in enumerate(uncertainties)
    ]
    arrays, _ = strategy.aggregate_train(1, replies)
    return strategy, arrays


def test_u_agg_through_the_strategy_records_u_and_weights():
    strategy, arrays = _u_agg_round([1.0, 1.0, 2.0])
    record = strategy.records[1]
    assert [c["weight"] for c in record.clients] == pytest.approx([0.375, 0.375, 0.25])
    assert [c[UNCERTAINTY] for c in record.clients] == [1.0, 1.0, 2.0]
    expected = sum(w * _arrays(i)["fc.bias"] for i, w in enumerate([0.375, 0.375, 0.25]))
    np.testing.assert_allclose(arrays["fc.bias"].numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize(("uncertainties", "expected"), [([3.0], [1.0]), ([0.0, 0.0, 0.0], [1 / 3] * 3)])
def test_u_agg_edge_cases_through_the_strategy(uncertainties, expected):
    record = _u_agg_round(uncertainties)[0].records[1]
    assert [c["weight"] for c in record.clients] == pytest.approx(expected)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_u_agg_leaves_out_a_bad_uncertainty_with_a_warning(bad, caplog):
    with caplog.at_level(logging.WARNING, logger="flwr.fedweigh"):
        record = _u_agg_round([1.0, bad, 3.0])[0].records[1]
    assert list(record.left_out) == ["1"] and UNCERTAINTY in record.left_out["1"]
    assert any(UNCERTAINTY in message for message in caplog.messages)
    assert [c["partition"] for c in record.clients] == [0, 2]
    assert [c["weight"] for c in record.clients] == pytest.approx([0.75, 0.25])


def test_builders_send_the_ufl_recipe():
    settings = parse_settings({"strategy": "ufl", "ufl.alpha": 0.4, "ufl.normalize": True})
    strategy = build_strategy(settings)
    assert strategy.recipe["client-steps"] == ["ufl"]
    assert strategy.recipe["ufl.alpha"] == 0.4 and strategy.recipe["ufl.normalize"] is True
    assert strategy.recipe["ufl.mc-passes"] == 10 and strategy.recipe["ufl.ratio"] == 0.3
    assert isinstance(strategy.rule, ComplementShareRule) and strategy.rule.signal == UNCERTAINTY
    fedavg = build_strategy(parse_settings({"strategy": "ufl-fedavg"}))
    assert isinstance(fedavg.rule, SampleCountRule) and fedavg.recipe["client-steps"] == ["ufl"]
    with pytest.raises(SettingsError, match="ufl.ratio"):
        parse_settings({"ufl.ratio": 0.0})
    with pytest.raises(SettingsError, match="uagg.signal"):
        parse_settings({"uagg.signal": "max"})
    assert not any(key.startswith("uagg.") for key in strategy.recipe)  # the rule's options stay on the server


# ---------------------------------------------------------------------------
# dropout: insertion, reuse, masks
# ---------------------------------------------------------------------------


def test_inserted_head_dropout_keeps_keys_trains_and_is_off_in_eval():
    model = seeded_model("mlp", 1, 8)
    reference = copy.deepcopy(model)
    keys = list(model.state_dict())
    sites = ensure_mc_dropout(model, 0.5)
    ensure_mc_dropout(model, 0.3)  # again, as the ClientApp does each round: one hook, new p
    assert list(model.state_dict()) == keys
    assert sites == [DropoutSite("fc2", 0.5, True)] and dropout_sites(model) == [DropoutSite("fc2", 0.3, True)]
    assert len(model.fc2._forward_pre_hooks) == 1
    x = torch.randn(64, 1, 8, 8)
    model.eval()
    assert torch.equal(model(x), reference.eval()(x))  # eval: no dropout, same as the server's model
    model.train()
    seen = []
    model.fc2.register_forward_pre_hook(lambda m, args: seen.append(args[0]))  # after the dropout hook
    first, second = model(x), model(x)
    assert not torch.equal(first, second)
    dropped = (seen[0] == 0) & (reference.relu1(reference.fc1(x.flatten(1))) != 0)
    assert 0.15 < dropped.float().mean() < 0.45  # about p = 0.3 of the live features are dropped
    # a model built fresh (the server's) loads the hooked model's state
    fresh = build_model("mlp", 10, 1, 8)
    fresh.load_state_dict(model.state_dict())
    assert torch.equal(fresh.eval()(x), model.eval()(x))


@pytest.mark.parametrize(
    ("name", "channels", "size", "sites"),
    [
        ("lenet5", 1, 28, [DropoutSite("dropout", 0.5, False)]),
        ("fashion-cnn", 1, 28, [DropoutSite("dropout", 0.3, False)]),
        ("vgg9", 3, 32, [DropoutSite("dropout1", 0.5, False), DropoutSite("dropout2", 0.5, False)]),
    ],
)
def test_models_with_dropout_keep_theirs(name, channels, size, sites):
    model = seeded_model(name, channels, size)
    assert ensure_mc_dropout(model, 0.1) == sites
    assert not hasattr(model, HEAD_DROPOUT_ATTRIBUTE)
    assert not any(isinstance(h, HeadDropout) for m in model.modules() for h in m._forward_pre_hooks.values())


def test_other_dropout_kinds_and_bad_p_are_errors():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Dropout2d(0.2), nn.Flatten(), nn.Linear(72, 10))
    with pytest.raises(ValueError, match="Dropout2d"):
        ensure_mc_dropout(model, 0.5)
    with pytest.raises(ValueError, match="ufl.dropout"):
        ensure_mc_dropout(seeded_model("mlp", 1, 8), 1.0)


def test_masks_keep_one_minus_p_scaled_and_stack_like_separate_passes():
    x = torch.ones(200, 50)
    out = DropoutMasks(seed=4).apply("site", x, 0.3)
    assert out.unique().tolist() == pytest.approx([0.0, 1 / 0.7])
    assert (out > 0).float().mean() == pytest.approx(0.7, abs=0.02)
    separate = DropoutMasks(seed=4)
    passes = [separate.apply("site", x[:40], 0.3) for _ in range(5)]
    stacked = DropoutMasks(seed=4)
    stacked.stacked = 5
    assert torch.equal(stacked.apply("site", x[:40].repeat(5, 1), 0.3), torch.cat(passes))


# ---------------------------------------------------------------------------
# MC predictive probabilities: cheap path against the naive reference
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "channels", "size", "options"),
    [("mlp", 1, 8, {}), ("lenet5", 1, 28, {}), ("fashion-cnn", 1, 28, {}), ("vgg9", 3, 32, {})],
)
@pytest.mark.sim
def test_cheap_path_equals_full_passes(name, channels, size, options, caplog):
    model = seeded_model(name, channels, size, **options)
    ensure_mc_dropout(model, 0.5)
    data = random_data(20, channels, size)
    transform = transform_for(channels, size)
    with caplog.at_level(logging.WARNING, logger="flwr.fedweigh"):
        cheap = mc_mean_probabilities(model, data, transform, CPU, 6, seed=11, cheap=True, batch_size=8)
    assert not caplog.messages  # the cheap path was taken, not the fallback
    naive = mc_mean_probabilities(model, data, transform, CPU, 6, seed=11, cheap=False, batch_size=8)
    torch.testing.assert_close(cheap, naive, rtol=1e-5, atol=1e-6)
    model.eval()
    with torch.no_grad():
        deterministic = torch.softmax(model(transform(data.images, train=False)), dim=1)
    assert not torch.allclose(cheap, deterministic, atol=1e-4)  # the passes did sample masks
    other_seed = mc_mean_probabilities(model, data, transform, CPU, 6, seed=12, cheap=True, batch_size=8)
    assert not torch.allclose(cheap, other_seed, atol=1e-4)


class SkipOverDropout(nn.Module):
    """The classifier's input skips around the dropout: no plain chain after it."""

    classifier_layer = "fc"

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(64, 16)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(16, 10)
        self.skip = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.body(x.flatten(1)))
        return self.fc(self.dropout(h)) + self.skip(h)


def test_non_chain_models_fall_back_to_full_passes(caplog):
    torch.manual_seed(0)
    model = SkipOverDropout()
    ensure_mc_dropout(model, 0.5)
    data, transform = random_data(20, 1, 8), transform_for(1, 8)
    with caplog.at_level(logging.WARNING, logger="flwr.fedweigh"):
        cheap = mc_mean_probabilities(model, data, transform, CPU, 5, seed=1, cheap=True)
    assert any("full MC passes" in message for message in caplog.messages)
    torch.testing.assert_close(cheap, mc_mean_probabilities(model, data, transform, CPU, 5, seed=1, cheap=False))


def test_zero_dropout_is_one_deterministic_pass():
    model = seeded_model("mlp", 1, 8)
    ensure_mc_dropout(model, 0.0)
    data, transform = random_data(30, 1, 8), transform_for(1, 8)
    probabilities = mc_mean_probabilities(model, data, transform, CPU, 10, seed=1)
    with torch.no_grad():
        logits = model.eval()(transform(data.images, train=False))
    expected = torch.nn.functional.cross_entropy(logits, data.labels, reduction="none").double()
    torch.testing.assert_close(sample_uncertainty(probabilities, data.labels), expected, rtol=1e-5, atol=1e-6)


def test_mc_leaves_modes_batch_norm_statistics_and_global_rng_alone():
    model = seeded_model("lenet5", 1, 28)
    ensure_mc_dropout(model, 0.5)
    model.train()
    before = copy.deepcopy(model.state_dict())
    rng_before = torch.random.get_rng_state()
    mc_mean_probabilities(model, random_data(20, 1, 28), transform_for(1, 28), CPU, 3, seed=2)
    assert torch.equal(torch.random.get_rng_state(), rng_before)
    assert all(module.training for module in model.modules())
    assert all(torch.equal(before[key], value) for key, value in model.state_dict().items())


# ---------------------------------------------------------------------------
# the client step
# ---------------------------------------------------------------------------


def _context(model: nn.Module, data: ImageTensors, transform: BatchTransform, **options) -> StepContext:
    return StepContext(
        model=model,
        data=data,
        transform=transform,
        device=CPU,
        seed=123,
        run_seed=1,
        partition_id=0,
        server_round=1,
        config={f"ufl.{key}": value for key, value in options.items()},
    )


def test_step_weights_and_signals_follow_the_spec():
    model = seeded_model("lenet5", 1, 28)
    data, transform = random_data(50, 1, 28), transform_for(1, 28)
    weighting, metrics = STEP_CLASSES["ufl"]().before_training(
        _context(model, data, transform, **{"mc-passes": 4, "normalize": True})
    )
    probabilities = mc_mean_probabilities(model, data, transform, CPU, 4, seed=123, cheap=False)
    u = sample_uncertainty(probabilities, data.labels)
    top = torch.sort(u, descending=True).values[:15]  # ceil(0.3 * 50)
    assert metrics[UNCERTAINTY] == pytest.approx(float(top.sum()), rel=1e-5)
    assert metrics[UNCERTAINTY_MEAN] == pytest.approx(float(top.mean()), rel=1e-5)
    assert metrics["selected"] == 15
    assert metrics["u-p50"] == pytest.approx(float(torch.quantile(u, 0.5)), rel=1e-5)
    assert metrics["u-p50"] <= metrics["u-p90"] <= metrics["u-p95"] <= metrics["u-p99"]
    assert weighting.normalize is True
    lam = weighting(torch.zeros(50, 10), data.labels, torch.arange(50))
    assert torch.allclose(lam.double(), torch.where(u >= top[-1], 1 + 0.2 * u, torch.ones_like(u)), atol=1e-5)


def _train_like_the_client_app(model: nn.Module, data, transform, steps: list[str], **options) -> nn.Module:
    seed = 77
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    weighting = None
    for name in steps:
        weighting, _ = STEP_CLASSES[name]().before_training(_context(model, data, transform, **options))
    train_locally(model, data, TrainRecipe(batch_size=8), transform, CPU, generator, weighting)
    return model


@pytest.mark.parametrize(
    ("name", "channels", "size", "plain_steps"),
    [("lenet5", 1, 28, []), ("mlp", 1, 8, ["ufl-dropout"])],
)
@pytest.mark.sim
def test_alpha_zero_trains_bit_identically_to_a_plain_client(name, channels, size, plain_steps):
    model = seeded_model(name, channels, size)
    data, transform = random_data(40, channels, size), transform_for(channels, size)
    ufl = _train_like_the_client_app(copy.deepcopy(model), data, transform, ["ufl"], alpha=0.0)
    plain = _train_like_the_client_app(copy.deepcopy(model), data, transform, plain_steps)
    assert all(torch.equal(a, b) for a, b in zip(ufl.state_dict().values(), plain.state_dict().values(), strict=True))
    weighted = _train_like_the_client_app(copy.deepcopy(model), data, transform, ["ufl"], alpha=0.2)
    assert not torch.equal(weighted.state_dict()["fc1.weight"], plain.state_dict()["fc1.weight"])
