"""FedOUI: the OUI, the Beta fit and its fallbacks, the weights, the rule, the client probe, FedAlign."""

from __future__ import annotations

import json
import tomllib

import numpy as np
import pytest
import torch
from conftest import REPO, FakeGrid, reply
from flwr.app import Array, ArrayRecord, ConfigRecord
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from torch import nn

from fedweigh.client.registry import STEP_CLASSES, build_steps
from fedweigh.client.steps import StepContext
from fedweigh.data.description import DatasetInfo
from fedweigh.data.tensors import ImageTensors
from fedweigh.data.transforms import BatchTransform
from fedweigh.methods.fedalign.protocol import FedAlignSettings
from fedweigh.methods.fedalign.server import AlignmentRule, alignment_weights, update_cosines
from fedweigh.methods.fedoui import server as fedoui_module
from fedweigh.methods.fedoui.client import oui, probe_indices
from fedweigh.methods.fedoui.protocol import FedOUISettings, OUIProbeSettings
from fedweigh.methods.fedoui.server import (
    OUIBetaRule,
    beta_mle,
    beta_moments,
    bilateral_scores,
    fedoui_weights,
    fit_oui_beta,
    rank_percentile_scores,
)
from fedweigh.models import build_model
from fedweigh.preflight import parse_settings
from fedweigh.rules.base import RoundSignals
from fedweigh.strategies.build import build_strategy

# Round 59 of the authors' released alpha = 0.1 run (FedOUI repo, results/tables/report_oui_snapshot.csv):
# the paper's "representative round" (OUIs centred at 0.2767, Beta(6.10, 15.94)), with the released
# per-client typicality scores and weights.
SNAPSHOT_OUIS = np.array([0.12646484375, 0.25732421875, 0.31005859375, 0.31787109375, 0.37158203125])
SNAPSHOT_SIZES = np.array([210, 226, 66, 40, 17])
SNAPSHOT_SCORES = np.array(
    [0.0742685898063508, 0.8949962243159014, 0.6820536430803679, 0.6264101714950925, 0.3164800926891966]
)
SNAPSHOT_WEIGHTS = np.array(
    [0.0537858429784814, 0.6890480757665608, 0.1534029294133093, 0.0853977546504615, 0.0183653971911869]
)

unit_values = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
counts = st.integers(min_value=1, max_value=100_000)


# ---------------------------------------------------------------------------
# the OUI
# ---------------------------------------------------------------------------


def test_oui_is_zero_when_every_unit_is_always_on_or_always_off():
    assert oui(torch.ones(32, 128)) == 0.0
    assert oui(-torch.ones(32, 128)) == 0.0
    assert oui(torch.zeros(32, 128)) == 0.0  # 0 is not active: the test is strict > 0
    mixed = torch.cat([torch.ones(32, 64), -torch.ones(32, 64)], dim=1)
    assert oui(mixed) == 0.0


def test_oui_is_one_when_every_unit_is_on_for_exactly_half_of_the_batch():
    balanced = torch.cat([torch.ones(16, 128), -torch.ones(16, 128)])
    assert oui(balanced) == 1.0
    assert oui(balanced[torch.randperm(32, generator=torch.Generator().manual_seed(0))]) == 1.0


def test_oui_hand_made_matrix():
    # B = 4, d = 3: unit 0 on for 1 sample (minority 1), unit 1 on for 2 (2), unit 2 on for 4 (0).
    a = torch.tensor([[1.0, 1.0, 1.0], [-1.0, 2.0, 1.0], [-2.0, -1.0, 1.0], [0.0, -1.0, 1.0]])
    assert oui(a) == pytest.approx((1 + 2 + 0) / (3 * 2))


def test_oui_odd_batch_uses_floor_half_and_stays_in_range():
    # B = 5: a unit on for 2 or 3 samples has minority 2 = floor(5/2), so it counts fully.
    a = torch.tensor([[1.0, -1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, 1.0], [-1.0, 1.0]])
    assert oui(a) == 1.0
    assert oui(torch.tensor([[1.0], [-1.0], [-1.0]])) == 1.0  # B = 3, floor = 1
    assert 0.0 <= oui(torch.randn(7, 50, generator=torch.Generator().manual_seed(1))) <= 1.0


