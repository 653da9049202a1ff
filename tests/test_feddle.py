"""Feddle's server step, its baselines, and the server's own data (spec ``specs/feddle.md``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import SHARED_DATASETS
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from fedweigh.data.description import DatasetInfo
from fedweigh.data.server import ServerData, hold_out, load_other_dataset, match_shape
from fedweigh.data.tensors import ImageTensors
from fedweigh.data.transforms import BatchTransform
from fedweigh.methods.fedasync.server import AsyncMixing
from fedweigh.methods.feddle.atlas import (
    ModelAtlas,
    coefficient_gradient,
    fallback_coefficients,
    median_norm_ratios,
    merged,
)
from fedweigh.methods.feddle.server_training import epochs_in_round
from fedweigh.methods.feddle.update import FallbackStep, FeddleUpdate, ParameterView, SearchOptions
from fedweigh.results import SEARCH_SECONDS, TIMING_FIELDS
from fedweigh.settings import validate
from fedweigh.strategies.updates import RoundUpdate

# ---------------------------------------------------------------------------
# the atlas: normalisation, eviction, fallback, gradient
# ---------------------------------------------------------------------------


def add(atlas: ModelAtlas, delta, origin=0, dispatch_round=1, arrival_round=1) -> None:
    atlas.add(
        torch.as_tensor(delta, dtype=torch.float32),
        origin=origin,
        num_examples=10,
        dispatch_round=dispatch_round,
        arrival_round=arrival_round,
    )


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.01, 100.0), min_size=1, max_size=9), st.integers(1, 6))
def test_normalised_anchors_all_have_the_median_norm(scales, dim):
    anchors = torch.stack([torch.full((dim,), s, dtype=torch.float32) for s in scales])
    ratios = median_norm_ratios(anchors)
    norms = (anchors.double() * ratios[:, None]).norm(dim=1)
    median = float(np.median(anchors.double().norm(dim=1).numpy()))
    assert torch.allclose(norms, torch.full_like(norms, median), rtol=1e-6)


def test_the_median_of_an_even_atlas_is_the_mean_of_the_middle_two_and_normalising_can_be_off():
    anchors = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0], [0.0, 10.0]])
    ratios = median_norm_ratios(anchors)
    assert torch.allclose(ratios, torch.tensor([2.5, 1.25, 2.5 / 3, 0.25], dtype=torch.float64))
    assert median_norm_ratios(anchors, normalize=False).tolist() == [1.0] * 4
    zero = median_norm_ratios(torch.tensor([[0.0, 0.0], [3.0, 4.0]]))  # a zero update does not divide by zero
    assert torch.isfinite(zero).all()


def test_a_full_atlas_evicts_its_least_important_scored_anchor_and_protects_new_ones():
    atlas = ModelAtlas(capacity=3)
    for origin in range(3):
        add(atlas, [float(origin + 1), 0.0], origin=origin)
    atlas.score(torch.tensor([0.5, -0.1, 2.0]))  # |c|: 0.5, 0.1, 2.0
    add(atlas, [9.0, 9.0], origin=3)  # evicts origin 1 (|c| = 0.1)
    assert [a.origin for a in atlas.anchors] == [0, 3, 2] and atlas.evictions == 1
    add(atlas, [8.0, 8.0], origin=4)  # the new anchor 3 is protected: origin 0 (0.5) goes
    assert [a.origin for a in atlas.anchors] == [4, 3, 2]
    add(atlas, [7.0, 7.0], origin=5)  # 3 and 4 are new: the scored 2 goes, despite its |c| = 2.0
    assert [a.origin for a in atlas.anchors] == [4, 3, 5]
    add(atlas, [6.0, 6.0], origin=6)  # all new: the oldest new one (3) goes
    assert [a.origin for a in atlas.anchors] == [4, 6, 5] and atlas.evictions == 4


def test_fifo_eviction_drops_the_oldest_and_ties_drop_the_oldest():
    atlas = ModelAtlas(capacity=2, fifo=True)
    for origin in range(4):
        add(atlas, [1.0], origin=origin)
    assert [a.origin for a in atlas.anchors] == [2, 3]
    tied = ModelAtlas(capacity=2)
    add(tied, [1.0], origin=0)
    add(tied, [1.0], origin=1)
    tied.score(torch.tensor([0.3, -0.3]))
    add(tied, [1.0], origin=2)
    assert [a.origin for a in tied.anchors] == [2, 1]


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 5),
    st.integers(0, 4),
    st.floats(0.01, 2.0),
    st.booleans(),
    st.integers(0, 2**31 - 1),
)
def test_the_fallback_coefficients_give_exactly_fedbuffs_step(new, old, server_lr, scaled, seed):
    rng = np.random.default_rng(seed)
    atlas = ModelAtlas(capacity=new + old)
    for origin in range(old):  # already merged in earlier rounds
        add(atlas, rng.normal(size=6) * rng.uniform(0.1, 10), origin=origin)
    atlas.score(torch.ones(old))
    staleness = rng.integers(0, 30, size=new)
    for k in range(new):
        add(
            atlas,
            rng.normal(size=6) * rng.uniform(0.1, 10),
            origin=old + k,
            dispatch_round=10 - int(staleness[k]),
            arrival_round=10,
        )
    anchors = atlas.matrix()
    ratios = median_norm_ratios(anchors)
    coefficients = fallback_coefficients(atlas.anchors, ratios, server_lr, scaled)
    base = torch.tensor(rng.normal(size=6), dtype=torch.float32)
    weights = [1.0 / math.sqrt(1.0 + s) if scaled else 1.0 for s in staleness]
    fedbuff = base.double() + server_lr / new * sum(w * anchors[old + k].double() for k, w in enumerate(weights))
    assert torch.allclose(merged(base, anchors, ratios, coefficients).double(), fedbuff, rtol=1e-5, atol=1e-5)
    assert coefficients[:old].abs().sum() == 0  # old anchors are already inside the global model


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))


def test_the_coefficient_gradient_is_autograds_through_an_explicit_merge():
    model = tiny_model()
    view = ParameterView(model)
    base = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    anchors = torch.randn(4, view.size) * 0.3
    ratios = median_norm_ratios(anchors)
    c = torch.tensor([0.2, -0.4, 1.1, 0.05], dtype=torch.float64)
    fallback = torch.tensor([0.1, 0.0, 0.3, 0.0], dtype=torch.float64)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    lam = 0.07

    # autograd through w(c) = base + Σ c_m r_m a_m, every layer written out
    c_graph = c.clone().requires_grad_(True)
    w = base.double() + ((c_graph * ratios) @ anchors.double())
    sizes = [p.numel() for p in model.parameters()]
    w1, b1, w2, b2 = torch.split(w, sizes)
    hidden = torch.tanh(x.double() @ w1.reshape(5, 4).T + b1)
    loss = F.cross_entropy(hidden @ w2.reshape(3, 5).T + b2, y) + lam / 2 * ((c_graph - fallback) ** 2).sum()
    (expected,) = torch.autograd.grad(loss, c_graph)

    # Feddle's way: one backward pass at w', two products with the anchors (App. E)
    view.load(merged(base, anchors, ratios, c))
    g = view.gradient(F.cross_entropy(model(x), y))
    found = coefficient_gradient(g, anchors, ratios, c, fallback, lam)
    assert torch.allclose(found, expected, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------
# the update step
# ---------------------------------------------------------------------------


def named(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def shifted(arrays: dict[str, np.ndarray], scale: float, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        k: (v + scale * rng.normal(size=v.shape)).astype(v.dtype) if np.issubdtype(v.dtype, np.floating) else v + 1
        for k, v in arrays.items()
    }


def round_update(global_model, models, model_rounds, server_round=5, start_models=None, sizes=None):
    count = len(models)
    return RoundUpdate(
        server_round=server_round,
        global_model=global_model,
        models=models,
        model_rounds=model_rounds,
        weights=np.full(count, 1.0 / count),
        num_examples=np.array(sizes or [10.0] * count),
        start_models=start_models or {},
        partitions=list(range(count)),
        clients_per_round=count,
    )


def separable(n=96, seed=0, classes=3) -> ImageTensors:
    """Tiny 1x2x2 images whose label is readable from the pixels."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=generator)
    images = torch.randint(0, 60, (n, 1, 2, 2), generator=generator, dtype=torch.uint8)
    images[:, 0, 0, 0] += (labels * 90).to(torch.uint8)
    return ImageTensors(images, labels)


