"""Where the images come from: the ``dataset`` setting, resolved and described.

The ``dataset`` setting accepts three kinds of value:

``"digits"``
    scikit-learn's bundled 8x8 handwritten digits (1,797 images, no download),
    split once 80/20 into train and test with a fixed seed, pixel values scaled
    from 0..16 to 0..255.
a local folder
    holding ``train.parquet`` and ``test.parquet`` in the Hugging Face Hub
    layout (the feature types travel in the parquet metadata), e.g.
    ``../shared/datasets/cifar10``.
a Hugging Face Hub id ``owner/name``
    e.g. ``uoft-cs/cifar10``, ``ylecun/mnist``, ``zalando-datasets/fashion_mnist``;
    downloaded into the ``datasets`` cache on first use.

The image and label columns are detected from the dataset's features, never
hard-coded per dataset, and :class:`DatasetInfo` records what a model and the
batch transforms need to know (classes, channels, size, normalisation, the
augmentation that suits the images).

Offline use: set ``HF_DATASETS_OFFLINE=1`` so that nothing tries the network,
and point ``HF_HOME`` (or ``HF_DATASETS_CACHE``) at a writable cache, for
instance the project's git-ignored ``.cache/huggingface``. The first load of a
parquet folder builds an Arrow cache there; later loads memory-map it.

Examples
--------
>>> validate_dataset_setting("digits")
'digits'
>>> validate_dataset_setting("uoft-cs/cifar10")
'uoft-cs/cifar10'
>>> resolve_source("ylecun/mnist")
DataSource(kind='hub', location='ylecun/mnist')
>>> resolve_source("ylecun/mnist").name
'mnist'
"""

from __future__ import annotations

import functools
import io
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from fedweigh.data.tensors import ImageTensors, decode_images, is_encoded_image, to_image_tensors

SourceKind = Literal["digits", "local", "hub"]
AugmentKind = Literal["crop-flip", "none"]

DIGITS = "digits"
"""The value of the ``dataset`` setting that selects scikit-learn's digits."""

DIGITS_SPLIT_SEED = 0
"""Seed of the fixed, stratified 80/20 train/test split of the digits."""

SPLIT_FILES = ("train.parquet", "test.parquet")
"""The files a local dataset folder must hold."""