def test_oui_with_fewer_than_two_samples_is_zero():
    assert oui(torch.randn(1, 10)) == 0.0
    assert oui(torch.empty(0, 10)) == 0.0


def test_oui_flattens_conv_outputs_per_sample():
    conv = torch.randn(8, 4, 3, 3, generator=torch.Generator().manual_seed(2))
    assert oui(conv) == oui(conv.reshape(8, 36))
    assert oui(torch.tensor([1.0, -1.0, 1.0, -1.0])) == 1.0  # 1-D: one unit per sample


def test_oui_is_quantised_to_multiples_of_one_over_d_times_half_b():
    value = oui(torch.randn(32, 128, generator=torch.Generator().manual_seed(3)))
    assert value * 2048 == pytest.approx(round(value * 2048), abs=1e-9)


def test_oui_rejects_tensors_without_units():
    with pytest.raises(ValueError, match="batch dimension"):
        oui(torch.tensor(1.0))
    with pytest.raises(ValueError, match="no units"):
        oui(torch.empty(4, 0))


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 40), st.integers(1, 30), st.integers(0, 2**31 - 1))
def test_oui_range_and_invariances(batch, units, seed):
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(batch, units, generator=generator)
    value = oui(a)
    assert 0.0 <= value <= 1.0
    assert oui(a[torch.randperm(batch, generator=generator)]) == value  # sample order
    assert oui(a[:, torch.randperm(units, generator=generator)]) == value  # unit order
    assert oui(3.0 * a) == value  # only signs matter
    assert oui(-a) == value  # the minority count is symmetric (randn gives no exact zeros)


# ---------------------------------------------------------------------------
# Beta fit and scores
# ---------------------------------------------------------------------------


def test_moments_fit_matches_the_beta_moments_in_scipy():
    values = np.array([0.15, 0.22, 0.31, 0.27, 0.19, 0.24])
    alpha, beta = beta_moments(values)
    mean, variance = stats.beta.stats(alpha, beta, moments="mv")
    assert float(mean) == pytest.approx(values.mean(), rel=1e-12)
    assert float(variance) == pytest.approx(values.var(ddof=1), rel=1e-12)  # the unbiased variance


def test_representative_round_matches_the_paper_and_the_released_weights():
    weights, scores, fit = fedoui_weights(SNAPSHOT_OUIS, SNAPSHOT_SIZES)
    assert SNAPSHOT_OUIS.mean() == pytest.approx(0.2767, abs=1e-4)
    assert fit.method == "moments"
    assert (round(fit.alpha, 2), round(fit.beta, 2)) == (6.10, 15.94)  # paper §4.4
    np.testing.assert_allclose(scores, SNAPSHOT_SCORES, rtol=1e-9)
    np.testing.assert_allclose(weights, SNAPSHOT_WEIGHTS, rtol=1e-9)
    assert int(np.argmax(weights)) == 1  # the client closest to the centre
    # the MLE does not reproduce the paper's parameters (this is how MoM was identified)
    mle_alpha, mle_beta = beta_mle(np.clip(SNAPSHOT_OUIS, 1e-3, 1 - 1e-3))
    assert abs(mle_alpha - 6.10) > 0.3 and abs(mle_beta - 15.94) > 1.0


def test_bilateral_score_is_twice_the_smaller_tail_of_scipy_cdf():
    ouis = np.array([0.0, 0.05, 0.2, 0.35, 0.9, 1.0])
    alpha, beta = 3.0, 9.0
    cdf = stats.beta.cdf(np.clip(ouis, 1e-4, 1 - 1e-4), alpha, beta)
    np.testing.assert_allclose(bilateral_scores(ouis, alpha, beta), 2 * np.minimum(cdf, 1 - cdf), rtol=1e-12)
    median = stats.beta.median(alpha, beta)
    assert bilateral_scores(np.array([median]), alpha, beta)[0] == pytest.approx(1.0)


