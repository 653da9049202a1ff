"""What a dataset is: its classes, channels, image size, normalisation and augmentation.

:func:`describe` reads a source's train split (:mod:`fedweigh.data.sources`)
into a :class:`DatasetInfo`, what models and batch transforms need to know;
known datasets (CIFAR-10, MNIST, Fashion-MNIST by name and image shape) get
their published statistics, any other the statistics of its train split
(:func:`pixel_moments`, :func:`channel_stats`, and :func:`feature_stats` for
per-pixel normalisation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import datasets
import numpy as np
import torch

from fedweigh.data.files import (
    FILES_ACCEPTED,
    LABELS_ACCEPTED,
    EmptySplitError,
    image_and_label_columns,
    label_range_problem,
    short_reason,
)
from fedweigh.data.sources import DataSource, load_train_split, split_location
from fedweigh.data.tensors import ImageTensors, decode_images, to_image_tensors

STATS_SAMPLE_SIZE = 10_000
"""At most this many train images (a seeded sample) estimate unknown statistics."""


AugmentKind = Literal["crop-flip", "none"]


@dataclass(frozen=True)
class _KnownStats:
    channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]


# Published per-channel statistics, used when a source's name and image shape
# match (a Hub id's name part or a local folder's name, e.g. ".../cifar10").
_KNOWN_STATS: dict[str, _KnownStats] = {
    "cifar10": _KnownStats(3, 32, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "mnist": _KnownStats(1, 28, (0.1307,), (0.3081,)),
    "fashion_mnist": _KnownStats(1, 28, (0.2860,), (0.3530,)),
}


@dataclass(frozen=True)
class DatasetInfo:
    """What models and transforms need to know about a dataset.

    Attributes
    ----------
    num_classes : int
        Number of classes (labels are ``0 .. num_classes - 1``).
    in_channels : int
        1 (grayscale) or 3 (RGB).
    image_size : int
        Height and width in pixels (images are square).
    mean, std : tuple of float
        Per-channel normalisation statistics of pixel values in ``[0, 1]``.
    augment : {"crop-flip", "none"}
        Training augmentation that suits the images: random crop with padding
        4 and horizontal flip for 32x32 RGB (CIFAR-like) images, none otherwise.
    image_column, label_column : str
        Column names in the Hugging Face dataset.
    """

    num_classes: int
    in_channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augment: AugmentKind
    image_column: str
    label_column: str


def augment_kind(in_channels: int, image_size: int) -> AugmentKind:
    """``"crop-flip"`` for 32x32 RGB images, ``"none"`` otherwise.

    Examples
    --------
    >>> augment_kind(3, 32), augment_kind(1, 28)
    ('crop-flip', 'none')
    """
    return "crop-flip" if in_channels == 3 and image_size == 32 else "none"


def _num_classes(train: datasets.Dataset, label_column: str, where: str) -> int:
    feature = train.features[label_column]
    if isinstance(feature, datasets.ClassLabel):
        return int(feature.num_classes)
    labels = np.asarray(train.select_columns([label_column]).with_format("numpy")[:][label_column])
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{where}: the label column {label_column!r} holds {labels.dtype} values; {LABELS_ACCEPTED}")
    if problem := label_range_problem(labels, label_column, where):
        raise ValueError(problem)
    return int(labels.max()) + 1


@dataclass(frozen=True)
class PixelMoments:
    """Sum and sum of squares of every pixel in ``[0, 1]`` (each ``[C, H, W]``) over ``count`` images."""

    total: np.ndarray
    squares: np.ndarray
    count: int


def pixel_moments(
    train: datasets.Dataset,
    image_column: str,
    *,
    channels: int,
    image_size: int,
    max_images: int = STATS_SAMPLE_SIZE,
    chunk: int = 2_000,
) -> PixelMoments:
    """The pixel moments of a train split, for :func:`channel_stats` and :func:`feature_stats`.

    Uses the whole split when it has at most ``max_images`` images, otherwise a
    sample of ``max_images`` drawn with seed 0; decodes ``chunk`` images at a time.
    """
    rows = np.arange(train.num_rows)
    if train.num_rows > max_images:
        rows = np.sort(np.random.default_rng(0).choice(train.num_rows, size=max_images, replace=False))
    total = np.zeros((channels, image_size, image_size))
    squares = np.zeros((channels, image_size, image_size))
    for start in range(0, len(rows), chunk):
        part = train.select(rows[start : start + chunk])
        images = decode_images(part, image_column, channels=channels, image_size=image_size).double() / 255.0
        total += images.sum(dim=0).numpy()
        squares += (images**2).sum(dim=0).numpy()
    return PixelMoments(total, squares, len(rows))


def _mean_std(total: np.ndarray, squares: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    mean = total / count
    return mean, np.sqrt(np.maximum(squares / count - mean**2, 0.0))


def channel_stats(moments: PixelMoments) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and standard deviation of pixel values in ``[0, 1]``, rounded to 4 decimals.

    >>> moments = PixelMoments(np.full((1, 2, 2), 1.0), np.full((1, 2, 2), 1.0), count=2)  # pixels 0 and 1
    >>> channel_stats(moments)
    ((0.5,), (0.5,))
    """
    pixels = moments.count * moments.total.shape[1] * moments.total.shape[2]
    mean, std = _mean_std(moments.total.sum(axis=(1, 2)), moments.squares.sum(axis=(1, 2)), pixels)
    return tuple(round(float(m), 4) for m in mean), tuple(round(float(s), 4) for s in std)