def server_data(kind="id", classes=3) -> ServerData:
    info = DatasetInfo(classes, 1, 2, (0.4,), (0.3,), "none", "image", "label")
    return ServerData(kind, separable(classes=classes), classes, BatchTransform(info, False), "test")


def pixel_model(classes=3) -> nn.Module:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, classes))
    model.classifier_layer = "3"
    return model


def test_the_fallback_step_is_feddle_without_the_search_and_stale_updates_start_from_their_own_model():
    model = pixel_model()
    start = named(model)  # the round-3 model the stale client trained
    current = shifted(start, 0.5, seed=1)  # the round-5 global model
    fresh, stale = shifted(current, 0.1, seed=2), shifted(start, 0.1, seed=3)
    update = FallbackStep(pixel_model())
    new = update(round_update(current, [fresh, stale], [5, 3], start_models={3: start}))
    for name in current:
        expected = current[name] + 0.5 * ((fresh[name] - current[name]) + (stale[name] - start[name]))
        np.testing.assert_allclose(new[name], expected, rtol=1e-5, atol=1e-6)
    anchors = update.atlas.matrix()
    view = ParameterView(model)
    assert torch.allclose(anchors[1], view.flatten(stale) - view.flatten(start))  # relative to its start model


def test_batch_norm_buffers_are_the_arrivals_weighted_mean_and_not_searched():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3))
    model.classifier_layer = "3"
    current = named(model)
    clients = [shifted(current, 0.2, seed=s) for s in (1, 2)]
    data = server_data()
    update = FeddleUpdate(model, data, SearchOptions(epochs=1, batch_size=32))
    new = update(round_update(current, clients, [5, 5], sizes=[10.0, 30.0]))
    for buffer in ("2.running_mean", "2.running_var"):
        np.testing.assert_allclose(new[buffer], 0.25 * clients[0][buffer] + 0.75 * clients[1][buffer], rtol=1e-6)
    assert new["2.num_batches_tracked"].dtype == current["2.num_batches_tracked"].dtype
    assert "2.running_mean" not in ParameterView(model).parameters
    assert list(new) == list(current)


