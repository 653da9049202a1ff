"""Rare and noisy clients: the FedOUI authors' partition edits (spec fedoui §6)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedweigh.data.partition_edits import cap_rare_clients, edit_partitions, edited_client_count, symmetric_label_flips

NUM_CLASSES = 10


def random_federation(seed: int, num_clients: int = 20, size: int = 3000) -> tuple[list[np.ndarray], np.ndarray]:
    """Uneven disjoint partitions of ``size`` samples, in shuffled order, and their labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, NUM_CLASSES, size=size)
    order = rng.permutation(size)
    cuts = np.sort(rng.choice(np.arange(1, size), size=num_clients - 1, replace=False))
    return list(np.split(order, cuts)), labels


def reference_edits(partitions, labels, seed, rare_fraction, cap, noisy_fraction, rate):
    """The spec's §6 steps 2-4, written out as plainly as possible."""
    clients = [list(map(int, part)) for part in partitions]
    labels = np.array(labels)
    num_clients = len(clients)
    rng = np.random.default_rng(seed)
    if rare_fraction > 0:
        rare = set(rng.choice(num_clients, size=max(1, round(num_clients * rare_fraction)), replace=False).tolist())
        pool = []
        for k in range(num_clients):
            if k in rare and len(clients[k]) > cap:
                pool.extend(clients[k][cap:])
                clients[k] = clients[k][:cap]
        rng.shuffle(pool)
        normal = [k for k in range(num_clients) if k not in rare]
        for i, item in enumerate(pool):
            clients[normal[i % len(normal)]].append(item)
    noisy_labels = labels.copy()
    if noisy_fraction > 0 and rate > 0:
        noisy = rng.choice(num_clients, size=max(1, round(num_clients * noisy_fraction)), replace=False).tolist()
        for k in noisy:
            flips = np.random.default_rng(seed + k + 13)
            chosen = flips.choice(clients[k], size=round(len(clients[k]) * rate), replace=False)
            for index in chosen:
                others = [c for c in range(NUM_CLASSES) if c != labels[index]]
                noisy_labels[index] = others[flips.choice(len(others))]
    return [sorted(c) for c in clients], noisy_labels


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 10_000),
    st.sampled_from([0.0, 0.1, 0.2, 0.5]),
    st.integers(1, 300),
    st.sampled_from([0.0, 0.2, 0.35]),
    st.sampled_from([0.0, 0.4, 1.0]),
)
def test_matches_the_spec_procedure(seed, rare, cap, noisy, rate):
    partitions, labels = random_federation(seed)
    edits = edit_partitions(
        partitions,
        labels,
        num_classes=NUM_CLASSES,
        seed=seed,
        rare_clients=rare,
        rare_client_cap=cap,
        noisy_clients=noisy,
        label_noise=rate,
    )
    expected_partitions, expected_labels = reference_edits(partitions, labels, seed, rare, cap, noisy, rate)
    assert [p.tolist() for p in edits.partitions] == expected_partitions
    np.testing.assert_array_equal(edits.labels, expected_labels)


def test_paper_setting_rare_clients_are_the_first_draw_of_a_fresh_generator():
    partitions, labels = random_federation(3)
    edits = edit_partitions(
        partitions, labels, num_classes=NUM_CLASSES, seed=3, rare_clients=0.2, noisy_clients=0.2, label_noise=0.4
    )
    assert edits.rare_ids == tuple(sorted(np.random.default_rng(3).choice(20, size=4, replace=False).tolist()))
    assert len(edits.noisy_ids) == 4
    for k in edits.rare_ids:
        assert len(edits.partitions[k]) == min(120, len(partitions[k]))
        # a rare client keeps the first 120 samples of its list
        assert set(edits.partitions[k].tolist()) == set(partitions[k][:120].tolist())


def test_every_sample_is_kept_exactly_once_and_the_surplus_is_dealt_evenly():
    partitions, labels = random_federation(5)
    edits = edit_partitions(partitions, labels, num_classes=NUM_CLASSES, seed=5, rare_clients=0.2, rare_client_cap=50)
    everything = np.concatenate(edits.partitions)
    assert len(everything) == 3000 and len(np.unique(everything)) == 3000
    received = [len(edits.partitions[k]) - len(partitions[k]) for k in range(20) if k not in edits.rare_ids]
    assert max(received) - min(received) <= 1 and min(received) >= 0
    assert all(np.all(np.diff(p) > 0) for p in edits.partitions)  # sorted
    np.testing.assert_array_equal(edits.labels, labels)  # no noisy clients, no flips


def test_noisy_clients_get_the_flip_rate_and_only_wrong_labels():
    partitions, labels = random_federation(7)
    edits = edit_partitions(partitions, labels, num_classes=NUM_CLASSES, seed=7, noisy_clients=0.2, label_noise=0.4)
    changed = edits.labels != labels
    for k in range(20):
        flipped = int(changed[edits.partitions[k]].sum())
        expected = round(0.4 * len(partitions[k])) if k in edits.noisy_ids else 0
        assert flipped == expected
    assert edits.rare_ids == ()
    # symmetric noise: the new labels cover the other classes
    new = edits.labels[changed]
    assert set(new.tolist()) == set(range(NUM_CLASSES))
    assert not np.any(new == labels[changed])


