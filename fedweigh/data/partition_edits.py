"""Edits applied to the clients' partitions after partitioning: rare clients and noisy clients.

The FedOUI authors' experiments (spec ``specs/fedoui.md`` §6, A9, A10) edit
the partitions in two ways that their paper does not mention but that ran in
every reported experiment:

**Rare clients** (setting ``rare-clients``, a fraction of the clients, and
``rare-client-cap``): ``max(1, round(K * fraction))`` clients, drawn with
``numpy.random.default_rng(seed)``, keep only the first ``cap`` samples of
their partition. The surplus is pooled, shuffled with the same generator and
dealt round-robin to the other clients in id order.

**Noisy clients** (``noisy-clients``, a fraction, and ``label-noise``, a
rate): ``max(1, round(K * fraction))`` further clients, drawn with the same
generator after the rare ones (the two sets may overlap), each get
``round(rate * n_k)`` of their samples relabelled with a class drawn
uniformly from the other ``C - 1`` classes (symmetric label noise), using
``numpy.random.default_rng(seed + client_id + 13)``.

Finally every partition's indices are sorted. The functions are pure: they
take per-partition index lists (positions in the train split) and the split's
labels, and return new ones.

Example
-------
>>> import numpy as np
>>> parts = [np.arange(0, 2), np.arange(2, 8), np.arange(8, 10)]
>>> labels = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
>>> edits = edit_partitions(parts, labels, num_classes=3, seed=1, rare_clients=0.34, rare_client_cap=2)
>>> edits.rare_ids, [p.tolist() for p in edits.partitions][1]
((1,), [2, 3])
>>> [len(p) for p in edits.partitions]  # client 1's surplus of 4 dealt to clients 0 and 2
[4, 2, 4]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

LABEL_NOISE_SEED_OFFSET = 13
"""Client ``k``'s label flips use ``default_rng(seed + k + 13)`` (the authors' choice)."""


@dataclass(frozen=True, eq=False)
class PartitionEdits:
    """Edited partitions and labels.

    Attributes
    ----------
    partitions : list of np.ndarray
        Per client, the sorted ``int64`` positions of its samples in the
        train split.
    labels : np.ndarray
        Labels of the whole train split after the label flips (a new array).
    rare_ids, noisy_ids : tuple of int
        Clients chosen as rare / noisy, sorted.
    """

    partitions: list[np.ndarray]
    labels: np.ndarray
    rare_ids: tuple[int, ...]
    noisy_ids: tuple[int, ...]


def edited_client_count(fraction: float, num_clients: int, setting: str) -> int:
    """``max(1, round(num_clients * fraction))`` for a positive fraction, else 0.

    Examples
    --------
    >>> edited_client_count(0.2, 20, "rare-clients"), edited_client_count(0.01, 20, "rare-clients")
    (4, 1)
    """
    if not (math.isfinite(fraction) and 0.0 <= fraction <= 1.0):
        raise ValueError(f"{setting} = {fraction!r} is invalid: accepted values are fractions in [0, 1]")
    if fraction == 0:
        return 0
    return min(num_clients, max(1, round(num_clients * fraction)))


def cap_rare_clients(
    partitions: Sequence[np.ndarray], rare_ids: Sequence[int], cap: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Truncate the rare clients to ``cap`` samples; deal the surplus to the others.

    Each rare client keeps the first ``cap`` entries of its list. The surplus
    of all rare clients, in client order, is shuffled with ``rng`` and dealt
    round-robin (item ``i`` to the ``i mod M``-th non-rare client, in id
    order). ``rng`` is shuffled once even when there is no surplus.

    Parameters
    ----------
    partitions : sequence of np.ndarray
        Per client, positions of its samples, in the partitioner's order.
    rare_ids : sequence of int
        Clients to truncate; at least one client must stay non-rare.
    cap : int
        Samples a rare client keeps, >= 1.
    rng : np.random.Generator
        Shuffles the surplus.

    Returns
    -------
    list of np.ndarray
        New ``int64`` arrays; every input position appears exactly once.
    """
    if isinstance(cap, bool) or not isinstance(cap, int | np.integer) or cap < 1:
        raise ValueError(f"rare-client-cap = {cap!r} is invalid: accepted values are integers >= 1")
    rare = set(int(i) for i in rare_ids)
    others = [k for k in range(len(partitions)) if k not in rare]
    if not others:
        raise ValueError(
            f"all {len(partitions)} clients are rare: rare-clients must leave one client to take the surplus"
        )
    edited = [np.asarray(part, dtype=np.int64).copy() for part in partitions]
    surplus = []
    for k in sorted(rare):
        surplus.append(edited[k][cap:])
        edited[k] = edited[k][:cap]
    pool = np.concatenate(surplus) if surplus else np.empty(0, dtype=np.int64)
    rng.shuffle(pool)
    for slot, target in enumerate(others):
        edited[target] = np.concatenate([edited[target], pool[slot :: len(others)]])
    return edited