def test_the_in_distribution_search_lowers_the_server_loss_from_the_fallback():
    model = pixel_model()
    current = named(model)
    clients = [shifted(current, 0.3, seed=s) for s in range(4)]
    update = FeddleUpdate(pixel_model(), server_data(), SearchOptions(epochs=5, batch_size=32, learning_rate=0.05))
    step = round_update(current, clients, [5] * 4)
    update(step)
    report = step.diagnostics
    assert report["search-loss-after"] < report["search-loss-before"]
    assert report["atlas-size"] == 4 and report["new-anchors"] == 4 and report["search-steps"] == 5 * 3
    # its cost: 5 passes over the 96 server images, and the loss on them before and after; the wall time
    assert report["search-images"] == 5 * 96 + 2 * 96 and "head-steps" not in report
    assert isinstance(report[SEARCH_SECONDS], float) and report[SEARCH_SECONDS] >= 0.0
    assert SEARCH_SECONDS in TIMING_FIELDS  # two runs of one seed compare equal without it
    assert len(report["coefficients"]) == 4 and report["negative-coefficients"] == sum(
        c < 0 for c in report["coefficients"]
    )
    assert all(not anchor.new for anchor in update.atlas.anchors)  # scored: |ĉ|
    assert [a.score for a in update.atlas.anchors] == pytest.approx([abs(c) for c in report["coefficients"]], abs=1e-6)


def test_the_out_of_distribution_search_fits_a_head_and_searches_on_the_body_only():
    model = pixel_model()
    current = named(model)
    clients = [shifted(current, 0.3, seed=s) for s in range(3)]
    data = server_data("ood", classes=5)
    update = FeddleUpdate(pixel_model(), data, SearchOptions(epochs=4, batch_size=32, learning_rate=0.05))
    assert update.head is not None and update.head.out_features == 5 and update.head.in_features == 6
    head_before = update.head.weight.detach().clone()
    step = round_update(current, clients, [5] * 3)
    new = update(step)
    assert not torch.equal(update.head.weight, head_before)  # fitted on the server's own 5 classes
    assert step.diagnostics["search-loss-after"] <= step.diagnostics["search-loss-before"] + 1e-9
    assert step.diagnostics["head-steps"] == step.diagnostics["search-steps"] == 4 * 3
    assert step.diagnostics["search-images"] == 2 * 4 * 96 + 2 * 96  # the head's passes, then the search's
    # the body gradient alone moves c: the classifier's entries of ∂h/∂w are zero
    view = update.view
    mask = view.head_mask("3")
    view.load(view.flatten(current))
    images, labels = data.data.images[:16], data.data.labels[:16]
    gradient = view.gradient(update._surrogate_loss(images, labels))
    assert gradient[mask].abs().sum() == 0 and gradient[~mask].abs().sum() > 0
    # ... and the whole model, head included, takes the merge
    assert not np.allclose(new["3.weight"], current["3.weight"])
    state = update.state()
    again = FeddleUpdate(pixel_model(), data, SearchOptions())
    again.load_state(state)
    assert torch.equal(again.head.weight, update.head.weight) and len(again.atlas) == 3