STATS_SAMPLE_SIZE = 10_000
"""At most this many train images (a seeded sample) estimate unknown statistics."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9_.\-]+$")

_ACCEPTED = (
    "accepted: 'digits', an existing folder containing train.parquet and "
    "test.parquet, or a Hugging Face Hub id 'owner/name' (e.g. 'uoft-cs/cifar10')"
)


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


FILES_ACCEPTED = (
    "accepted: parquet files written by the datasets library (Dataset.to_parquet), "
    "with an image column and an integer label column"
)
"""What the split files of a local dataset folder must be."""


class EmptySplitError(ValueError):
    """A split without a single image."""


def _invalid(value: str, reason: str) -> ValueError:
    return ValueError(f"invalid setting dataset = {value!r}: {reason}; {_ACCEPTED}")


def _looks_like_path(value: str) -> bool:
    return value.startswith(("/", ".", "~")) or os.sep in value or "/" in value


def _has_split_files(folder: str) -> bool:
    return all(os.path.isfile(os.path.join(folder, name)) for name in SPLIT_FILES)


def validate_dataset_setting(value: str) -> str:
    """Check the ``dataset`` setting and return its canonical form.

    Parameters
    ----------
    value : str
        ``"digits"``, a folder holding ``train.parquet`` and ``test.parquet``,
        or a Hugging Face Hub id ``owner/name``.

    Returns
    -------
    str
        ``"digits"``, the folder as an absolute path (``~`` expanded), or the
        Hub id unchanged.

    Raises
    ------
    ValueError
        Naming the setting ``dataset``, the value and what is accepted: for a
        path that does not exist, a folder without the two parquet files, or a
        value that is none of the accepted kinds.

    Notes
    -----
    An ``owner/name``-shaped value that is also an existing folder is taken as
    the folder (as :func:`datasets.load_dataset` does); otherwise it is a Hub
    id, which is not checked against the Hub here (that needs the network).

    Examples
    --------
    >>> validate_dataset_setting(" digits ")
    'digits'
    >>> validate_dataset_setting("/no/such/folder")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: invalid setting dataset = '/no/such/folder': no such folder; accepted: ...
    """
    if not isinstance(value, str):
        raise _invalid(str(value), f"expected a string, got {type(value).__name__}")
    text = value.strip()
    if not text:
        raise _invalid(value, "the value is empty")
    if text == DIGITS:
        return DIGITS
    folder = os.path.abspath(os.path.expanduser(text))
    if os.path.isdir(folder):
        if _has_split_files(folder):
            return folder
        missing = [name for name in SPLIT_FILES if not os.path.isfile(os.path.join(folder, name))]
        raise _invalid(value, f"the folder {folder} lacks {' and '.join(missing)}")
    if _HUB_ID.match(text):
        return text
    if _looks_like_path(text):
        if os.path.exists(folder):
            raise _invalid(value, f"{folder} is not a folder")
        raise _invalid(value, "no such folder")
    raise _invalid(value, "not a known dataset")


@dataclass(frozen=True)
class DataSource:
    """A resolved ``dataset`` setting.

    Attributes
    ----------
    kind : {"digits", "local", "hub"}
        Which kind of source this is.
    location : str
        ``"digits"``, the absolute folder path, or the Hub id.
    """

    kind: SourceKind
    location: str

    @property
    def name(self) -> str:
        """Short lower-case name: ``"digits"``, the folder name, or the id's name part.

        Examples
        --------
        >>> DataSource("hub", "zalando-datasets/fashion_mnist").name
        'fashion_mnist'
        """
        base = os.path.basename(self.location.rstrip("/\\")) or self.location
        return base.lower().replace("-", "_")

    def split_files(self) -> dict[str, str]:
        """The parquet file of each split (local folders only)."""
        if self.kind != "local":
            raise ValueError(f"{self.location!r} is not a local folder")
        return {name.removesuffix(".parquet"): os.path.join(self.location, name) for name in SPLIT_FILES}

    def loader_arguments(self) -> dict[str, Any]:
        """Keyword arguments for :class:`flwr_datasets.FederatedDataset` (local or Hub).

        Examples
        --------
        >>> DataSource("hub", "uoft-cs/cifar10").loader_arguments()
        {'dataset': 'uoft-cs/cifar10'}
        """
        if self.kind == "local":
            return {"dataset": "parquet", "data_files": self.split_files()}
        if self.kind == "hub":
            return {"dataset": self.location}
        raise ValueError("the digits are built in memory; see load_digits()")


def resolve_source(value: str) -> DataSource:
    """Validate the ``dataset`` setting and say which kind of source it is.

    Examples
    --------
    >>> resolve_source("digits")
    DataSource(kind='digits', location='digits')
    """
    canonical = validate_dataset_setting(value)
    if canonical == DIGITS:
        return DataSource("digits", DIGITS)
    if os.path.isabs(canonical):
        return DataSource("local", canonical)
    return DataSource("hub", canonical)


def load_digits() -> datasets.DatasetDict:
    """scikit-learn's 8x8 digits as ``train`` (1,437) and ``test`` (360) splits.

    The split is stratified and fixed (seed :data:`DIGITS_SPLIT_SEED`), so it
    does not move with the run's seed. The ``image`` column holds 8x8 ``uint8``
    arrays (0..16 scaled to 0..255), ``label`` is a ``ClassLabel``.

    Examples
    --------
    >>> splits = load_digits()
    >>> splits["train"].num_rows, splits["test"].num_rows
    (1437, 360)
    """
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    bunch = sklearn_digits()
    images = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    labels = bunch.target.astype(np.int64)
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=0.2, random_state=DIGITS_SPLIT_SEED, stratify=labels
    )
    features = datasets.Features(
        {
            "image": datasets.Array2D(shape=(8, 8), dtype="uint8"),
            "label": datasets.ClassLabel(names=[str(k) for k in range(10)]),
        }
    )

    def split(indices: np.ndarray) -> datasets.Dataset:
        return datasets.Dataset.from_dict({"image": images[indices], "label": labels[indices]}, features=features)

    return datasets.DatasetDict({"train": split(train_idx), "test": split(test_idx)})


def _reason(err: BaseException) -> str:
    """``"Type: first line of the message"``, for a message that quotes a library's error."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def split_file_features(path: str) -> tuple[datasets.Features, int]:
    """The features and the number of rows of one split file, read from its parquet footer alone.

    Raises
    ------
    ValueError
        Naming the file, when it is empty, truncated, corrupt or no parquet file at all.
    """
    try:
        features = datasets.Features.from_arrow_schema(pq.read_schema(path))
        rows = pq.read_metadata(path).num_rows
    except (OSError, pa.ArrowException, ValueError, TypeError, KeyError) as err:
        raise ValueError(
            f"{path} cannot be read as a parquet file ({_reason(err)}): it is truncated, corrupt or not parquet; "
            f"{FILES_ACCEPTED}"
        ) from None
    return features, rows


