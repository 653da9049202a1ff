"""The FedOUI authors' setting (spec fedoui §3, §6, A3, A13): their Dirichlet split, their CIFAR-10 statistics,
the probe through the training transform."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_experiments import DEFAULTS
from test_fedoui import DropoutNet, step_context

from fedweigh.client.registry import STEP_CLASSES
from fedweigh.components import batch_transform, input_of
from fedweigh.data.federated import DataSpec, clear_caches, load_partition, partition_sizes
from fedweigh.data.partitioning import build_partitioner
from fedweigh.data.soft_capped import class_split, soft_capped_dirichlet
from fedweigh.methods.fedoui.client import probe_generator, probe_indices
from fedweigh.preflight import check_run
from fedweigh.settings import SettingsError, validate

AUTHORS_MEAN = "0.4914,0.4822,0.4465"
AUTHORS_STD = "0.2023,0.1994,0.2010"


def reference_split(labels: np.ndarray, clients: int, alpha: float, min_size: int, seed: int) -> list[list[int]]:
    """Spec §6 step 1 written out as plainly as possible, loop by loop."""
    rng = np.random.default_rng(seed)
    while True:
        held: list[list[int]] = [[] for _ in range(clients)]
        for c in sorted(set(labels.tolist())):
            idx_c = [i for i, y in enumerate(labels.tolist()) if y == c]
            idx_c = np.array(idx_c)
            rng.shuffle(idx_c)
            p = rng.dirichlet([alpha] * clients)
            p = np.array([p[k] * (len(idx_c) - len(held[k])) for k in range(clients)])
            p = np.maximum(p, 0)
            if p.sum() == 0:
                p = np.ones(clients)
            p = p / p.sum()
            counts = [int(np.floor(p[k] * len(idx_c))) for k in range(clients)]
            for k in range(len(idx_c) - sum(counts)):
                counts[k] += 1
            start = 0
            for k in range(clients):
                held[k].extend(idx_c[start : start + counts[k]].tolist())
                start += counts[k]
        if min(len(h) for h in held) >= min_size:
            break
    out = []
    for h in held:
        a = np.array(h)
        rng.shuffle(a)
        out.append(a.tolist())
    return out


@pytest.mark.parametrize(("alpha", "seed"), [(0.1, 1), (0.3, 2), (1.0, 3)])
def test_the_split_is_the_spec_s_step_one(alpha: float, seed: int):
    labels = np.random.default_rng(7).integers(0, 10, 3000)
    ours = soft_capped_dirichlet(labels, 20, alpha=alpha, min_size=10, seed=seed)
    assert [part.tolist() for part in ours] == reference_split(labels, 20, alpha, 10, seed)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=2, max_size=8),
    total=st.integers(1, 60),
    alpha=st.floats(0.01, 10.0),
    seed=st.integers(0, 2**16),
)
def test_a_class_is_dealt_out_whole_and_a_full_client_gets_none(sizes, total, alpha, seed):
    sizes = np.array(sizes)
    pieces = class_split(np.arange(total), sizes, alpha, np.random.default_rng(seed))
    assert sorted(np.concatenate(pieces).tolist()) == list(range(total))
    if (sizes < total).any():  # somebody still has room: the full ones get only the +1 remainder at most
        for k in np.flatnonzero(sizes >= total):
            assert len(pieces[k]) <= 1


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), clients=st.integers(2, 12), alpha=st.floats(0.05, 5.0))
def test_partitions_cover_the_split_once_and_reach_the_minimum(seed, clients, alpha):
    labels = np.random.default_rng(seed).integers(0, 5, 400)
    parts = soft_capped_dirichlet(labels, clients, alpha=alpha, min_size=5, seed=seed)
    assert sorted(np.concatenate(parts).tolist()) == list(range(400))
    assert min(map(len, parts)) >= 5
    again = soft_capped_dirichlet(labels, clients, alpha=alpha, min_size=5, seed=seed)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_the_soft_cap_spreads_samples_more_evenly_than_plain_dirichlet():
    """A client's share shrinks as it fills, so the biggest client holds less than under an uncapped split."""
    labels = np.repeat(np.arange(10), 300)
    capped, plain = [], []
    for seed in range(10):
        capped.append(max(map(len, soft_capped_dirichlet(labels, 20, alpha=0.1, min_size=0, seed=seed))))
        rng = np.random.default_rng(seed)
        held = np.zeros(20)
        for _ in range(10):
            held += np.floor(rng.dirichlet(np.full(20, 0.1)) * 300)
        plain.append(held.max())
    assert np.mean(capped) < np.mean(plain)


def test_an_impossible_minimum_names_the_setting():
    labels = np.zeros(30, dtype=int)
    with pytest.raises(ValueError, match=r"min-partition-size = 5 for 10 clients needs 50 samples.*at most 3"):
        soft_capped_dirichlet(labels, 10, alpha=0.1, min_size=5, seed=1)
    with pytest.raises(ValueError, match=r"soft-capped-dirichlet.*min-partition-size = 3.*in 1000 draws"):
        soft_capped_dirichlet(np.repeat(np.arange(2), 15), 10, alpha=1e-4, min_size=3, seed=1)


