"""The data entry points of the apps: a client's partition, the test split.

Everything here is cached per process and keyed by a frozen :class:`DataSpec`:
a simulation worker or a SuperNode loads and partitions the dataset once and
decodes each partition once, not once per message. The cached tensors are
shared by every caller; do not modify them in place.

Pipeline, for a Hub id or a local parquet folder (through
:class:`flwr_datasets.FederatedDataset`):

1. load the ``train`` and ``test`` splits;
2. shuffle both with ``seed``;
3. optionally keep a random ``train_subset`` / ``test_subset`` of them
   (a seeded preprocessor; 0 keeps everything);
4. partition ``train`` with the ``partitioner`` setting, seeded by ``seed``;
5. optionally cap rare clients and flip noisy clients' labels
   (:mod:`fedweigh.data.partition_edits`; off unless ``rare_clients`` or
   ``noisy_clients`` is positive).

The digits go through the same steps in memory (the partitioner is bound to
the dataset directly). For a Hub id, the first load downloads the dataset
into the Hugging Face cache; for a local folder it builds an Arrow cache of
the parquet files (set ``HF_HOME`` to choose where).

Example
-------
>>> spec = DataSpec(dataset="digits", partitioner="iid", num_partitions=4, seed=1)
>>> sum(partition_sizes(spec)), len(load_test_split(spec))
(1437, 360)
>>> load_partition(spec, 0).images.shape
torch.Size([360, 1, 8, 8])
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import datasets
import numpy as np
import torch

from fedweigh.data.description import DatasetInfo, describe, feature_stats, pixel_moments
from fedweigh.data.files import split_columns
from fedweigh.data.partition_edits import PartitionEdits, edit_partitions
from fedweigh.data.partitioning import PARTITIONERS, build_partitioner, partition_row_counts
from fedweigh.data.sources import (
    load_digits,
    load_train_split,
    resolve_source,
    split_location,
    validate_dataset_setting,
)
from fedweigh.data.tensors import ImageTensors, decode_images, decode_labels, to_image_tensors

if TYPE_CHECKING:
    from flwr_datasets.partitioner import Partitioner

# One lock for all the caches: a second thread asking for the same data waits
# for the first to finish loading it instead of loading it again.
_LOCK = threading.RLock()


@dataclass(frozen=True)
class DataSpec:
    """Everything that determines the clients' data; hashable, so it keys the caches.

    Attributes
    ----------
    dataset : str
        ``"digits"``, a folder with ``train.parquet`` and ``test.parquet``, or
        a Hub id ``owner/name`` (see :mod:`fedweigh.data.sources`); stored in
        its canonical form (folders as absolute paths).
    partitioner : str
        ``"iid"``, ``"dirichlet"``, ``"pathological"`` or ``"shard"``
        (see :mod:`fedweigh.data.partitioning`).
    num_partitions : int
        Number of clients.
    seed : int
        Seeds the shuffle, the subsets, the partitioner and the partition
        edits (the run's ``partition-seed``, or its ``seed``).
    dirichlet_alpha, dirichlet_self_balancing, classes_per_client, shards_per_client
        Parameters of the partitioners (see :mod:`fedweigh.data.partitioning`).
    min_partition_size, partition_top_up
        Smallest client, and whether a seeded top-up reaches it when the
        Dirichlet draws cannot.
    train_subset, test_subset : int
        Keep only this many random train (before partitioning) and test
        images; 0 keeps all.
    rare_clients, rare_client_cap, noisy_clients, label_noise
        Partition edits of the FedOUI experiments (see
        :mod:`fedweigh.data.partition_edits`); fractions of 0 edit nothing.
    """

    dataset: str = "digits"
    partitioner: str = "dirichlet"
    num_partitions: int = 10
    seed: int = 1
    dirichlet_alpha: float = 0.5
    dirichlet_self_balancing: bool = False
    classes_per_client: int = 2
    shards_per_client: int = 2
    min_partition_size: int = 0
    partition_top_up: bool = False
    train_subset: int = 0
    test_subset: int = 0
    rare_clients: float = 0.0
    rare_client_cap: int = 120
    noisy_clients: float = 0.0
    label_noise: float = 0.4

    def __post_init__(self) -> None:
        # The run settings check every value (fedweigh.settings); here only what keys the caches.
        object.__setattr__(self, "dataset", validate_dataset_setting(self.dataset))
        if self.partitioner not in PARTITIONERS:
            raise ValueError(f"invalid setting partitioner = {self.partitioner!r}; accepted: {', '.join(PARTITIONERS)}")

    @property
    def edits_partitions(self) -> bool:
        """Whether rare-client or noisy-client edits apply."""
        return self.rare_clients > 0 or (self.noisy_clients > 0 and self.label_noise > 0)


@dataclass(frozen=True)
class SubsetSplits:
    """Preprocessor keeping a seeded random subset of the train and test splits.

    Parameters
    ----------
    train_size, test_size : int
        Images to keep from ``train`` / ``test``; 0 keeps the whole split.
    seed : int
        The two draws use independent streams of this seed, so the test
        subset does not depend on ``train_size``.

    Examples
    --------
    >>> splits = SubsetSplits(100, 50, seed=1)(load_digits())
    >>> splits["train"].num_rows, splits["test"].num_rows
    (100, 50)
    """

    train_size: int
    test_size: int
    seed: int

    def __call__(self, splits: datasets.DatasetDict) -> datasets.DatasetDict:
        kept = dict(splits)
        for stream, (name, size) in enumerate((("train", self.train_size), ("test", self.test_size))):
            if size == 0:
                continue
            if name not in splits:
                raise ValueError(f"the dataset has no {name!r} split (splits: {list(splits)})")
            available = splits[name].num_rows
            if size > available:
                raise ValueError(
                    f"{name}-subset = {size} exceeds the {available} images of the {name} split; "
                    f"accepted: 0 (all) to {available}"
                )
            rows = np.random.default_rng([self.seed, stream]).choice(available, size=size, replace=False)
            kept[name] = splits[name].select(rows)
        return datasets.DatasetDict(kept)


@dataclass(frozen=True, eq=False)
class _Federation:
    partitioner: Partitioner  # bound to the (shuffled, subset) train split
    test: datasets.Dataset


def dataset_info(dataset: str) -> DatasetInfo:
    """Classes, channels, size, normalisation and columns of a dataset (cached).

    The first call for an unknown dataset computes its normalisation from its
    train split (see :func:`fedweigh.data.description.describe`).

    Examples
    --------
    >>> dataset_info("digits").image_size
    8
    """
    return _dataset_info(validate_dataset_setting(dataset))


@functools.cache
def _dataset_info(dataset: str) -> DatasetInfo:
    return describe(resolve_source(dataset))


def feature_normalization(dataset: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std of every pixel of a dataset's train split, ``[C, H, W]`` float32 (``normalization = 'feature'``).

    Fitted on the whole train split (:func:`fedweigh.data.description.feature_stats`),
    as the UFL spec's Target B standardises the digits; cached.

    >>> mean, std = feature_normalization("digits")
    >>> mean.shape, bool((std > 0).all())
    (torch.Size([1, 8, 8]), True)
    """
    return _feature_normalization(validate_dataset_setting(dataset))


@functools.cache
def _feature_normalization(dataset: str) -> tuple[torch.Tensor, torch.Tensor]:
    info = _dataset_info(dataset)
    train = load_train_split(resolve_source(dataset))
    moments = pixel_moments(train, info.image_column, channels=info.in_channels, image_size=info.image_size)
    mean, std = feature_stats(moments)
    return torch.from_numpy(mean).float(), torch.from_numpy(std).float()


@functools.cache
def _federation(spec: DataSpec) -> _Federation:
    source = resolve_source(spec.dataset)
    info = _dataset_info(spec.dataset)
    partitioner = build_partitioner(
        spec.partitioner,
        spec.num_partitions,
        seed=spec.seed,
        dirichlet_alpha=spec.dirichlet_alpha,
        classes_per_client=spec.classes_per_client,
        shards_per_client=spec.shards_per_client,
        min_partition_size=spec.min_partition_size,
        label_column=info.label_column,
        self_balancing=spec.dirichlet_self_balancing,
        top_up=spec.partition_top_up,
    )
    subsets = SubsetSplits(spec.train_subset, spec.test_subset, spec.seed)
    if source.kind == "digits":
        splits = subsets(load_digits().shuffle(seed=spec.seed))
        partitioner.dataset = splits["train"]
        return _Federation(partitioner, splits["test"])
    from flwr_datasets import FederatedDataset  # lazily, like the partitioners (see build_partitioner)

    if source.kind == "local":
        split_columns(source.split_files())  # a bad file named before the datasets library fails on it
    federated = FederatedDataset(
        **source.loader_arguments(),
        partitioners={"train": partitioner},
        preprocessor=subsets if spec.train_subset or spec.test_subset else None,
        shuffle=True,
        seed=spec.seed,
    )
    with _naming(f"the parquet files in {source.location}" if source.kind == "local" else repr(source.location)):
        bound = federated.partitioners["train"]
    try:
        test = federated.load_split("test")
    except ValueError as err:
        raise ValueError(f"dataset {spec.dataset!r} needs a 'test' split: {err}") from None
    return _Federation(bound, test)


@contextlib.contextmanager
def _naming(where: str) -> Iterator[None]:
    """Errors of loading or decoding data as one ValueError that starts with ``where`` (a file, a dataset).

    The datasets library raises errors of many kinds (DatasetGenerationError,
    ConnectionError, ...), Pillow OSError, torchvision RuntimeError.
    """
    try:
        yield
    except Exception as err:
        library = type(err).__module__.startswith(("datasets", "huggingface_hub", "pyarrow", "PIL"))
        if not (library or isinstance(err, ValueError | OSError | RuntimeError)):
            raise
        if str(err).startswith(where):  # named already
            raise
        kind = "" if isinstance(err, ValueError) else f"{type(err).__name__}: "
        raise ValueError(f"{where}: {kind}{err}") from None


def _check_partition_id(spec: DataSpec, partition_id: int) -> int:
    if isinstance(partition_id, bool) or not isinstance(partition_id, int | np.integer):
        raise ValueError(f"partition_id must be an integer, got {partition_id!r}")
    index = int(partition_id)
    if not 0 <= index < spec.num_partitions:
        raise ValueError(
            f"partition_id = {index} is out of range: num_partitions = {spec.num_partitions}, "
            f"so partition ids go from 0 to {spec.num_partitions - 1}"
        )
    return index


def load_partition(spec: DataSpec, partition_id: int) -> ImageTensors:
    """Client ``partition_id``'s train images, decoded (cached per process).

    Raises
    ------
    ValueError
        If ``partition_id`` is not in ``0 .. spec.num_partitions - 1``.
    """
    index = _check_partition_id(spec, partition_id)
    with _LOCK:
        return _load_partition(spec, index)


@functools.cache
def _load_partition(spec: DataSpec, partition_id: int) -> ImageTensors:
    info = _dataset_info(spec.dataset)
    partitioner = _federation(spec).partitioner
    with _naming(split_location(resolve_source(spec.dataset), "train")):
        if spec.edits_partitions:
            return _edited_partition(spec, partition_id)
        rows = partitioner.load_partition(partition_id)
        return to_image_tensors(
            rows, info.image_column, info.label_column, channels=info.in_channels, image_size=info.image_size
        )


def load_test_split(spec: DataSpec) -> ImageTensors:
    """The (possibly subset) test split, decoded (cached per process)."""
    with _LOCK:
        return _load_test_split(spec)


@functools.cache
def _load_test_split(spec: DataSpec) -> ImageTensors:
    info = _dataset_info(spec.dataset)
    test = _federation(spec).test
    with _naming(split_location(resolve_source(spec.dataset), "test")):
        return to_image_tensors(
            test, info.image_column, info.label_column, channels=info.in_channels, image_size=info.image_size
        )


def partition_sizes(spec: DataSpec) -> list[int]:
    """Number of train images of every partition, without decoding any image.

    Examples
    --------
    >>> partition_sizes(DataSpec(dataset="digits", partitioner="iid", num_partitions=3))
    [479, 479, 479]
    """
    with _LOCK:
        if spec.edits_partitions:
            return [len(positions) for positions in _partition_edits(spec)[1].partitions]
        return partition_row_counts(_federation(spec).partitioner)


@functools.cache
def _partition_edits(spec: DataSpec) -> tuple[np.ndarray, PartitionEdits]:
    """The partition edits, on the partitions laid end to end: ``(offsets, edits)``.

    Position ``offsets[k] + i`` is row ``i`` of the partitioner's partition
    ``k``; this index space works for every partitioner (some sort the split).
    """
    info = _dataset_info(spec.dataset)
    partitioner = _federation(spec).partitioner
    labels = [
        decode_labels(partitioner.load_partition(pid), info.label_column).numpy() for pid in range(spec.num_partitions)
    ]
    offsets = np.concatenate([[0], np.cumsum([len(part) for part in labels])]).astype(np.int64)
    edits = edit_partitions(
        [np.arange(offsets[k], offsets[k + 1]) for k in range(spec.num_partitions)],
        np.concatenate(labels),
        num_classes=info.num_classes,
        seed=spec.seed,
        rare_clients=spec.rare_clients,
        rare_client_cap=spec.rare_client_cap,
        noisy_clients=spec.noisy_clients,
        label_noise=spec.label_noise,
    )
    return offsets, edits


def _edited_partition(spec: DataSpec, partition_id: int) -> ImageTensors:
    info = _dataset_info(spec.dataset)
    offsets, edits = _partition_edits(spec)
    positions = edits.partitions[partition_id]  # sorted, so grouped by source partition
    if len(positions) == 0:
        return ImageTensors.empty(info.in_channels, info.image_size)
    sources = np.searchsorted(offsets, positions, side="right") - 1
    pieces = []
    for source in np.unique(sources):
        rows = _federation(spec).partitioner.load_partition(int(source))
        local = (positions[sources == source] - offsets[source]).tolist()
        pieces.append(
            decode_images(rows.select(local), info.image_column, channels=info.in_channels, image_size=info.image_size)
        )
    return ImageTensors(torch.cat(pieces), torch.from_numpy(edits.labels[positions]))


def clear_caches() -> None:
    """Forget every cached dataset, partition and description of this process."""
    with _LOCK:
        for cached in (
            _load_partition,
            _partition_edits,
            _load_test_split,
            _federation,
            _dataset_info,
            _feature_normalization,
        ):
            cached.cache_clear()