def _is_integer_label(feature: Any) -> bool:
    return isinstance(feature, datasets.ClassLabel) or (
        isinstance(feature, datasets.Value) and feature.dtype.startswith(("int", "uint"))
    )


def split_columns(source: DataSource) -> dict[str, tuple[str, str]]:
    """Check a local folder's split files from their footers: readable, an image and an integer label column each.

    Returns each split's ``(image column, label column)``; cheap (no image is
    read), so every process that loads the folder runs it.

    Raises
    ------
    ValueError
        Naming the file and what is wrong with it; :class:`EmptySplitError`
        when the train split holds no rows.
    """
    files = source.split_files()
    columns: dict[str, tuple[str, str]] = {}
    rows: dict[str, int] = {}
    for split, path in files.items():
        features, rows[split] = split_file_features(path)
        try:
            image, label = detect_image_column(features), detect_label_column(features)
        except ValueError as err:
            raise ValueError(f"{path}: {err}; {FILES_ACCEPTED}") from None
        if not _is_integer_label(features[label]):
            raise ValueError(f"{path}: the label column {label!r} holds {features[label]}; {FILES_ACCEPTED}")
        columns[split] = (image, label)
    if columns["test"] != columns["train"]:
        raise ValueError(
            f"{files['test']} has image and label columns {columns['test']}, but {files['train']} has "
            f"{columns['train']}; accepted: the same columns in both splits"
        )
    if differences := schema_differences(files["train"], files["test"]):
        columns_differ = [line for line in differences if " only" in line]
        if columns_differ:  # the datasets library cannot load the two as one dataset
            raise ValueError(f"{'; '.join(columns_differ)}; accepted: the same columns in both splits")
    if rows["train"] == 0:
        raise EmptySplitError(f"{files['train']} holds no images; {FILES_ACCEPTED}")
    return columns


def schema_differences(train: str, test: str) -> list[str]:
    """How the columns of two split files differ: a column in one only, or one stored with other types.

    Read from the files' footers; each line names the column, and both files' types where both have it.
    """
    schemas = {path: pq.read_schema(path) for path in (train, test)}
    names = {path: schema.names for path, schema in schemas.items()}
    lines = []
    for column in dict.fromkeys([*names[train], *names[test]]):
        holders = [path for path in (train, test) if column in names[path]]
        if len(holders) == 1:
            lines.append(f"the column {column!r} is in {holders[0]} only")
            continue
        types = [schemas[path].field(column).type for path in (train, test)]
        if types[0] != types[1]:
            lines.append(f"the column {column!r} is {types[0]} in {train} but {types[1]} in {test}")
    return lines


def _loaded(source: DataSource, load: Callable[[], datasets.Dataset]) -> datasets.Dataset:
    """``load()``, its failures (the datasets library raises many kinds) as one ValueError naming the source."""
    try:
        return load()
    except EmptySplitError:
        raise
    except Exception as err:  # DatasetGenerationError, ConnectionError, FileNotFoundError, ArrowInvalid, ...
        if isinstance(err, ValueError) and "corresponds to no data" in str(err):
            raise EmptySplitError(f"{source.location!r} has an empty split ({_reason(err)})") from None
        if source.kind == "local":  # find the file to blame, reading all of them (only now that loading failed)
            check_local_dataset(source.location)
            files = source.split_files()
            if differences := schema_differences(files["train"], files["test"]):
                raise ValueError(
                    f"the parquet files in {source.location} cannot be loaded as one dataset ({_reason(err)}): "
                    f"{'; '.join(differences)}; accepted: both splits written with the same columns and types"
                ) from None
        if source.kind == "hub":
            raise ValueError(
                f"{source.location!r} cannot be loaded from the Hugging Face Hub or its cache ({_reason(err)}); "
                f"{_ACCEPTED} that is reachable, or already in the cache when offline (HF_DATASETS_OFFLINE=1)"
            ) from None
        raise ValueError(
            f"the parquet files in {source.location} cannot be loaded ({_reason(err)}); {FILES_ACCEPTED}"
        ) from None


