"""FLood: OOD scores, the batch threshold, ASW weights, λ(t), DAC and its score mappings, the client steps."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from torch import nn

from fedweigh.client.steps import StepContext
from fedweigh.client.training import train_locally
from fedweigh.data.description import DatasetInfo
from fedweigh.data.tensors import ImageTensors
from fedweigh.data.transforms import BatchTransform
from fedweigh.methods.flood.client import (
    ASWStep,
    ASWWeighting,
    OODScoreStep,
    asw_weights,
    energy_score,
    gen_score,
    lower_quantile_index,
    max_logit_score,
    mean_score,
    msp_score,
    pseudo_ood_mask,
)
from fedweigh.methods.flood.protocol import ASW_LAMBDA, OOD_SCORE
from fedweigh.methods.flood.server import DACRule, PseudoOODWeight, dac_weights, pseudo_ood_weight, score_shares
from fedweigh.preflight import parse_settings
from fedweigh.protocol import TrainRecipe
from fedweigh.rules.base import RoundSignals
from fedweigh.settings import SettingsError
from fedweigh.strategies.build import build_strategy

INFO = DatasetInfo(3, 1, 4, (0.5,), (0.25,), "none", "image", "label")
CPU = torch.device("cpu")


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def tiny_data(count: int = 40, seed: int = 5) -> ImageTensors:
    generator = torch.Generator().manual_seed(seed)
    return ImageTensors(
        torch.randint(0, 256, (count, 1, 4, 4), dtype=torch.uint8, generator=generator),
        torch.randint(0, 3, (count,), generator=generator),
    )


# ---------------------------------------------------------------------------
# scores
# ---------------------------------------------------------------------------


def test_scores_on_hand_made_logits():
    logits = torch.tensor([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    np.testing.assert_allclose(energy_score(logits), [math.log(math.exp(2) + 2), math.log(3) + 1.0], rtol=1e-6)
    np.testing.assert_allclose(energy_score(logits, temperature=2.0), 2 * torch.logsumexp(logits / 2, dim=1))
    np.testing.assert_allclose(msp_score(logits), [math.exp(2) / (math.exp(2) + 2), 1 / 3], rtol=1e-6)
    assert max_logit_score(logits).tolist() == [2.0, 1.0]
    assert torch.all(gen_score(logits) < 0)  # the code's GEN is always negative
    p = torch.softmax(logits, dim=1)
    np.testing.assert_allclose(gen_score(logits), -((p**0.1) * (1 - p) ** 0.1).sum(dim=1), rtol=1e-6)


# ---------------------------------------------------------------------------
# the batch threshold and the weights
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("batch", "expected"), [(1, 0), (2, 0), (11, 7), (21, 14), (50, 34)])
def test_exactly_floor_q_times_b_minus_one_samples_are_pseudo_ood(batch, expected):
    scores = torch.randperm(batch, generator=torch.Generator().manual_seed(batch)).float()
    assert lower_quantile_index(batch, 0.7) == expected
    assert int(pseudo_ood_mask(scores, 0.7).sum()) == expected
    # float32 torch.quantile is one sample short at B = 21 (0.7 * 20 = 13.999... in floating point)
    if batch == 21:
        threshold = torch.quantile(scores, 0.7, interpolation="lower")
        assert int((scores < threshold).sum()) == expected - 1


def test_the_lowest_scores_are_marked_and_weighted_by_lambda():
    scores = torch.tensor([0.5, 0.1, 0.9, 0.3, 0.7])
    assert asw_weights(scores, 0.7, 4.0).tolist() == [1.0, 4.0, 1.0, 4.0, 1.0]
    assert asw_weights(scores, 0.0, 4.0).tolist() == [1.0] * 5  # q = 0: no sample below the minimum
    assert asw_weights(scores, 1.0, 4.0).tolist() == [4.0, 4.0, 1.0, 4.0, 4.0]  # q = 1: all but the top score
    assert asw_weights(torch.tensor([0.4]), 0.7, 4.0).tolist() == [1.0]  # a batch of one


def test_ties_at_the_threshold_count_as_in_distribution():
    assert asw_weights(torch.ones(6), 0.7, 9.0).tolist() == [1.0] * 6
    scores = torch.tensor([0.1, 0.5, 0.5, 0.5, 0.9])  # threshold index 2: 0.5; only 0.1 is strictly below
    assert asw_weights(scores, 0.7, 9.0).tolist() == [9.0, 1.0, 1.0, 1.0, 1.0]


@hypothesis_settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-50, 50), min_size=1, max_size=64), st.floats(0, 1), st.floats(0, 500))
def test_weights_are_lambda_or_one_and_at_most_the_quantile_count_are_lambda(values, q, lam):
    scores = torch.tensor(values, dtype=torch.float64)
    weights = asw_weights(scores, q, lam)
    marked = pseudo_ood_mask(scores, q)
    assert int(marked.sum()) <= lower_quantile_index(len(values), q)
    assert torch.all(torch.where(marked, weights == lam, weights == 1.0))
    if marked.any() and (~marked).any():
        assert scores[marked].max() < scores[~marked].min()  # every marked score is below every other


def test_bad_q_is_named():
    with pytest.raises(ValueError, match="flood.q = 1.5"):
        lower_quantile_index(10, 1.5)


# ---------------------------------------------------------------------------
# λ(t)
# ---------------------------------------------------------------------------


def test_cosine_schedule_at_the_spec_s_points():
    expected = {0: 0.0, 1: 0.001, 32: 1.01, 100: 9.79, 250: 58.58, 500: 200.0, 750: 341.42, 1000: 400.0, 1500: 400.0}
    for t, value in expected.items():
        assert pseudo_ood_weight(t, 200, 1000) == pytest.approx(value, abs=0.006), t


@pytest.mark.parametrize("shape", ["cosine", "linear", "quadratic", "exponential", "logistic"])
def test_every_shape_rises_from_zero_to_two_a_and_stays(shape):
    values = [pseudo_ood_weight(t, 50, 40, shape) for t in range(0, 60)]
    assert values[0] == pytest.approx(0.0, abs=1e-9) and values[40] == pytest.approx(100.0)
    assert all(b >= a - 1e-9 for a, b in zip(values, values[1:], strict=False))
    assert all(v == pytest.approx(100.0) for v in values[40:])


def test_the_other_shapes_follow_their_formulas():
    assert pseudo_ood_weight(250, 200, 1000, "linear") == pytest.approx(100.0)
    assert pseudo_ood_weight(500, 200, 1000, "quadratic") == pytest.approx(100.0)
    assert pseudo_ood_weight(1, 200, 1000, "exponential") == pytest.approx(400 * (1 - math.exp(-5)), rel=1e-9)
    assert pseudo_ood_weight(500, 50, 1000, "logistic") == pytest.approx(50.0)  # the code's near-step at T/2
    assert pseudo_ood_weight(400, 50, 1000, "logistic") < 1e-30


def test_the_schedule_is_sent_by_server_round_and_the_code_s_lag_is_an_option():
    plain = PseudoOODWeight(a=200, halt=1000)
    lagged = PseudoOODWeight(a=200, halt=1000, lag=True)
    assert plain(1)[ASW_LAMBDA] == 0.0 and plain(101)[ASW_LAMBDA] == pytest.approx(9.79, abs=0.01)
    assert lagged(1)[ASW_LAMBDA] == 1.0  # the code starts at 1
    assert lagged(102)[ASW_LAMBDA] == plain(101)[ASW_LAMBDA]  # then one round behind
    assert lagged(5000)[ASW_LAMBDA] == 400.0


@pytest.mark.parametrize(
    ("config", "fragments"),
    [
        ({"flood.q": 1.5}, ["flood.q = 1.5", "less than or equal to 1"]),
        ({"flood.q": -0.1}, ["flood.q = -0.1", "greater than or equal to 0"]),
        ({"flood.a": -1.0}, ["flood.a = -1.0", "greater than or equal to 0"]),
        ({"flood.halt-round": 0}, ["flood.halt-round = 0", "greater than or equal to 1"]),
        ({"flood.temperature": 0.0}, ["flood.temperature = 0.0", "greater than 0"]),
        ({"flood.schedule": "sine"}, ["flood.schedule = 'sine'", "'cosine'", "'logistic'"]),
        ({"flood.score": "ash"}, ["flood.score = 'ash'", "'energy'"]),
        ({"dac.alpha": -0.5}, ["dac.alpha = -0.5", "greater than or equal to 0"]),
        ({"dac.mapping": "max"}, ["dac.mapping = 'max'", "'sum', 'shift' or 'softmax'"]),
        ({"lr-decay": 1.2}, ["lr-decay = 1.2", "less than or equal to 1"]),
    ],
)
def test_bad_flood_settings_are_named_before_training(config, fragments):
    with pytest.raises(SettingsError) as caught:
        parse_settings({"strategy": "flood", **config})
    for fragment in fragments:
        assert fragment in str(caught.value), (fragment, str(caught.value))


# ---------------------------------------------------------------------------
# DAC
# ---------------------------------------------------------------------------


def test_dac_reproduces_the_spec_s_worked_example():
    np.testing.assert_allclose(dac_weights([100, 300, 600], [2.0, 3.0, 5.0], alpha=0.5), [2 / 15, 0.3, 17 / 30])
    np.testing.assert_allclose(dac_weights([100, 300, 600], [2.0, 3.0, 5.0], alpha=0.0), [0.1, 0.3, 0.6])


def test_negative_and_zero_scores_map_to_well_defined_shares():
    negative = np.array([-3.0, -1.0, -2.0])
    for mapping in ("sum", "shift", "softmax"):
        shares = score_shares(negative, mapping)
        assert np.all(shares >= 0) and shares.sum() == pytest.approx(1.0) and np.argmax(shares) == 1
    # plain sum normalisation would give negative shares here; the default shifts by the round's minimum
    np.testing.assert_allclose(score_shares(negative), [0.0, 2 / 3, 1 / 3], atol=1e-7)
    np.testing.assert_allclose(score_shares(np.array([0.0, 1.0, 3.0])), [0.0, 0.25, 0.75], atol=1e-7)
    np.testing.assert_allclose(score_shares(np.array([1e-12, 2e-12])), [1 / 3, 2 / 3])  # positive: the paper's sum
    np.testing.assert_allclose(score_shares(np.array([1.0, 3.0]), "shift"), [0.0, 1.0], atol=1e-7)
    np.testing.assert_allclose(
        score_shares(np.array([1.0, 3.0]), "softmax", 2.0), [1 / (1 + math.e), math.e / (1 + math.e)]
    )
    assert score_shares(np.array([-4.0, -4.0])).tolist() == [0.5, 0.5]  # all equal: uniform
    assert dac_weights([7], [-3.0]).tolist() == [1.0]  # one client


@hypothesis_settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 5000), st.floats(-100, 100)), min_size=1, max_size=12),
    st.sampled_from(["sum", "shift", "softmax"]),
    st.floats(0, 5),
    st.randoms(use_true_random=False),
)
def test_dac_weights_are_a_distribution_and_follow_the_clients(clients, mapping, alpha, random):
    sizes, scores = (np.array(values, dtype=float) for values in zip(*clients, strict=True))
    weights = dac_weights(sizes, scores, alpha=alpha, mapping=mapping)
    assert np.all(np.isfinite(weights)) and np.all(weights >= 0) and weights.sum() == pytest.approx(1.0)
    order = list(range(len(clients)))
    random.shuffle(order)
    permuted = dac_weights(sizes[order], scores[order], alpha=alpha, mapping=mapping)
    np.testing.assert_allclose(permuted, weights[order], atol=1e-12)


def test_the_dac_rule_reads_the_ood_score_signal_and_records_shares():
    rule = DACRule(alpha=0.5)
    assert rule.signals == (OOD_SCORE,)
    outcome = rule(RoundSignals(np.array([100.0, 300.0, 600.0]), {OOD_SCORE: np.array([2.0, 3.0, 5.0])}))
    np.testing.assert_allclose(outcome.weights, [2 / 15, 0.3, 17 / 30])
    assert outcome.diagnostics["ood-share"] == pytest.approx([0.2, 0.3, 0.5])
    with pytest.raises(ValueError, match="dac.mapping = 'max'"):
        DACRule(mapping="max")


# ---------------------------------------------------------------------------
# the client steps
# ---------------------------------------------------------------------------


def context(model: nn.Module, data: ImageTensors, **config) -> StepContext:
    return StepContext(
        model=model,
        data=data,
        transform=BatchTransform(INFO, augment=False),
        device=CPU,
        seed=3,
        run_seed=1,
        partition_id=0,
        server_round=1,
        config=config,
    )


def test_asw_with_fedprox_weights_only_the_cross_entropy():
    """Two steps of ASW + FedProx against the loss written out by hand: (1/B) Σ m_i CE_i + μ/2 ||w − w_g||².

    From the second step on the proximal term has a gradient; weighting it by the mask too would change it.
    """
    data, transform = tiny_data(8), BatchTransform(INFO, augment=False)
    recipe = TrainRecipe(local_epochs=1, batch_size=4, learning_rate=0.1, momentum=0.0, proximal_mu=0.5)
    model, reference, anchor = tiny_model(), tiny_model(), tiny_model()  # the same weights: the global model's
    weighting = ASWWeighting(energy_score, q=0.7, lam=5.0)
    train_locally(model, data, recipe, transform, CPU, torch.Generator().manual_seed(2), weighting)

    reference.train()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    order = torch.randperm(8, generator=torch.Generator().manual_seed(2))
    for batch in (order[:4], order[4:]):
        logits = reference(transform(data.images[batch], train=True))
        mask = asw_weights(energy_score(logits.detach()), 0.7, 5.0)
        weighted = (mask * F.cross_entropy(logits, data.labels[batch], reduction="none")).sum() / 4
        pairs = zip(reference.parameters(), anchor.parameters(), strict=True)
        proximal = sum(((p - a.detach()) ** 2).sum() for p, a in pairs)
        optimizer.zero_grad()
        (weighted + 0.25 * proximal).backward()
        optimizer.step()
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs)
    assert weighting.pseudo_ood_fraction == 2 * lower_quantile_index(4, 0.7) / 8


def test_the_asw_step_reports_the_fraction_marked_and_needs_lambda():
    data, model = tiny_data(100), tiny_model()
    step = ASWStep()
    weighting, _ = step.before_training(context(model, data, **{ASW_LAMBDA: 3.0}))
    recipe = TrainRecipe(local_epochs=1, batch_size=50)
    train_locally(model, data, recipe, BatchTransform(INFO, augment=False), CPU, torch.Generator(), weighting)
    metrics = step.after_training(context(model, data))
    assert metrics == {"pseudo-ood-fraction": 2 * 34 / 100, "asw-lambda": 3.0}  # 34 of each batch of 50
    with pytest.raises(ValueError, match="asw-lambda"):
        ASWStep().before_training(context(model, data))


def test_the_uniform_control_scales_the_loss_like_asw_without_preferring_samples():
    logits = torch.tensor([[3.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [5.0, 0.0, 0.0]])
    masked = ASWWeighting(energy_score, q=0.7, lam=4.0)(logits, torch.zeros(4, dtype=torch.long), torch.arange(4))
    uniform = ASWWeighting(energy_score, q=0.7, lam=4.0, mask="uniform")
    weights = uniform(logits, torch.zeros(4, dtype=torch.long), torch.arange(4))
    assert weights.tolist() == [float(masked.mean())] * 4 and masked.tolist() != weights.tolist()
    assert uniform.pseudo_ood_fraction == 2 / 4


def test_phi_is_the_trained_model_s_mean_score_in_eval_mode():
    data, model = tiny_data(30), tiny_model()
    model.train()
    metrics = OODScoreStep().after_training(context(model, data))
    assert model.training  # modes restored
    model.eval()
    with torch.no_grad():
        expected = float(energy_score(model(BatchTransform(INFO, augment=False)(data.images, train=False))).mean())
    assert metrics[OOD_SCORE] == pytest.approx(expected, rel=1e-6)
    msp = OODScoreStep().after_training(context(model, data, **{"flood.score": "msp"}))[OOD_SCORE]
    assert 1 / 3 <= msp <= 1
    assert mean_score(model, data, BatchTransform(INFO, augment=False), CPU, energy_score) == pytest.approx(expected)


def test_flood_is_asw_and_dac_and_plugs_into_other_strategies():
    flood = build_strategy(parse_settings({"strategy": "flood", "flood.halt-round": 25, "flood.a": 100.0}))
    assert flood.rule.name == "dac" and flood.recipe["client-steps"] == ["asw", "ood-score"]
    assert flood.round_values(26)[ASW_LAMBDA] == pytest.approx(200.0)
    dac_only = build_strategy(parse_settings({"strategy": "fedprox", "aggregation": "dac"}))
    assert dac_only.recipe["client-steps"] == ["ood-score"] and ASW_LAMBDA not in dac_only.round_values(3)
    asw_only = build_strategy(parse_settings({"strategy": "fedavg", "client-steps": "asw"}))
    assert asw_only.rule.name == "sample-count" and asw_only.round_values(1)[ASW_LAMBDA] == 0.0