def test_single_client_falls_back_to_rank_percentile_and_gets_weight_one():
    assert beta_moments(np.array([0.3])) is None and beta_mle(np.array([0.3])) is None
    weights, scores, fit = fedoui_weights(np.array([0.3]), np.array([50]))
    assert fit.method == "empirical" and fit.alpha is None
    np.testing.assert_array_equal(weights, [1.0])
    np.testing.assert_array_equal(scores, [1.0])  # p = 1/2


def test_equal_ouis_fall_back_to_percentiles_and_give_exactly_fedavg():
    values = np.full(5, 0.21)
    assert beta_moments(values) is None  # zero variance
    assert beta_mle(values) is None  # the solver fails on identical points
    sizes = np.array([10, 40, 25, 5, 20])
    weights, scores, fit = fedoui_weights(values, sizes)
    assert fit.method == "empirical"
    np.testing.assert_array_equal(scores, np.ones(5))
    np.testing.assert_allclose(weights, sizes / sizes.sum(), rtol=1e-12)


def test_over_dispersed_ouis_fall_back_to_a_u_shaped_mle():
    values = np.array([0.0, 0.0, 1.0, 1.0, 0.0])
    clipped = np.clip(values, 1e-3, 1 - 1e-3)
    assert clipped.var(ddof=1) >= clipped.mean() * (1 - clipped.mean())
    fit = fit_oui_beta(values)
    assert fit.method == "mle" and fit.alpha < 1 and fit.beta < 1
    expected = stats.beta.fit(clipped, floc=0, fscale=1)
    assert (fit.alpha, fit.beta) == pytest.approx(expected[:2], rel=1e-6)


def test_near_equal_ouis_give_huge_concentration():
    fit = fit_oui_beta(np.array([0.2, 0.2, 0.2, 0.2, 0.21]))
    assert fit.method == "moments"
    assert fit.alpha + fit.beta == pytest.approx(8000, rel=0.05)  # spec §4: c ≈ 8000


def test_non_finite_beta_scores_fall_back_to_percentiles(monkeypatch):
    monkeypatch.setattr(fedoui_module, "bilateral_scores", lambda ouis, a, b: np.full(len(ouis), np.nan))
    weights, scores, fit = fedoui_weights(np.array([0.1, 0.2, 0.4]), np.array([1, 1, 1]))
    assert fit.method == "empirical"
    np.testing.assert_allclose(scores, rank_percentile_scores(np.array([0.1, 0.2, 0.4])))
    assert weights.sum() == pytest.approx(1.0)


def test_rank_percentiles_average_ties():
    np.testing.assert_allclose(rank_percentile_scores(np.array([0.2, 0.2, 0.5, 0.1])), [1.0, 1.0, 0.4, 0.4])


def test_exponents_and_epsilon():
    ouis, sizes = SNAPSHOT_OUIS, SNAPSHOT_SIZES
    _, scores, _ = fedoui_weights(ouis, sizes)
    weights, _, _ = fedoui_weights(ouis, sizes, gamma=2.0, rho=0.0, epsilon=0.01)
    expected = (scores + 0.01) ** 2  # rho = 0 ignores sizes; the fit is unchanged at these values
    np.testing.assert_allclose(weights, expected / expected.sum(), rtol=1e-6)
    uniform, _, _ = fedoui_weights(ouis, sizes, gamma=0.0, rho=0.0)
    np.testing.assert_allclose(uniform, np.full(5, 0.2))


