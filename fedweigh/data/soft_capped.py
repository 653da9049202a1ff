"""The FedOUI authors' Dirichlet split: ``partitioner = "soft-capped-dirichlet"``.

The FedOUI experiments (spec ``specs/fedoui.md`` §6 step 1, A13) do not use
the common Dirichlet split. Class by class, each client's Dirichlet share is
multiplied by how far the client is from holding as many samples as the
class has (``|idx_c| - n_k``, clipped at 0), so a client that already holds
much receives less: a *soft* cap, unlike NIID-Bench's hard N/K cap
(``dirichlet-self-balancing``).

With ``rng = numpy.random.default_rng(seed)``, repeated with the same
generator until every client holds at least ``min_size`` samples:

1. for each class ``c`` in increasing order: shuffle the class's positions,
   draw ``p ~ Dir(alpha * 1_K)``, set ``p_k <- max(0, p_k (|idx_c| - n_k))``
   (all ones if every entry is 0), normalise, take ``floor(p |idx_c|)``
   samples per client and give the remainder one each to clients 0, 1, ...,
   in consecutive slices of the shuffled positions;
2. shuffle each client's list.

Rare and noisy clients (:mod:`fedweigh.data.partition_edits`) apply after
it, as in the authors' code. The positions index the train split as
fedweigh holds it (shuffled, then subset, with the run's seed): the split
draws the authors' way, but not on the authors' 3,000 images.

Example
-------
>>> import numpy as np
>>> labels = np.repeat(np.arange(3), 20)
>>> parts = soft_capped_dirichlet(labels, 4, alpha=0.5, min_size=5, seed=1)
>>> sorted(np.concatenate(parts).tolist()) == list(range(60)), min(map(len, parts)) >= 5
(True, True)
"""

from __future__ import annotations

import numpy as np

from fedweigh.data.row_partitioner import MAX_DRAWS, check_minimum, no_split


def class_split(positions: np.ndarray, sizes: np.ndarray, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    """One class's positions divided among the clients, given their sizes so far (step 1 above).

    Shuffles ``positions`` in place with ``rng`` and draws one Dirichlet
    vector from it, in that order.

    Examples
    --------
    >>> import numpy as np
    >>> pieces = class_split(np.arange(10), np.array([0, 0, 10]), 1.0, np.random.default_rng(0))
    >>> [len(piece) for piece in pieces][2]  # a client holding |idx_c| already gets nothing
    0
    """
    rng.shuffle(positions)
    total = len(positions)
    shares = rng.dirichlet(np.full(len(sizes), alpha))
    shares = np.clip(shares * (total - sizes), 0.0, None)
    if shares.sum() <= 0:
        shares = np.ones(len(sizes))
    shares = shares / shares.sum()
    counts = np.floor(shares * total).astype(np.int64)
    counts[: total - int(counts.sum())] += 1
    return np.split(positions, np.cumsum(counts)[:-1])


def soft_capped_dirichlet(
    labels: np.ndarray, num_partitions: int, *, alpha: float, min_size: int, seed: int
) -> list[np.ndarray]:
    """Per client, the ``int64`` positions of its samples (shuffled), as the FedOUI authors split.

    A partition's rows come in this shuffled order (step 2 above), which the
    rare-client cap (:mod:`fedweigh.data.partition_edits`) relies on.

    Raises
    ------
    ValueError
        When ``num_partitions * min_size`` exceeds the samples, or no draw
        of :data:`MAX_DRAWS` gives every client ``min_size`` samples; the
        message names ``min-partition-size``.
    """
    labels = np.asarray(labels)
    check_minimum(len(labels), num_partitions, min_size)
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    for _ in range(MAX_DRAWS):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_partitions)]
        sizes = np.zeros(num_partitions, dtype=np.int64)
        for label in classes:
            positions = np.flatnonzero(labels == label).astype(np.int64)
            for client, piece in enumerate(class_split(positions, sizes, alpha, rng)):
                parts[client].append(piece)
                sizes[client] += len(piece)
        if sizes.min() >= min_size:
            clients = [np.concatenate(pieces) if pieces else np.zeros(0, np.int64) for pieces in parts]
            for positions in clients:
                rng.shuffle(positions)
            return clients
    raise no_split("soft-capped-dirichlet", min_size, alpha, num_partitions)
