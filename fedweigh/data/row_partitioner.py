"""A Flower Datasets partitioner whose partitions are lists of rows, worked out once.

:class:`RowPartitioner` is the common part of fedweigh's own partitioners
(:mod:`fedweigh.data.top_up`, :mod:`fedweigh.data.soft_capped`,
:mod:`fedweigh.data.niid_bench`): a subclass says how to divide the bound
dataset's rows (:meth:`RowPartitioner.divide`); the division runs on the
first :meth:`~RowPartitioner.load_partition` and every partition is the
dataset's rows in the order the division gives. :class:`LabelSplitPartitioner`
runs a function of the label column (the two authors' Dirichlet splits), which
draw until every client holds ``min_size`` samples, up to :data:`MAX_DRAWS`
times, and refuse the same impossible settings with the same messages
(:func:`check_minimum`, :func:`no_split`).
"""

from __future__ import annotations

from collections.abc import Callable

import datasets
import numpy as np
from flwr_datasets.partitioner import Partitioner


class RowPartitioner(Partitioner):
    """Partitions given as row positions of the bound dataset (subclasses implement :meth:`divide`)."""

    def __init__(self, num_partitions: int) -> None:
        super().__init__()
        self._num_partitions = num_partitions
        self._rows: list[np.ndarray] | None = None

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    def divide(self) -> list[np.ndarray]:
        """Per partition, the positions of its rows in ``self.dataset``."""
        raise NotImplementedError

    def rows(self) -> list[np.ndarray]:
        """Per partition, its row positions (the division runs once, on the first call)."""
        if self._rows is None:
            self._rows = self.divide()
        return self._rows

    def load_partition(self, partition_id: int) -> datasets.Dataset:
        """Partition ``partition_id``."""
        return self.dataset.select(self.rows()[partition_id])


MAX_DRAWS = 1000
"""Draws a label split tries before giving up on ``min_size`` (the authors' loops have no limit)."""

LabelSplit = Callable[..., list[np.ndarray]]
"""``split(labels, num_partitions, *, alpha, min_size, seed)``: per client, the positions of its samples."""


def check_minimum(num_samples: int, num_partitions: int, min_size: int) -> None:
    """Refuse a split that cannot give ``num_partitions`` clients ``min_size`` samples each, naming the setting."""
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be at least 1, got {num_partitions}")
    if num_partitions * min_size > num_samples:
        raise ValueError(
            f"min-partition-size = {min_size} for {num_partitions} clients needs {num_partitions * min_size} "
            f"samples; the train split has {num_samples}; accepted: at most {num_samples // num_partitions}"
        )


def no_split(partitioner: str, min_size: int, alpha: float, num_partitions: int) -> ValueError:
    """The error of a split whose :data:`MAX_DRAWS` draws all left a client below ``min_size``."""
    return ValueError(
        f"partitioner = {partitioner!r} found no split with min-partition-size = {min_size} in "
        f"{MAX_DRAWS} draws (dirichlet-alpha = {alpha}, {num_partitions} clients); accepted: a smaller "
        "min-partition-size or a larger dirichlet-alpha"
    )


class LabelSplitPartitioner(RowPartitioner):
    """A Flower Datasets partitioner running a :data:`LabelSplit` on the bound dataset's label column."""

    def __init__(
        self,
        split: LabelSplit,
        num_partitions: int,
        *,
        partition_by: str,
        alpha: float,
        min_partition_size: int,
        seed: int,
    ) -> None:
        super().__init__(num_partitions)
        self.split = split
        self.partition_by = partition_by
        self.alpha = alpha
        self.min_partition_size = min_partition_size
        self.seed = seed

    def divide(self) -> list[np.ndarray]:
        labels = np.asarray(self.dataset[self.partition_by])
        return self.split(
            labels, self.num_partitions, alpha=self.alpha, min_size=self.min_partition_size, seed=self.seed
        )
