"""A minimum partition size reached by a seeded top-up, where rejection sampling cannot reach it.

Flower Datasets' :class:`~flwr_datasets.partitioner.DirichletPartitioner`
reaches ``min_partition_size`` by drawing again, up to 10 times, and then
gives up. With many clients and a small concentration (Feddle's 500 clients
at Dirichlet 0.1 with at least 10 samples each) it cannot succeed: most
draws leave some client with a handful of samples.
:class:`MinimumSizeTopUp` first lets its partitioner try as usual; only if
that fails does it take a draw of a second partitioner without the minimum
and move samples into the partitions below it, each time from the partition
that is then the largest, picked at random (seeded) and never leaving the
donor below the minimum.

This is a **deviation** from a pure Dirichlet split: the donors' label
proportions change slightly (by at most ``min_partition_size`` samples per
topped-up client) and the small clients receive samples of the large
clients' classes. :attr:`MinimumSizeTopUp.moved` says how many samples moved
(0 when rejection sampling succeeded).

Example
-------
>>> import numpy as np
>>> parts, moved = top_up([np.arange(90), np.arange(90, 96), np.arange(96, 100)], 10, np.random.default_rng(1))
>>> [len(part) for part in parts], moved
([80, 10, 10], 10)
"""

from __future__ import annotations

import warnings

import numpy as np
from flwr_datasets.partitioner import Partitioner

from fedweigh.data.row_partitioner import RowPartitioner

ROW_COLUMN = "__fedweigh_row__"
"""Temporary column carrying each sample's row number through the wrapped partitioner."""


class MinimumSizeTopUp(RowPartitioner):
    """``first``'s partitions if it can build them; else ``fallback``'s, topped up to the minimum.

    Parameters
    ----------
    first : Partitioner
        Tried first (typically a Dirichlet partitioner with the minimum size).
    fallback : Partitioner
        Used when ``first`` raises ``ValueError`` (the same partitioner
        without the minimum).
    num_partitions : int
        The number of partitions of both.
    min_partition_size : int
        Every partition ends with at least this many samples.
    seed : int
        Seeds which samples move.
    """

    def __init__(
        self, first: Partitioner, fallback: Partitioner, num_partitions: int, min_partition_size: int, seed: int
    ) -> None:
        super().__init__(num_partitions)
        self.first = first
        self.fallback = fallback
        self.min_partition_size = min_partition_size
        self.seed = seed
        self.moved = 0

    def _rows_of(self, partitioner: Partitioner) -> list[np.ndarray]:
        partitioner.dataset = self.dataset.add_column(ROW_COLUMN, np.arange(self.dataset.num_rows))
        return [np.asarray(partitioner.load_partition(k)[ROW_COLUMN]) for k in range(self.num_partitions)]

    def divide(self) -> list[np.ndarray]:
        total, needed = self.dataset.num_rows, self.num_partitions * self.min_partition_size
        if needed > total:
            raise ValueError(
                f"{self.num_partitions} partitions of at least {self.min_partition_size} samples need {needed} "
                f"samples; the data has {total}"
            )
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Flower warns at every rejected draw
                return self._rows_of(self.first)
        except ValueError:
            pass
        rows = self._rows_of(self.fallback)
        rows, self.moved = top_up(rows, self.min_partition_size, np.random.default_rng([self.seed, 17]))
        return rows


def top_up(rows: list[np.ndarray], min_size: int, rng: np.random.Generator) -> tuple[list[np.ndarray], int]:
    """Move samples into every partition below ``min_size`` from the currently largest ones.

    Partitions are topped up smallest first (ties: lower index first); each
    move takes as many samples as are needed, or as the largest partition can
    give without falling below ``min_size``, chosen at random. Returns the new
    partitions and the number of samples moved.

    Examples
    --------
    >>> parts, moved = top_up([np.arange(8), np.array([8]), np.array([9])], 3, np.random.default_rng(0))
    >>> [len(p) for p in parts], moved
    ([4, 3, 3], 4)
    """
    parts = [np.asarray(part) for part in rows]
    moved = 0
    for index in sorted(range(len(parts)), key=lambda k: (len(parts[k]), k)):
        while (need := min_size - len(parts[index])) > 0:
            donor = max(range(len(parts)), key=lambda k: (len(parts[k]), -k))
            spare = len(parts[donor]) - min_size
            if donor == index or spare <= 0:
                raise ValueError(f"cannot give every partition {min_size} samples")
            take = rng.choice(len(parts[donor]), size=min(need, spare), replace=False)
            keep = np.ones(len(parts[donor]), dtype=bool)
            keep[take] = False
            parts[index] = np.concatenate([parts[index], parts[donor][take]])
            parts[donor] = parts[donor][keep]
            moved += len(take)
    return parts, moved
