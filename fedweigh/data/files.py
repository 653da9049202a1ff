"""A local dataset folder's split files: read from their footers, and checked in full before training.

A local ``dataset`` (or a site's ``data-dir``) is a folder holding
``train.parquet`` and ``test.parquet`` in the Hugging Face layout. This module
reads what they hold: their columns (:func:`split_columns`, from the footers
alone), an image column and an integer label column
(:func:`detect_image_column`, :func:`detect_label_column`), the same columns
in both splits (:func:`schema_differences`), and, read in full
(:func:`check_local_files`), labels in range and images that open and share
one size; each problem named by file, column and row.
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Mapping
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fedweigh.data.tensors import is_encoded_image

FILES_ACCEPTED = (
    "accepted: parquet files written by the datasets library (Dataset.to_parquet), "
    "with an image column and an integer label column"
)
"""What the split files of a local dataset folder must be."""


class EmptySplitError(ValueError):
    """A split without a single image."""


def short_reason(err: BaseException) -> str:
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
            f"{path} cannot be read as a parquet file ({short_reason(err)}): it is truncated, corrupt or not parquet; "
            f"{FILES_ACCEPTED}"
        ) from None
    return features, rows


def _is_integer_label(feature: Any) -> bool:
    return isinstance(feature, datasets.ClassLabel) or (
        isinstance(feature, datasets.Value) and feature.dtype.startswith(("int", "uint"))
    )


def split_columns(files: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """Check a local folder's split files (split name to path) from their footers: an image and a label column each.

    Returns each split's ``(image column, label column)``; cheap (no image is
    read), so every process that loads the folder runs it.

    Raises
    ------
    ValueError
        Naming the file and what is wrong with it; :class:`EmptySplitError`
        when the train split holds no rows.
    """
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


def _image_size(payload: Any, path: str, row: int) -> tuple[int, int]:
    """Width and height of one encoded image, from its header (Pillow reads no pixels for this)."""
    from PIL import Image

    content, file = (payload or {}).get("bytes"), (payload or {}).get("path")
    try:
        with Image.open(io.BytesIO(content) if content is not None else file) as image:
            return image.size
    except (OSError, ValueError, TypeError, AttributeError) as err:  # TypeError, AttributeError: neither bytes nor path
        raise ValueError(
            f"{path}: row {row} holds no image Pillow can read ({short_reason(err)}); {FILES_ACCEPTED}"
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
        raise ValueError(f"{path} cannot be read ({short_reason(err)}): it is corrupt; {FILES_ACCEPTED}") from None
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


def check_local_files(files: Mapping[str, str]) -> None:
    """Read all of a local dataset's split files (split name to path): every file, label and image header.

    The footers (:func:`split_columns`) say little about the data: this reads
    the label and image columns of both splits and checks that the labels are
    integers in range (:func:`label_range_problem`; the test split's among the
    train split's classes) and that every image can be opened and all have one
    size. About a second per 60,000 images (headers only); cached per process
    while the files are unchanged.

    Raises
    ------
    ValueError
        Naming the file, the row and what is accepted.
    """
    stamps = tuple((os.stat(path).st_mtime_ns, os.stat(path).st_size) for path in files.values())
    _check_local_files(tuple(sorted(files.items())), stamps)


@functools.cache
def _check_local_files(split_files: tuple[tuple[str, str], ...], stamps: tuple[tuple[int, int], ...]) -> None:
    files = dict(split_files)
    columns = split_columns(files)
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