@pytest.mark.parametrize("epochs", [1, 10, 20])
@pytest.mark.parametrize("learning_rate", [1e-5, 1e-4, 1e-3])
def test_the_papers_search_grid_is_accepted_and_reaches_the_search(epochs, learning_rate):
    """App. D: server epochs {1, 10, 20}, coefficient learning rates {1e-5, 1e-4, 1e-3}."""
    config = validate({"strategy": "feddle", "feddle.search-epochs": epochs, "feddle.search-lr": learning_rate})
    options = SearchOptions.from_settings(config)
    assert (options.epochs, options.learning_rate) == (epochs, learning_rate)


def test_fedasync_mixes_each_arrival_discounted_by_its_staleness():
    current = {"w": np.array([0.0, 0.0], dtype=np.float32)}
    clients = [{"w": np.array([1.0, 1.0], dtype=np.float32)}, {"w": np.array([3.0, -1.0], dtype=np.float32)}]
    update = AsyncMixing(alpha=0.5, a=1.0)
    step = round_update(current, clients, [5, 2])  # staleness 0 then 3
    new = update(step)
    first = 0.5 * np.array([1.0, 1.0])
    expected = (1 - 0.125) * first + 0.125 * np.array([3.0, -1.0])
    np.testing.assert_allclose(new["w"], expected, rtol=1e-6)
    assert step.diagnostics["mixing"] == [0.5, 0.125]


@pytest.mark.parametrize(("total", "rounds"), [(50, 200), (50, 7), (3, 3), (1, 10)])
def test_center_spreads_its_epochs_over_the_rounds(total, rounds):
    per_round = [epochs_in_round(r, total, rounds) for r in range(1, rounds + 1)]
    assert sum(per_round) == total and max(per_round) - min(per_round) <= 1


# ---------------------------------------------------------------------------
# the server's data
# ---------------------------------------------------------------------------


def test_held_out_images_leave_the_evaluation_set_and_a_smaller_draw_is_a_prefix_of_a_larger():
    test = ImageTensors(torch.zeros(50, 1, 2, 2, dtype=torch.uint8), torch.arange(50))
    small, rest_small = hold_out(test, 5, seed=3)
    large, rest_large = hold_out(test, 20, seed=3)
    assert set(small.labels.tolist()).isdisjoint(rest_small.labels.tolist())
    assert small.labels.tolist() == large.labels[:5].tolist()
    assert len(rest_large) == 30 and hold_out(test, 5, seed=4)[0].labels.tolist() != small.labels.tolist()
    with pytest.raises(ValueError, match="accepted: 1 to 49"):
        hold_out(test, 50, seed=3)


def test_images_are_brought_to_the_clients_shape():
    grey = torch.arange(16, dtype=torch.uint8).reshape(1, 1, 4, 4) * 10
    colour = match_shape(grey, channels=3, image_size=4)
    assert colour.shape == (1, 3, 4, 4) and torch.equal(colour[0, 0], colour[0, 2])
    assert torch.equal(match_shape(colour, channels=1, image_size=4), grey)  # luma of equal channels
    assert match_shape(grey, channels=1, image_size=8).shape == (1, 1, 8, 8)
    with pytest.raises(ValueError, match="4 channels"):
        match_shape(torch.zeros(1, 4, 2, 2, dtype=torch.uint8), 3, 2)


def test_another_dataset_is_sampled_resized_and_normalised_on_its_own():
    data = load_other_dataset(str(SHARED_DATASETS / "mnist"), size=200, seed=1, channels=3, image_size=32)
    assert data.kind == "ood" and len(data) == 200 and data.num_classes == 10
    assert data.data.images.shape == (200, 3, 32, 32)
    assert data.transform.mean[0] == data.transform.mean[2] and 0.05 < data.transform.mean[0] < 0.3
    again = load_other_dataset(str(SHARED_DATASETS / "mnist"), size=200, seed=1, channels=3, image_size=32)
    assert torch.equal(again.data.labels, data.data.labels)