def load_split(source: DataSource, split: str) -> datasets.Dataset:
    """The full, unshuffled ``split`` of a source (downloads a Hub dataset once).

    Raises
    ------
    ValueError
        Naming the file or the Hub id that cannot be loaded (see :func:`split_columns`).
    """
    if source.kind == "digits":
        return load_digits()[split]
    if source.kind == "local":
        split_columns(source)
        return _loaded(source, lambda: datasets.load_dataset("parquet", data_files=source.split_files(), split=split))
    return _loaded(source, lambda: datasets.load_dataset(source.location, split=split))


def load_train_split(source: DataSource) -> datasets.Dataset:
    """The full, unshuffled train split of a source (downloads a Hub dataset once); see :func:`load_split`."""
    return load_split(source, "train")


def detect_image_column(features: datasets.Features) -> str:
    """The first column of encoded images (:func:`~fedweigh.data.tensors.is_encoded_image`), else ``img``/``image``.

    Examples
    --------
    >>> detect_image_column(datasets.Features({"label": datasets.Value("int64"),
    ...                                        "picture": datasets.Image()}))
    'picture'
    """
    for name, feature in features.items():
        if is_encoded_image(feature):
            return name
    for name in ("img", "image"):
        if name in features:
            return name
    raise ValueError(f"no image column among {list(features)} (no Image feature, no 'img' or 'image')")


def detect_label_column(features: datasets.Features) -> str:
    """The first ``ClassLabel`` column, else ``label``/``fine_label``.

    Examples
    --------
    >>> detect_label_column(datasets.Features({"img": datasets.Image(),
    ...                                        "fine_label": datasets.Value("int64")}))
    'fine_label'
    """
    for name, feature in features.items():
        if isinstance(feature, datasets.ClassLabel):
            return name
    for name in ("label", "fine_label"):
        if name in features:
            return name
    raise ValueError(f"no label column among {list(features)} (no ClassLabel, no 'label' or 'fine_label')")


def image_and_label_columns(features: datasets.Features, where: str) -> tuple[str, str]:
    """The image and label columns of a split at ``where``; a clear error naming ``where`` if either is missing."""
    try:
        return detect_image_column(features), detect_label_column(features)
    except ValueError as err:
        raise ValueError(f"{where}: {err}; accepted: a dataset with an image and an integer label column") from None


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


MAX_CLASSES = 100_000
"""The most classes a dataset whose labels are plain integers (no ClassLabel names) may have: labels
0..MAX_CLASSES - 1. A larger label is a damaged one (a model with 2e9 outputs is never meant)."""
LABELS_ACCEPTED = "accepted: integer labels 0..K-1 (a ClassLabel column, or integers named 'label' or 'fine_label')"


def _labels_accepted(classes: int | None) -> str:
    """What a label may be: below the ClassLabel's number of classes, or below :data:`MAX_CLASSES`."""
    if classes is not None:
        return f"accepted: labels 0..{classes - 1}, the {classes} classes of the label column's ClassLabel"
    return (
        f"accepted: integer labels 0..K-1 with K at most {MAX_CLASSES:,} classes (a ClassLabel column, or "
        "integers named 'label' or 'fine_label')"
    )


def label_range_problem(labels: np.ndarray, column: str, where: str, classes: int | None = None) -> str | None:
    """Why ``labels`` cannot be class labels, naming the column, the first bad row and the accepted range.

    ``classes``: the ClassLabel's number of classes when the column has one.

    >>> label_range_problem(np.array([0, 3, 2_000_000_000]), "label", "train.parquet")
    "train.parquet: row 2 of the label column 'label' holds 2000000000; accepted: integer labels 0..K-1 with K \
at most 100,000 classes (a ClassLabel column, or integers named 'label' or 'fine_label')"
    """
    limit = MAX_CLASSES if classes is None else classes
    bad = np.flatnonzero((labels < 0) | (labels >= limit))
    if not bad.size:
        return None
    row = int(bad[0])
    return f"{where}: row {row} of the label column {column!r} holds {labels[row]}; {_labels_accepted(classes)}"


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