def test_label_flips_are_seeded_and_never_keep_the_label():
    labels = np.arange(100) % 3
    first = symmetric_label_flips(labels, np.arange(100), 0.5, 3, seed=2)
    again = symmetric_label_flips(labels, np.arange(100), 0.5, 3, seed=2)
    other = symmetric_label_flips(labels, np.arange(100), 0.5, 3, seed=4)
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    assert not np.array_equal(first[0], other[0])
    assert len(first[0]) == 50 and len(np.unique(first[0])) == 50
    assert not np.any(first[1] == labels[first[0]])
    assert len(symmetric_label_flips(labels, np.arange(3), 0.1, 3, seed=2)[0]) == 0  # round(0.3) = 0


def test_zero_fractions_only_sort():
    partitions, labels = random_federation(1)
    edits = edit_partitions(partitions, labels, num_classes=NUM_CLASSES, seed=1)
    assert [p.tolist() for p in edits.partitions] == [sorted(p.tolist()) for p in partitions]
    assert edits.rare_ids == edits.noisy_ids == ()


def test_inputs_are_not_modified():
    partitions, labels = random_federation(2)
    before = [p.copy() for p in partitions], labels.copy()
    edit_partitions(
        partitions, labels, num_classes=NUM_CLASSES, seed=2, rare_clients=0.3, noisy_clients=0.3, label_noise=0.5
    )
    assert all(np.array_equal(a, b) for a, b in zip(partitions, before[0], strict=True))
    np.testing.assert_array_equal(labels, before[1])


def test_client_counts():
    assert edited_client_count(0.2, 20, "rare-clients") == 4
    assert edited_client_count(0.0, 20, "rare-clients") == 0
    assert edited_client_count(0.01, 20, "rare-clients") == 1  # a positive fraction edits at least one client
    assert edited_client_count(1.0, 3, "noisy-clients") == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rare_clients": 1.5}, "rare-clients = 1.5"),
        ({"noisy_clients": -0.1}, "noisy-clients = -0.1"),
        ({"noisy_clients": 0.2, "label_noise": 2.0}, "label-noise = 2.0"),
        ({"rare_clients": 0.2, "rare_client_cap": 0}, "rare-client-cap = 0"),
        ({"rare_clients": 1.0}, "rare-clients = 1.0 makes all 4 clients rare"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    partitions, labels = random_federation(1, num_clients=4, size=100)
    with pytest.raises(ValueError, match=message):
        edit_partitions(partitions, labels, num_classes=NUM_CLASSES, seed=1, **kwargs)


def test_labels_outside_the_classes_are_rejected():
    with pytest.raises(ValueError, match="labels must lie in"):
        edit_partitions([np.arange(3)], np.array([0, 1, 12]), num_classes=10, seed=1)


def test_cap_without_surplus_still_draws_one_shuffle():
    rng_a, rng_b = np.random.default_rng(0), np.random.default_rng(0)
    result = cap_rare_clients([np.arange(3), np.arange(3, 5)], [0], 10, rng_a)
    assert [p.tolist() for p in result] == [[0, 1, 2], [3, 4]]
    rng_b.shuffle(np.empty(0, dtype=np.int64))
    assert rng_a.integers(1_000_000) == rng_b.integers(1_000_000)


# ---------------------------------------------------------------------------
# wired into the data layer
# ---------------------------------------------------------------------------


def test_data_layer_applies_the_edits_before_decoding():
    from fedweigh.data.federated import DataSpec, load_partition, partition_sizes

    clean = DataSpec(dataset="digits", partitioner="iid", num_partitions=5, seed=2)
    edited = DataSpec(
        dataset="digits",
        partitioner="iid",
        num_partitions=5,
        seed=2,
        rare_clients=0.2,
        rare_client_cap=50,
        noisy_clients=0.4,
        label_noise=0.5,
    )
    assert clean != edited and hash(clean) != hash(edited)  # separate cache entries
    sizes = partition_sizes(edited)
    assert sum(sizes) == sum(partition_sizes(clean)) == 1437
    [rare] = [k for k in range(5) if sizes[k] == 50]
    assert rare == int(np.random.default_rng(2).choice(5, size=1, replace=False)[0])

    clean_label = {}
    for k in range(5):
        data = load_partition(clean, k)
        for image, label in zip(data.images, data.labels.tolist(), strict=True):
            clean_label.setdefault(image.numpy().tobytes(), set()).add(label)
    flipped = []
    for k in range(5):
        data = load_partition(edited, k)
        assert len(data) == sizes[k]
        flipped.append(
            sum(
                label not in clean_label[image.numpy().tobytes()]
                for image, label in zip(data.images, data.labels.tolist(), strict=True)
            )
        )
    # two noisy clients with half their labels flipped; the others untouched
    assert sorted(f for f in flipped if f) == sorted(round(0.5 * n) for n, f in zip(sizes, flipped, strict=True) if f)
    assert sum(1 for f in flipped if f) == 2
