"""Where the images come from: the ``dataset`` setting, resolved and loaded.

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

A local folder's files are checked by :mod:`fedweigh.data.files`; what a
dataset is (classes, channels, size, statistics) is
:mod:`fedweigh.data.description`'s.

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

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import datasets
import numpy as np

from fedweigh.data.files import (
    FILES_ACCEPTED,
    EmptySplitError,
    check_local_files,
    schema_differences,
    short_reason,
    split_columns,
)

SourceKind = Literal["digits", "local", "hub"]


DIGITS = "digits"
"""The value of the ``dataset`` setting that selects scikit-learn's digits."""


DIGITS_SPLIT_SEED = 0
"""Seed of the fixed, stratified 80/20 train/test split of the digits."""


SPLIT_FILES = ("train.parquet", "test.parquet")
"""The files a local dataset folder must hold."""


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9_.\-]+$")


_ACCEPTED = (
    "accepted: 'digits', an existing folder containing train.parquet and "
    "test.parquet, or a Hugging Face Hub id 'owner/name' (e.g. 'uoft-cs/cifar10')"
)


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


def _loaded(source: DataSource, load: Callable[[], datasets.Dataset]) -> datasets.Dataset:
    """``load()``, its failures (the datasets library raises many kinds) as one ValueError naming the source."""
    try:
        return load()
    except EmptySplitError:
        raise
    except Exception as err:  # DatasetGenerationError, ConnectionError, FileNotFoundError, ArrowInvalid, ...
        if isinstance(err, ValueError) and "corresponds to no data" in str(err):
            raise EmptySplitError(f"{source.location!r} has an empty split ({short_reason(err)})") from None
        if source.kind == "local":  # find the file to blame, reading all of them (only now that loading failed)
            check_local_dataset(source.location)
            files = source.split_files()
            if differences := schema_differences(files["train"], files["test"]):
                raise ValueError(
                    f"the parquet files in {source.location} cannot be loaded as one dataset ({short_reason(err)}): "
                    f"{'; '.join(differences)}; accepted: both splits written with the same columns and types"
                ) from None
        if source.kind == "hub":
            raise ValueError(
                f"{source.location!r} cannot be loaded from the Hugging Face Hub or its cache ({short_reason(err)}); "
                f"{_ACCEPTED} that is reachable, or already in the cache when offline (HF_DATASETS_OFFLINE=1)"
            ) from None
        raise ValueError(
            f"the parquet files in {source.location} cannot be loaded ({short_reason(err)}); {FILES_ACCEPTED}"
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
        split_columns(source.split_files())
        return _loaded(source, lambda: datasets.load_dataset("parquet", data_files=source.split_files(), split=split))
    return _loaded(source, lambda: datasets.load_dataset(source.location, split=split))


def load_train_split(source: DataSource) -> datasets.Dataset:
    """The full, unshuffled train split of a source (downloads a Hub dataset once); see :func:`load_split`."""
    return load_split(source, "train")


def split_location(source: DataSource, split: str = "train") -> str:
    """Where a split comes from, for messages: its parquet file, or the dataset and split."""
    if source.kind == "local":
        return source.split_files()[split]
    return f"dataset {source.location!r} ({split} split)"


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
    if source.kind == "local":
        check_local_files(source.split_files())