@pytest.mark.parametrize(
    ("ouis", "sizes", "kwargs", "message"),
    [
        ([0.2, 1.5], [1, 1], {}, "ouis"),
        ([0.2, np.nan], [1, 1], {}, "ouis"),
        ([0.2, 0.3], [1], {}, "num_examples"),
        ([0.2, 0.3], [1, -1], {}, "num_examples"),
        ([], [], {}, "empty"),
        ([0.2, 0.3], [1, 1], {"epsilon": 0.5}, "epsilon"),
        ([0.2, 0.3], [1, 1], {"gamma": -1.0}, "gamma"),
        ([0.2, 0.3], [1, 1], {"window_values": [2.0]}, "window_values"),
    ],
)
def test_bad_inputs_are_named(ouis, sizes, kwargs, message):
    with pytest.raises(ValueError, match=message):
        fedoui_weights(np.array(ouis, dtype=float), np.array(sizes, dtype=float), **kwargs)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(unit_values, counts), min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_weight_invariants_and_permutation_equivariance(clients, random):
    ouis = np.array([o for o, _ in clients])
    sizes = np.array([n for _, n in clients], dtype=float)
    weights, scores, _ = fedoui_weights(ouis, sizes)
    assert np.all(np.isfinite(weights)) and np.all(weights >= 0)
    assert weights.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all((scores >= 0) & (scores <= 1))
    order = list(range(len(clients)))
    random.shuffle(order)
    permuted, _, _ = fedoui_weights(ouis[order], sizes[order])
    np.testing.assert_allclose(permuted, weights[order], rtol=1e-6, atol=1e-9)


@settings(max_examples=50, deadline=None)
@given(unit_values, st.lists(counts, min_size=1, max_size=10))
def test_equal_ouis_are_fedavg(value, sizes):
    sizes = np.array(sizes, dtype=float)
    weights, _, _ = fedoui_weights(np.full(len(sizes), value), sizes)
    np.testing.assert_allclose(weights, sizes / sizes.sum(), rtol=1e-12)


# ---------------------------------------------------------------------------
# the rule and its window
# ---------------------------------------------------------------------------


