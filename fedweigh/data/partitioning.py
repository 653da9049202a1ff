"""How the train split is divided among clients: the ``partitioner`` setting.

Six kinds, each a Flower Datasets partitioner:

``"iid"``
    :class:`~flwr_datasets.partitioner.IidPartitioner`: equal contiguous
    chunks of the (already shuffled) train split.
``"dirichlet"``
    :class:`~flwr_datasets.partitioner.DirichletPartitioner`: each class is
    divided among the clients in proportions drawn from Dirichlet(alpha);
    the smaller ``dirichlet_alpha``, the stronger the label skew. With
    ``self_balancing`` a client stops receiving samples once it holds more
    than N/K (as NIID-Bench's and FLood's code do). ``min_partition_size`` is
    reached by drawing again (up to 10 times); with ``top_up``, when that
    fails, by a seeded top-up of one draw (:mod:`fedweigh.data.top_up`).
``"soft-capped-dirichlet"``
    The FedOUI authors' Dirichlet split
    (:mod:`fedweigh.data.soft_capped`): a client's share of each class
    shrinks as it fills up; ``min_partition_size`` by drawing again.
``"niid-bench-dirichlet"``
    NIID-Bench's Dirichlet split drawn with NumPy's legacy generator, as
    the FedNolowe authors' code draws it (:mod:`fedweigh.data.niid_bench`):
    a client holding N/K samples gets no more; ``min_partition_size`` by
    drawing again.
``"pathological"``
    :class:`~flwr_datasets.partitioner.PathologicalPartitioner`: each client
    holds exactly ``classes_per_client`` classes. Class ``i mod K`` goes to
    client ``i`` first ("first-deterministic", as in Li et al. 2022, so every
    class is used once there are at least K clients), the rest at random.
``"shard"``
    :class:`~flwr_datasets.partitioner.ShardPartitioner`: the split sorted
    by label is cut into ``num_partitions * shards_per_client`` equal shards
    and each client gets ``shards_per_client`` of them at random (McMahan et
    al. 2017). Equal shards leave out the remainder of that division, at
    most ``num_partitions * shards_per_client - 1`` samples.

Every random choice is seeded by ``seed``: the same settings give the same
partitions.

Example
-------
>>> build_partitioner("iid", 10, seed=1, dirichlet_alpha=0.5, classes_per_client=2,
...                   shards_per_client=2, min_partition_size=0).num_partitions
10
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedweigh.settings import PARTITIONERS

if TYPE_CHECKING:
    from flwr_datasets.partitioner import Partitioner


def build_partitioner(
    kind: str,
    num_partitions: int,
    *,
    seed: int,
    dirichlet_alpha: float,
    classes_per_client: int,
    shards_per_client: int,
    min_partition_size: int,
    label_column: str = "label",
    self_balancing: bool = False,
    top_up: bool = False,
) -> Partitioner:
    """A fresh partitioner of the given kind, not yet bound to a dataset.

    Parameters
    ----------
    kind : {"iid", "dirichlet", "soft-capped-dirichlet", "niid-bench-dirichlet", "pathological", "shard"}
        See the module docstring.
    num_partitions : int
        Number of clients.
    seed : int
        Seeds every random choice of the partitioner.
    dirichlet_alpha : float
        Concentration of the Dirichlet distribution (the Dirichlet kinds).
    classes_per_client : int
        Classes per client (``"pathological"`` only).
    shards_per_client : int
        Shards per client (``"shard"`` only).
    min_partition_size : int
        Smallest acceptable client (the Dirichlet kinds): the Dirichlet
        draw is repeated, up to 10 times (fedweigh's own two: 1,000), until
        every client has this many samples.
    label_column : str
        Column holding the labels that non-IID partitioners divide by.
    self_balancing : bool
        ``"dirichlet"`` only: a client full beyond N/K gets no more samples.
    top_up : bool
        ``"dirichlet"`` only: reach ``min_partition_size`` by a seeded top-up
        when the repeated draws cannot (:class:`~fedweigh.data.top_up.MinimumSizeTopUp`).

    Raises
    ------
    ValueError
        For an unknown ``kind``, naming the setting ``partitioner``, the value
        and the accepted kinds; or for a non-positive ``num_partitions``.

    Examples
    --------
    >>> build_partitioner("uniform", 10, seed=1, dirichlet_alpha=0.5, classes_per_client=2,
    ...                   shards_per_client=2, min_partition_size=0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: invalid setting partitioner = 'uniform'; accepted: iid, dirichlet, soft-capped-dirichlet, ...
    """
    if kind not in PARTITIONERS:
        raise ValueError(f"invalid setting partitioner = {kind!r}; accepted: {', '.join(PARTITIONERS)}")
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be at least 1, got {num_partitions}")
    # Imported here, not at module level: importing any part of flwr_datasets
    # runs its package __init__, which imports matplotlib, seaborn and
    # scipy.stats (over a second) for its plotting helpers.
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        PathologicalPartitioner,
        ShardPartitioner,
    )

    from fedweigh.data.niid_bench import niid_bench_dirichlet
    from fedweigh.data.row_partitioner import LabelSplitPartitioner
    from fedweigh.data.soft_capped import soft_capped_dirichlet
    from fedweigh.data.top_up import MinimumSizeTopUp

    if kind == "iid":
        return IidPartitioner(num_partitions=num_partitions)
    if kind == "dirichlet":

        def dirichlet(minimum: int) -> Partitioner:
            return DirichletPartitioner(
                num_partitions=num_partitions,
                partition_by=label_column,
                alpha=dirichlet_alpha,
                min_partition_size=minimum,
                self_balancing=self_balancing,
                shuffle=True,
                seed=seed,
            )

        if top_up and min_partition_size > 0:
            return MinimumSizeTopUp(
                dirichlet(min_partition_size), dirichlet(0), num_partitions, min_partition_size, seed
            )
        return dirichlet(min_partition_size)
    if kind in ("soft-capped-dirichlet", "niid-bench-dirichlet"):
        split = soft_capped_dirichlet if kind == "soft-capped-dirichlet" else niid_bench_dirichlet
        return LabelSplitPartitioner(
            split,
            num_partitions,
            partition_by=label_column,
            alpha=dirichlet_alpha,
            min_partition_size=min_partition_size,
            seed=seed,
        )
    if kind == "pathological":
        return PathologicalPartitioner(
            num_partitions=num_partitions,
            partition_by=label_column,
            num_classes_per_partition=classes_per_client,
            class_assignment_mode="first-deterministic",
            shuffle=True,
            seed=seed,
        )
    return ShardPartitioner(
        num_partitions=num_partitions,
        partition_by=label_column,
        num_shards_per_partition=shards_per_client,
        shuffle=True,
        seed=seed,
    )


def partition_row_counts(partitioner: Partitioner) -> list[int]:
    """Number of rows of every partition of a partitioner bound to its dataset.

    Without building a dataset per partition where the sizes are known
    otherwise: :class:`~flwr_datasets.partitioner.IidPartitioner`'s
    contiguous chunks (the first ``N mod K`` hold one row more, as the
    datasets library's ``shard`` cuts them) and fedweigh's row partitioners.
    Loading each partition costs about 2 ms, 20 s for 10,000 clients.
    """
    from flwr_datasets.partitioner import IidPartitioner

    from fedweigh.data.row_partitioner import RowPartitioner

    count = partitioner.num_partitions
    if isinstance(partitioner, IidPartitioner):
        chunk, larger = divmod(partitioner.dataset.num_rows, count)
        return [chunk + (1 if pid < larger else 0) for pid in range(count)]
    if isinstance(partitioner, RowPartitioner):
        return [len(rows) for rows in partitioner.rows()]
    return [partitioner.load_partition(pid).num_rows for pid in range(count)]