def test_the_partitioner_runs_in_the_data_pipeline_with_rare_and_noisy_clients():
    import datasets

    table = datasets.Dataset.from_dict({"label": np.random.default_rng(0).integers(0, 10, 600), "row": np.arange(600)})
    partitioner = build_partitioner(
        "soft-capped-dirichlet", 10, seed=4, dirichlet_alpha=0.3, classes_per_client=2, shards_per_client=2,
        min_partition_size=10,
    )  # fmt: skip
    partitioner.dataset = table
    rows = [partitioner.load_partition(k)["row"] for k in range(10)]
    expected = soft_capped_dirichlet(np.asarray(table["label"]), 10, alpha=0.3, min_size=10, seed=4)
    assert [list(r) for r in rows] == [e.tolist() for e in expected]

    spec = DataSpec(
        dataset="digits", partitioner="soft-capped-dirichlet", num_partitions=20, seed=1, dirichlet_alpha=0.1,
        min_partition_size=10, rare_clients=0.2, rare_client_cap=30, noisy_clients=0.2,
    )  # fmt: skip
    clear_caches()
    sizes = partition_sizes(spec)
    assert sum(sizes) == 1437 and sizes.count(30) >= 1 and min(sizes) >= 10
    assert len(load_partition(spec, 0)) == sizes[0]


# ------------------------------------------------------------------ the authors' CIFAR-10 statistics


def test_normalization_statistics_replace_the_dataset_s_own():
    config = {**DEFAULTS, "normalization-mean": "0.25", "normalization-std": "0.5"}
    transform = batch_transform(validate(config))
    assert transform.mean == (0.25,) and transform.std == (0.5,)
    images = torch.full((2, 1, 8, 8), 255, dtype=torch.uint8)
    assert torch.allclose(transform(images, train=False), torch.full((2, 1, 8, 8), 1.5))
    assert batch_transform(validate(DEFAULTS)).mean != (0.25,)  # unset: the dataset's statistics
    authors = validate({**DEFAULTS, "normalization-mean": AUTHORS_MEAN, "normalization-std": AUTHORS_STD})
    assert input_of(authors).std == (0.2023, 0.1994, 0.2010)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"normalization-mean": "0.5"}, "normalization-mean is set but normalization-std is not"),
        ({"normalization-std": "0.5"}, "normalization-std is set but normalization-mean is not"),
        ({"normalization-mean": "0.5", "normalization-std": "0"}, "normalization-std = '0'.*positive"),
        ({"normalization-mean": "x", "normalization-std": "1"}, "normalization-mean = 'x'.*accepted"),
        ({"normalization-mean": "0.5,0.5", "normalization-std": "1"}, "different lengths"),
        (
            {"normalization-mean": "0.5", "normalization-std": "1", "normalization": "feature"},
            "normalization = 'feature' standardises every pixel",
        ),
        (
            {"normalization-mean": AUTHORS_MEAN, "normalization-std": AUTHORS_STD},
            r"normalization-mean = '0.4914,0.4822,0.4465'.*do not fit.*dataset = 'digits'.*1 here",
        ),
    ],
)
def test_bad_statistics_are_refused_before_training_naming_the_setting(extra, message):
    with pytest.raises(SettingsError, match=message):
        check_run({**DEFAULTS, **extra}, num_partitions=4)


# ------------------------------------------------------------------ the probe through the training transform


def test_a_train_transform_probe_is_augmented_anew_every_round_and_reproducible():
    torch.manual_seed(0)
    model = DropoutNet()
    step = STEP_CLASSES["oui"]()
    option = {"oui.probe-transform": "train"}
    first = step.after_training(step_context(model, server_round=1, **option))
    again = step.after_training(step_context(model, server_round=1, **option))
    later = [step.after_training(step_context(model, server_round=r, **option))["oui"] for r in range(2, 8)]
    assert first == again  # the same round of the same run: the same crops and flips
    assert len({first["oui"], *later}) > 1  # other rounds: other augmentations of the same images
    context = step_context(model, server_round=1, **option)
    positions = probe_indices(40, 8, seed=5, partition_id=3)
    images = context.data.images[positions]
    augmented = context.transform(images, train=True, generator=probe_generator(5, 3, 1))
    with torch.no_grad():
        from fedweigh.methods.fedoui.client import oui

        assert first["oui"] == oui(model.hidden(augmented.flatten(1)))
    assert not torch.equal(augmented, context.transform(images, train=False))


def test_probe_transform_accepts_eval_or_train_only():
    with pytest.raises(SettingsError, match=r"oui.probe-transform.*'eval' or 'train'"):
        check_run({**DEFAULTS, "strategy": "fedoui", "oui.probe-transform": "augmented"})