def rounds_of_ouis(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(4)
    return [rng.uniform(0.1, 0.4, size=5) for _ in range(count)]


def test_rule_reports_diagnostics():
    rule = OUIBetaRule()
    outcome = rule(RoundSignals(SNAPSHOT_SIZES.astype(float), {"oui": SNAPSHOT_OUIS}))
    np.testing.assert_allclose(outcome.weights, SNAPSHOT_WEIGHTS, rtol=1e-9)
    diagnostics = outcome.diagnostics
    assert diagnostics["fit-method"] == "moments"
    assert diagnostics["beta-alpha"] == pytest.approx(6.0951, abs=1e-4)
    assert diagnostics["oui-mean"] == pytest.approx(SNAPSHOT_OUIS.mean())
    assert diagnostics["oui-var"] == pytest.approx(SNAPSHOT_OUIS.var(ddof=1))
    np.testing.assert_allclose(diagnostics["oui-score"], SNAPSHOT_SCORES, rtol=1e-9)
    json.dumps(diagnostics)  # goes to metrics.jsonl as is
    assert rule.state() == {"history": []}  # window 1 keeps nothing


def test_window_pools_earlier_rounds_into_the_fit_only():
    rule = OUIBetaRule(window=3)
    sizes = np.ones(5)
    history = rounds_of_ouis(4)
    fit_sizes = [rule(RoundSignals(sizes, {"oui": ouis})).diagnostics["fit-size"] for ouis in history]
    assert fit_sizes == [5, 10, 15, 15]
    assert rule.state()["history"] == [list(history[2]), list(history[3])]
    outcome = OUIBetaRule(window=3)
    outcome.load_state({"history": [list(history[1]), list(history[2])]})
    result = outcome(RoundSignals(sizes, {"oui": history[3]}))
    weights, scores, _ = fedoui_weights(history[3], sizes, window_values=np.concatenate(history[1:3]))
    np.testing.assert_allclose(result.weights, weights)
    assert len(result.diagnostics["oui-score"]) == 5  # only this round's clients are scored


def test_window_state_round_trips_through_json_and_resumes_exactly():
    history = rounds_of_ouis(6)
    sizes = np.array([3.0, 1.0, 4.0, 1.0, 5.0])
    straight = OUIBetaRule(window=3)
    expected = [straight(RoundSignals(sizes, {"oui": ouis})).weights for ouis in history]

    first = OUIBetaRule(window=3)
    for ouis in history[:3]:
        first(RoundSignals(sizes, {"oui": ouis}))
    saved = json.loads(json.dumps(first.state()))
    resumed = OUIBetaRule(window=3)
    resumed.load_state(saved)
    for ouis, weights in zip(history[3:], expected[3:], strict=True):
        np.testing.assert_array_equal(resumed(RoundSignals(sizes, {"oui": ouis})).weights, weights)


def test_rule_rejects_bad_options_and_bad_saved_history():
    with pytest.raises(ValueError, match="window"):
        OUIBetaRule(window=0)
    with pytest.raises(ValueError, match="epsilon"):
        OUIBetaRule(epsilon=-1.0)
    with pytest.raises(ValueError, match="history"):
        OUIBetaRule(window=2).load_state({"history": [[0.2, 7.0]]})


# ---------------------------------------------------------------------------
# the rule inside the strategy: bad signals are left out
# ---------------------------------------------------------------------------


def tiny_model(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"fc.weight": rng.normal(size=(3, 4)).astype(np.float32), "fc.bias": rng.normal(size=3).astype(np.float32)}


def prime(strategy, num_nodes: int = 8) -> None:
    grid = FakeGrid({1000 + i: i for i in range(num_nodes)})
    record = ArrayRecord({k: Array(v) for k, v in tiny_model(100).items()})
    list(strategy.configure_train(1, record, ConfigRecord(), grid))


@pytest.mark.parametrize("bad", ["missing", np.nan, 1.5, -0.1, [0.2, 0.3]])
def test_client_with_a_bad_oui_is_left_out_with_a_warning(bad, caplog):
    strategy = build_strategy(parse_settings({"strategy": "fedoui", "min-train-nodes": 2}))
    prime(strategy)
    good = [
        reply(1000 + i, tiny_model(i), {"num-examples": int(n), "train_loss": 1.0, "oui": float(o), "partition-id": i})
        for i, (o, n) in enumerate(zip(SNAPSHOT_OUIS, SNAPSHOT_SIZES, strict=True))
    ]
    metrics = {"num-examples": 50, "train_loss": 1.0, "partition-id": 7}
    if bad != "missing":
        metrics["oui"] = bad
    with caplog.at_level("WARNING", logger="flwr.fedweigh"):
        strategy.aggregate_train(1, [*good, reply(1007, tiny_model(7), metrics)])
    record = strategy.records[1]
    assert list(record.left_out) == ["7"] and "oui" in record.left_out["7"]
    assert "left out node 1007" in caplog.text
    np.testing.assert_allclose([c["weight"] for c in record.clients], SNAPSHOT_WEIGHTS, rtol=1e-9)
    assert [c["oui-score"] for c in record.clients] == pytest.approx(SNAPSHOT_SCORES.tolist())
    assert record.diagnostics["fit-method"] == "moments"


# ---------------------------------------------------------------------------
# the client step
# ---------------------------------------------------------------------------


class DropoutNet(nn.Module):
    """Dropout before the probe layer: the OUI depends on eval mode being used."""

    probe_layer = "hidden"

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.5)
        self.hidden = nn.Linear(3 * 8 * 8, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(self.drop(x.flatten(1)))))


def step_context(model: nn.Module, num_samples: int = 40, server_round: int = 1, **options) -> StepContext:
    generator = torch.Generator().manual_seed(11)
    data = ImageTensors(
        torch.randint(0, 256, (num_samples, 3, 8, 8), dtype=torch.uint8, generator=generator),
        torch.randint(0, 4, (num_samples,), generator=generator),
    )
    info = DatasetInfo(4, 3, 8, (0.5,) * 3, (0.25,) * 3, "crop-flip", "img", "label")
    return StepContext(
        model=model,
        data=data,
        transform=BatchTransform(info, augment=True),
        device=torch.device("cpu"),
        seed=1234 + server_round,  # the per-round seed must not move the probe
        run_seed=5,
        partition_id=3,
        server_round=server_round,
        config={"oui.probe-size": 8, "oui.probe-layer": "", **options},
    )


