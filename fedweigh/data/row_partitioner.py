"""A Flower Datasets partitioner whose partitions are lists of rows, worked out once.

:class:`RowPartitioner` is the common part of fedweigh's own partitioners
(:mod:`fedweigh.data.top_up`, :mod:`fedweigh.data.soft_capped`): a subclass
says how to divide the bound dataset's rows (:meth:`RowPartitioner.divide`);
the division runs on the first :meth:`~RowPartitioner.load_partition` and
every partition is the dataset's rows in the order the division gives.
"""

from __future__ import annotations

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