def feature_stats(moments: PixelMoments) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of every pixel (feature) in ``[0, 1]``, each ``[C, H, W]``.

    scikit-learn's ``StandardScaler`` semantics: population std (ddof = 0),
    and 1 where a pixel is constant (so it maps to 0, not to a division by
    zero).

    >>> mean, std = feature_stats(PixelMoments(np.array([[[1.0, 0.0]]]), np.array([[[1.0, 0.0]]]), count=2))
    >>> mean.tolist(), std.tolist()  # pixel 1 is always 0
    ([[[0.5, 0.0]]], [[[0.5, 1.0]]])
    """
    mean, std = _mean_std(moments.total, moments.squares, moments.count)
    return mean, np.where(std > 1e-12, std, 1.0)


def describe(source: DataSource, train: datasets.Dataset | None = None) -> DatasetInfo:
    """Describe a source from its train split (loaded with :func:`load_train_split` if not given).

    Known datasets (``cifar10``, ``mnist``, ``fashion_mnist`` by name, with the
    matching image shape) get their published normalisation statistics; any
    other dataset, the digits included, gets statistics computed from its train
    split (see :func:`channel_stats`).

    Examples
    --------
    >>> from fedweigh.data.sources import resolve_source
    >>> info = describe(resolve_source("digits"))
    >>> info.num_classes, info.in_channels, info.image_size, info.augment
    (10, 1, 8, 'none')
    """
    with torch.device("cpu"):  # also under the preflight check's meta device: the data is real
        return _describe(source, train)


def _describe(source: DataSource, train: datasets.Dataset | None) -> DatasetInfo:
    if train is None:
        train = load_train_split(source)
    where = split_location(source)
    if train.num_rows == 0:
        raise EmptySplitError(f"{where} holds no images; accepted: a dataset with labelled images")
    image_column, label_column = image_and_label_columns(train.features, where)
    try:
        first: ImageTensors = to_image_tensors(train.select([0]), image_column, label_column)
    except (ValueError, OSError, RuntimeError) as err:  # Pillow: OSError; torchvision: RuntimeError
        reason = short_reason(err)
        raise ValueError(f"{where}: its first image cannot be decoded ({reason}); {FILES_ACCEPTED}") from None
    _, channels, height, width = first.images.shape
    if height != width:
        raise ValueError(f"{where}: its images are {height}x{width}, not square; accepted: square images")
    known = _KNOWN_STATS.get(source.name)
    if known is not None and (known.channels, known.image_size) == (channels, height):
        mean, std = known.mean, known.std
    else:
        try:
            mean, std = channel_stats(pixel_moments(train, image_column, channels=channels, image_size=height))
        except (ValueError, OSError, RuntimeError) as err:
            reason = short_reason(err).removeprefix("ValueError: ")
            raise ValueError(f"{where}: {reason}" + ("" if "accepted" in reason else f"; {FILES_ACCEPTED}")) from None
    return DatasetInfo(
        num_classes=_num_classes(train, label_column, where),
        in_channels=channels,
        image_size=height,
        mean=mean,
        std=std,
        augment=augment_kind(channels, height),
        image_column=image_column,
        label_column=label_column,
    )
