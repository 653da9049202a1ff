"""NIID-Bench's Dirichlet split with NumPy's legacy generator: ``partitioner = "niid-bench-dirichlet"``.

The FedNolowe authors' code splits MNIST with the label-Dirichlet partition of
NIID-Bench (Li et al. 2022), drawing from NumPy's legacy global generator
seeded with 42 just before (spec ``specs/fednolowe.md`` §6.4). fedweigh's
``dirichlet`` partitioner with ``dirichlet-self-balancing`` follows the same
rule with Flower Datasets' generator, so it gives other clients; this one
draws what the authors' code draws. With ``rng = numpy.random.RandomState(seed)``
(the stream ``numpy.random.seed(seed)`` gives the global generator), ``N``
samples and ``K`` clients, repeated until every client holds at least
``min_size`` samples:

1. every client starts empty;
2. for each class in increasing order: shuffle the class's positions, draw
   ``p ~ Dir(alpha * 1_K)``, set ``p_k = 0`` for every client already holding
   ``N / K`` samples or more, normalise, and cut the shuffled positions at
   ``int(cumsum(p) * |class|)`` (all cut points but the last), piece ``k``
   going to client ``k``; the last client also takes what the truncation
   leaves over, even when it is full.

A client's rows come class by class, in the order drawn (the training
loader shuffles them). The sizes depend only on the class counts and the
seed, so the authors' MNIST client sizes come out exactly (the spec's test
vector); which images of a class a client holds depends on the order of the
train split, which fedweigh shuffles with the run's seed.

Example
-------
>>> import numpy as np
>>> labels = np.repeat(np.arange(3), 20)
>>> parts = niid_bench_dirichlet(labels, 4, alpha=0.5, min_size=5, seed=1)
>>> sorted(np.concatenate(parts).tolist()) == list(range(60)), min(map(len, parts)) >= 5
(True, True)
"""

from __future__ import annotations

import numpy as np

from fedweigh.data.row_partitioner import MAX_DRAWS, check_minimum, no_split


def deal_class(
    positions: np.ndarray, clients: list[list[int]], alpha: float, cap: float, rng: np.random.RandomState
) -> bool:
    """Append one class's positions to the clients' (step 2 above); False when the draw cannot be used.

    Shuffles ``positions`` in place and draws one Dirichlet vector, in that
    order. A draw whose shares of the clients below the cap are all zero
    (tiny ``alpha`` underflows) cannot be normalised: the authors' code
    would cut at NaN; here the whole split is drawn again.
    """
    rng.shuffle(positions)
    shares = rng.dirichlet(np.repeat(alpha, len(clients)))
    shares = shares * np.array([len(held) < cap for held in clients])
    total = shares.sum()
    if not total > 0:
        return False
    cuts = (np.cumsum(shares / total) * len(positions)).astype(int)[:-1]
    for held, piece in zip(clients, np.split(positions, cuts), strict=True):
        held.extend(piece.tolist())
    return True


def niid_bench_dirichlet(
    labels: np.ndarray, num_partitions: int, *, alpha: float, min_size: int, seed: int
) -> list[np.ndarray]:
    """Per client, the ``int64`` positions of its samples, as NIID-Bench's code draws them with ``seed``.

    Raises
    ------
    ValueError
        When ``num_partitions * min_size`` exceeds the samples, or no draw of
        :data:`MAX_DRAWS` gives every client ``min_size`` samples; the message
        names ``min-partition-size``.
    """
    labels = np.asarray(labels)
    check_minimum(len(labels), num_partitions, min_size)
    rng = np.random.RandomState(seed)
    classes = np.unique(labels)
    cap = len(labels) / num_partitions
    for _ in range(MAX_DRAWS):
        clients: list[list[int]] = [[] for _ in range(num_partitions)]
        usable = all(deal_class(np.flatnonzero(labels == label), clients, alpha, cap, rng) for label in classes)
        if usable and min(map(len, clients)) >= min_size:
            return [np.asarray(held, dtype=np.int64) for held in clients]
    raise no_split("niid-bench-dirichlet", min_size, alpha, num_partitions)