def split_location(source: DataSource, split: str = "train") -> str:
    """Where a split comes from, for messages: its parquet file, or the dataset and split."""
    if source.kind == "local":
        return source.split_files()[split]
    return f"dataset {source.location!r} ({split} split)"


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
        raise ValueError(f"{where}: its first image cannot be decoded ({_reason(err)}); {FILES_ACCEPTED}") from None
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
            reason = _reason(err).removeprefix("ValueError: ")
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


def _image_size(payload: Any, path: str, row: int) -> tuple[int, int]:
    """Width and height of one encoded image, from its header (Pillow reads no pixels for this)."""
    from PIL import Image

    content, file = (payload or {}).get("bytes"), (payload or {}).get("path")
    try:
        with Image.open(io.BytesIO(content) if content is not None else file) as image:
            return image.size
    except (OSError, ValueError, TypeError, AttributeError) as err:  # TypeError, AttributeError: neither bytes nor path
        raise ValueError(
            f"{path}: row {row} holds no image Pillow can read ({_reason(err)}); {FILES_ACCEPTED}"
        ) from None


def _check_split_content(
    path: str, image: str, label: str, classes: int | None = None
) -> tuple[int, tuple[int, ...] | None]:
    """Labels and image sizes of one split file; returns ``(largest label + 1, image size or None)``.

    ``classes``: the train split's ClassLabel's number of classes, which every label must be below.
    """
    try:
        table = pq.read_table(path, columns=[image, label])
    except (OSError, pa.ArrowException) as err:
        raise ValueError(f"{path} cannot be read ({_reason(err)}): it is corrupt; {FILES_ACCEPTED}") from None
    if table.num_rows == 0:
        raise EmptySplitError(f"{path} holds no images; {FILES_ACCEPTED}")
    labels = table.column(label)
    if labels.null_count:
        raise ValueError(f"{path}: {labels.null_count} rows have no label; {LABELS_ACCEPTED}")
    values = labels.to_numpy()
    if problem := label_range_problem(values, label, path, classes):
        raise ValueError(problem)
    feature = datasets.Features.from_arrow_schema(table.schema)[image]
    if not is_encoded_image(feature):
        return int(values.max()) + 1, None  # arrays: the decoder checks their shapes
    first: tuple[int, int] | None = None
    for row, payload in enumerate(table.column(image).to_pylist()):
        size = _image_size(payload, path, row)
        if first is None:
            first = size
        elif size != first:
            raise ValueError(
                f"{path}: images of different sizes: row 0 is {_size(first)}, row {row} is "
                f"{_size(size)}; accepted: images of one size in both splits (resize them beforehand)"
            )
    return int(values.max()) + 1, first


def check_local_dataset(value: str) -> None:
    """Read all of a local dataset folder: every file, label and image header; nothing for other sources.

    The footers (:func:`split_columns`) say little about the data: this reads
    the label and image columns of both splits and checks that the labels are
    integers >= 0 (the test split's among the train split's classes) and
    that every image can be opened and all have one size. About a second per
    60,000 images (headers only); cached per process while the files are
    unchanged. The preflight check runs it, so a bad file stops a run before
    anything trains.

    Raises
    ------
    ValueError
        Naming the file, the row and what is accepted.
    """
    source = resolve_source(value)
    if source.kind != "local":
        return
    stamps = tuple((os.stat(path).st_mtime_ns, os.stat(path).st_size) for path in source.split_files().values())
    _check_local_files(source.location, stamps)


@functools.cache
def _check_local_files(location: str, stamps: tuple[tuple[int, int], ...]) -> None:
    source = DataSource("local", location)
    files = source.split_files()
    columns = split_columns(source)
    label = datasets.Features.from_arrow_schema(pq.read_schema(files["train"]))[columns["train"][1]]
    named = int(label.num_classes) if isinstance(label, datasets.ClassLabel) else None
    train_classes, train_size = _check_split_content(files["train"], *columns["train"], named)
    test_classes, test_size = _check_split_content(files["test"], *columns["test"], named)
    if None not in (train_size, test_size) and test_size != train_size:
        raise ValueError(
            f"{files['test']} holds images of {_size(test_size)}, {files['train']} of {_size(train_size)}; "
            "accepted: images of one size in both splits"
        )
    if named is None and test_classes > train_classes:
        raise ValueError(
            f"{files['test']}: label {test_classes - 1} is not among the {train_classes} classes of "
            f"{files['train']}; {LABELS_ACCEPTED}"
        )


def _size(size: tuple[int, ...] | None) -> str:
    return "x".join(map(str, size or ()))