def symmetric_label_flips(
    labels: np.ndarray, positions: np.ndarray, rate: float, num_classes: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Which of a client's samples get a wrong label, and which label.

    ``round(rate * len(positions))`` positions are chosen without
    replacement (from the list in its given order); each gets a label drawn
    uniformly from the ``num_classes - 1`` classes other than its own, in the
    order chosen. Both draws use ``numpy.random.default_rng(seed)``.

    Returns
    -------
    chosen : np.ndarray
        Positions relabelled (``int64``).
    new_labels : np.ndarray
        Their new labels, each different from the old one.

    Examples
    --------
    >>> labels = np.zeros(10, dtype=np.int64)
    >>> chosen, new = symmetric_label_flips(labels, np.arange(10), 0.4, 3, seed=5)
    >>> len(chosen), bool(np.all(new != 0))
    (4, True)
    """
    if not (math.isfinite(rate) and 0.0 <= rate <= 1.0):
        raise ValueError(f"label-noise = {rate!r} is invalid: accepted values are rates in [0, 1]")
    positions = np.asarray(positions, dtype=np.int64)
    count = round(rate * positions.size)
    if count <= 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    if num_classes < 2:
        raise ValueError(f"label noise needs at least 2 classes, got num_classes = {num_classes}")
    rng = np.random.default_rng(seed)
    chosen = rng.choice(positions, size=count, replace=False)
    new_labels = np.empty(count, dtype=np.int64)
    classes = np.arange(num_classes)
    for i, position in enumerate(chosen):
        new_labels[i] = rng.choice(classes[classes != labels[position]])
    return chosen.astype(np.int64), new_labels


def edit_partitions(
    partitions: Sequence[np.ndarray],
    labels: np.ndarray,
    *,
    num_classes: int,
    seed: int,
    rare_clients: float = 0.0,
    rare_client_cap: int = 120,
    noisy_clients: float = 0.0,
    label_noise: float = 0.4,
) -> PartitionEdits:
    """Apply the rare-client and noisy-client edits, then sort each partition.

    With both fractions 0 only the sorting happens (callers skip the call
    then, to keep the partitioner's order).

    Parameters
    ----------
    partitions : sequence of np.ndarray
        Per client, positions of its samples in the train split (disjoint).
    labels : np.ndarray
        Labels of the whole train split, integers in ``[0, num_classes)``.
    num_classes : int
        Number of classes of the dataset.
    seed : int
        The run seed.
    rare_clients, rare_client_cap, noisy_clients, label_noise
        The settings of the same names (see the module docstring).

    Returns
    -------
    PartitionEdits

    Raises
    ------
    ValueError
        Naming the setting, on a fraction or rate outside ``[0, 1]``, a cap
        below 1, every client rare, or labels outside ``[0, num_classes)``.
    """
    labels = np.asarray(labels, dtype=np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got values {labels.min()}..{labels.max()}")
    num_clients = len(partitions)
    edited = [np.asarray(part, dtype=np.int64) for part in partitions]
    rng = np.random.default_rng(seed)

    rare_count = edited_client_count(rare_clients, num_clients, "rare-clients")
    rare_ids: tuple[int, ...] = ()
    if rare_count and rare_count >= num_clients:
        raise ValueError(
            f"rare-clients = {rare_clients!r} makes all {num_clients} clients rare; accepted: a fraction that "
            "leaves at least one client to take the surplus"
        )
    if rare_count:
        rare_ids = tuple(sorted(int(k) for k in rng.choice(num_clients, size=rare_count, replace=False)))
        edited = cap_rare_clients(edited, rare_ids, rare_client_cap, rng)

    noisy_count = edited_client_count(noisy_clients, num_clients, "noisy-clients")
    if not (math.isfinite(label_noise) and 0.0 <= label_noise <= 1.0):
        raise ValueError(f"label-noise = {label_noise!r} is invalid: accepted values are rates in [0, 1]")
    noisy_ids: tuple[int, ...] = ()
    new_labels = labels.copy()
    if noisy_count and label_noise > 0:
        noisy_ids = tuple(sorted(int(k) for k in rng.choice(num_clients, size=noisy_count, replace=False)))
        for k in noisy_ids:
            chosen, flipped = symmetric_label_flips(
                labels, edited[k], label_noise, num_classes, seed + k + LABEL_NOISE_SEED_OFFSET
            )
            new_labels[chosen] = flipped

    return PartitionEdits([np.sort(part) for part in edited], new_labels, rare_ids, noisy_ids)
