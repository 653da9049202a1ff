"""The FedNolowe authors' MNIST split and client sequence (spec fednolowe §6.4): ``partitioner =
"niid-bench-dirichlet"``, ``client-sampling = "python-sequence"``."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SHARED_DATASETS
from hypothesis import given, settings
from hypothesis import strategies as st
from test_experiments import DEFAULTS

from fedweigh.data.federated import DataSpec, clear_caches, load_partition, partition_sizes
from fedweigh.data.niid_bench import niid_bench_dirichlet
from fedweigh.data.partitioning import build_partitioner
from fedweigh.preflight import check_run
from fedweigh.settings import SettingsError, validate
from fedweigh.strategies.build import build_strategy
from fedweigh.strategies.sampling import sample_partitions

MNIST_CLASS_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
AUTHORS_SIZES = [
    866, 2893, 2381, 2205, 1253, 64, 377, 888, 202, 1588, 856, 1427, 1206, 778, 1478, 77, 769, 982,
    459, 478, 1795, 36, 3332, 2532, 624, 487, 787, 1275, 1136, 975, 39, 389, 781, 1043, 1765, 544,
    492, 348, 2994, 1220, 3217, 3997, 263, 1153, 1469, 1445, 1295, 1535, 32, 1773,
]  # fmt: skip
"""Spec §6.4's verified client sizes: MNIST's train split, 50 clients, alpha 0.1, seed 42."""


def test_seed_42_gives_the_authors_mnist_clients():
    labels = np.repeat(np.arange(10), MNIST_CLASS_COUNTS)
    clients = niid_bench_dirichlet(labels, 50, alpha=0.1, min_size=10, seed=42)
    assert [len(c) for c in clients] == AUTHORS_SIZES
    assert [sorted(set(labels[clients[k]].tolist())) for k in (1, 2, 38)] == [[3], [4], [0]]  # single-class
    assert [len(set(labels[clients[k]].tolist())) for k in (10, 49)] == [9, 9]
    assert sorted(np.concatenate(clients).tolist()) == list(range(60_000))


def test_the_mnist_file_split_through_the_pipeline_is_the_authors():
    """The experiment's own path: the shared MNIST parquet, shuffled by the run's seed, split with partition seed 42."""
    spec = DataSpec(
        dataset=str(SHARED_DATASETS / "mnist"), partitioner="niid-bench-dirichlet", num_partitions=50, seed=42,
        dirichlet_alpha=0.1, min_partition_size=10,
    )  # fmt: skip
    clear_caches()
    assert partition_sizes(spec) == AUTHORS_SIZES
    assert load_partition(spec, 38).labels.unique().tolist() == [0]


@settings(max_examples=40, deadline=None)
@given(
    counts=st.lists(st.integers(1, 40), min_size=2, max_size=6),
    clients=st.integers(1, 8),
    alpha=st.sampled_from([0.05, 0.3, 1.0, 10.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_every_sample_goes_to_one_client_and_the_cap_holds(counts, clients, alpha, seed):
    labels = np.repeat(np.arange(len(counts)), counts)
    parts = niid_bench_dirichlet(labels, clients, alpha=alpha, min_size=0, seed=seed)
    assert len(parts) == clients
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(labels)))
    again = niid_bench_dirichlet(labels, clients, alpha=alpha, min_size=0, seed=seed)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    # A client already at N/K when a class is dealt gets none of it (what it held before its last class is < N/K),
    # except the last client, which also takes what the cuts' truncation leaves over, as in the authors' code.
    cap = len(labels) / clients
    for part in parts[:-1]:
        held = labels[part]
        if len(held):
            assert np.sum(held < held.max()) < cap


def test_an_impossible_minimum_names_the_setting():
    with pytest.raises(ValueError, match=r"min-partition-size = 20 for 10 clients needs 200 samples"):
        niid_bench_dirichlet(np.repeat(np.arange(2), 50), 10, alpha=0.5, min_size=20, seed=1)
    with pytest.raises(ValueError, match=r"niid-bench-dirichlet.*min-partition-size = 3.*in 1000 draws"):
        niid_bench_dirichlet(np.repeat(np.arange(2), 15), 10, alpha=1e-4, min_size=3, seed=1)


def test_the_partitioner_is_a_setting_and_binds_to_a_dataset():
    import datasets

    settings_ = validate({"partitioner": "niid-bench-dirichlet", "dirichlet-alpha": 0.1, "min-partition-size": 10})
    assert settings_.partitioner == "niid-bench-dirichlet"
    table = datasets.Dataset.from_dict({"label": np.random.default_rng(0).integers(0, 10, 600), "row": np.arange(600)})
    partitioner = build_partitioner(
        "niid-bench-dirichlet", 10, seed=4, dirichlet_alpha=0.3, classes_per_client=2, shards_per_client=2,
        min_partition_size=10,
    )  # fmt: skip
    partitioner.dataset = table
    expected = niid_bench_dirichlet(np.asarray(table["label"]), 10, alpha=0.3, min_size=10, seed=4)
    assert [list(partitioner.load_partition(k)["row"]) for k in range(10)] == [e.tolist() for e in expected]


def test_a_split_that_cannot_be_made_is_refused_before_training_naming_its_settings():
    split = {"partitioner": "niid-bench-dirichlet", "dirichlet-alpha": 0.1, "min-partition-size": 200}
    with pytest.raises(SettingsError, match=r"partitioner = 'niid-bench-dirichlet', dirichlet-alpha = 0.1, min-par"):
        check_run({**DEFAULTS, "dataset": "digits", **split}, num_partitions=10)


def test_python_sequence_sampling_gives_the_authors_rounds():
    """Spec §6.4: the authors' rounds 1-3 with seed 42, 5 of 50 (their order sorted); a round replays those before."""
    rounds = [sample_partitions(42, t, range(50), 5, sampler="python-sequence") for t in (1, 2, 3)]
    assert rounds == [sorted([40, 7, 1, 47, 17]), sorted([15, 14, 8, 47, 6]), sorted([43, 47, 34, 5, 37])]
    assert sample_partitions(42, 3, range(100, 150), 5, sampler="python-sequence") == [105, 134, 137, 143, 147]
    with pytest.raises(ValueError, match=r"client-sampling = 'python'; accepted: per-round, python-sequence"):
        sample_partitions(42, 1, range(50), 5, sampler="python")


def test_the_strategy_samples_as_the_setting_says():
    strategy = build_strategy(validate({"client-sampling": "python-sequence", "seed": 42}))
    assert strategy.client_sampling == "python-sequence" and strategy.seed == 42
    with pytest.raises(SettingsError, match="client-sampling"):
        validate({"client-sampling": "python"})