def expected_oui(model: DropoutNet, context: StepContext, probe_size: int = 8) -> float:
    positions = probe_indices(len(context.data), probe_size, seed=5, partition_id=3)
    inputs = context.transform(context.data.images[positions], train=False)
    with torch.no_grad():
        return oui(model.hidden(inputs.flatten(1)))


def test_probe_step_measures_the_eval_mode_oui_of_a_fixed_probe():
    torch.manual_seed(0)
    model = DropoutNet()
    model.train()
    [step] = build_steps(["oui"])
    first = step.after_training(step_context(model, server_round=1))
    second = step.after_training(step_context(model, server_round=9))
    assert first == second  # same probe every round, no augmentation, no dropout
    context = step_context(model)
    assert first == {"oui": expected_oui(model, context), "oui-probe-size": 8.0}
    # the probe really is the eval transform: the training transform would change the inputs
    positions = probe_indices(40, 8, seed=5, partition_id=3)
    images = context.data.images[positions]
    augmented = context.transform(images, train=True, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(augmented, context.transform(images, train=False))


def test_probe_step_removes_its_hook_and_restores_every_mode():
    model = DropoutNet()
    model.train()
    model.drop.eval()  # a mixed state must come back exactly
    STEP_CLASSES["oui"]().after_training(step_context(model))
    assert model.training and model.hidden.training and model.out.training
    assert not model.drop.training
    assert not model.hidden._forward_hooks
    assert all(not p.grad_fn and p.grad is None for p in model.parameters())


def test_probe_is_seeded_by_run_seed_and_partition():
    a = probe_indices(500, 32, seed=1, partition_id=1)
    assert torch.equal(a, probe_indices(500, 32, seed=1 + 10007, partition_id=0))
    assert not torch.equal(a, probe_indices(500, 32, seed=1, partition_id=2))
    assert len(set(a.tolist())) == 32  # without replacement when the partition is big enough
    small = probe_indices(5, 32, seed=1, partition_id=1)
    assert len(small) == 32 and set(small.tolist()) <= set(range(5))


def test_probe_step_with_a_small_partition_and_an_explicit_layer():
    model = build_model("mlp", num_classes=4, in_channels=3, image_size=8)
    context = step_context(model, num_samples=5, **{"oui.probe-layer": "fc1", "oui.probe-size": 12})
    metrics = STEP_CLASSES["oui"]().after_training(context)
    assert metrics["oui-probe-size"] == 12.0 and 0.0 <= metrics["oui"] <= 1.0
    positions = probe_indices(5, 12, seed=5, partition_id=3)
    with torch.no_grad():
        expected = oui(model.fc1(context.transform(context.data.images[positions], train=False).flatten(1)))
    assert metrics["oui"] == expected


def test_probe_step_errors_name_the_problem():
    model = DropoutNet()
    with pytest.raises(ValueError, match="oui.probe-layer = 'nope'"):
        STEP_CLASSES["oui"]().after_training(step_context(model, **{"oui.probe-layer": "nope"}))
    # the check before training asks the step the same question, on the model alone
    with pytest.raises(ValueError, match="oui.probe-layer = 'nope' is not a submodule of DropoutNet"):
        STEP_CLASSES["oui"].check_model(model, {"oui.probe-layer": "nope"})
    STEP_CLASSES["oui"].check_model(model, {})  # the model's own probe layer


# ---------------------------------------------------------------------------
# FedAlign
# ---------------------------------------------------------------------------


def test_update_cosines_hand_made():
    reference = {"a": np.zeros(1, np.float32), "b": np.zeros(1, np.float32), "steps": np.array(3)}
    # updates (1, 0) and (0, 1) split over two tensors; sizes 1 and 3: mean update (0.25, 0.75)
    models = [
        {"a": np.ones(1, np.float32), "b": np.zeros(1, np.float32), "steps": np.array(99)},
        {"a": np.zeros(1, np.float32), "b": np.ones(1, np.float32), "steps": np.array(-5)},
    ]
    cosines = update_cosines(models, reference, np.array([1, 3]))
    norm = np.hypot(0.25, 0.75)
    np.testing.assert_allclose(cosines, [0.25 / norm, 0.75 / norm])  # integer buffers are ignored


def test_update_cosines_opposite_and_zero_updates():
    reference = {"w": np.array([1.0, 1.0])}
    models = [{"w": np.array([2.0, 1.0])}, {"w": np.array([0.5, 1.0])}, {"w": np.array([1.0, 1.0])}]
    cosines = update_cosines(models, reference, np.array([3, 1, 5]))  # mean update (0.3125, 0)
    np.testing.assert_allclose(cosines, [1.0, -1.0, 0.0])
    weights = alignment_weights(cosines, np.array([3, 1, 5]))
    raw = np.array([3 * 1.001, 1 * 0.001, 5 * 0.001])
    np.testing.assert_allclose(weights, raw / raw.sum())


def test_all_updates_zero_give_fedavg_up_to_epsilon():
    reference = {"w": np.zeros(3)}
    cosines = update_cosines([reference, reference], reference, np.array([1, 3]))
    np.testing.assert_array_equal(cosines, [0.0, 0.0])
    np.testing.assert_allclose(alignment_weights(cosines, np.array([1, 3])), [0.25, 0.75])


def test_fedalign_strategy_weighs_by_the_server_signal():
    strategy = build_strategy(parse_settings({"strategy": "fedalign", "min-train-nodes": 2}))
    assert isinstance(strategy.rule, AlignmentRule) and strategy.rule.signals == ()  # asks the clients for nothing
    prime(strategy)
    sizes = [10, 30, 20]
    models = [tiny_model(i) for i in range(3)]
    strategy.aggregate_train(
        1,
        [
            reply(1000 + i, m, {"num-examples": n, "train_loss": 1.0})
            for i, (m, n) in enumerate(zip(models, sizes, strict=True))
        ],
    )
    record = strategy.records[1]
    cosines = update_cosines(models, tiny_model(100), np.array(sizes))
    assert [c["alignment"] for c in record.clients] == pytest.approx(cosines.tolist())
    expected = alignment_weights(cosines, np.array(sizes))
    assert [c["weight"] for c in record.clients] == pytest.approx(expected.tolist())


def test_alignment_rule_needs_the_server_signal():
    with pytest.raises(ValueError, match="alignment"):
        AlignmentRule()(RoundSignals(np.ones(2), {}))
    with pytest.raises(ValueError, match="cosines"):
        alignment_weights(np.array([1.5]), np.array([1]))


# ---------------------------------------------------------------------------
# settings and builders
# ---------------------------------------------------------------------------


def test_builder_recipe_and_settings():
    settings_ = parse_settings({"strategy": "fedoui", "seed": 7, "oui.probe-size": 16, "fedoui.window": 5})
    strategy = build_strategy(settings_)
    assert isinstance(strategy.rule, OUIBetaRule) and strategy.rule.window == 5
    assert strategy.recipe["client-steps"] == ["oui"]
    assert (strategy.recipe["oui.probe-size"], strategy.recipe["oui.probe-layer"]) == (16, "")
    assert not any(key.startswith("fedoui.") for key in strategy.recipe)  # the rule's options stay on the server
    with pytest.raises(ValueError, match="oui.probe-size"):
        parse_settings({"oui.probe-size": 1})


def test_pyproject_defaults_match_the_settings():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert FedOUISettings.model_validate(config["fedoui"]) == FedOUISettings()
    assert FedAlignSettings.model_validate(config["fedalign"]) == FedAlignSettings()
    assert OUIProbeSettings.model_validate(config["oui"]) == OUIProbeSettings()
    assert (config["rare-clients"], config["rare-client-cap"], config["noisy-clients"], config["label-noise"]) == (
        0.0,
        120,
        0.0,
        0.4,
    )
