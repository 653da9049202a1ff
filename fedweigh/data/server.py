"""The server's own data: held out of the clients' task, or a different dataset.

Feddle, Center and FedAvg-then-fine-tune (Fed+FT) use labelled data the
server holds. The ``server-data`` setting says which:

``"id"`` (in-distribution)
    ``server-data-size`` images of the clients' test split, drawn with the
    data seed; they leave the evaluation set (:func:`hold_out`), as in the
    Feddle paper, which takes 1,000 test images. ``test-holdout`` leaves the
    same draw out of evaluation in runs without them, so that arms with and
    without server data are evaluated on the same images.
a dataset (out-of-distribution)
    a Hub id or a local parquet folder, like the ``dataset`` setting: a seeded
    sample of ``server-data-size`` images of its train split (0: all of it),
    with its own classes. Its images are brought to the clients' input shape
    (:func:`match_shape`: grey to colour by replication, colour to grey by
    luma, any size to the clients' by bilinear resizing) and normalised with
    their own statistics.

Example
-------
>>> import torch
>>> test = ImageTensors(torch.zeros(10, 1, 8, 8, dtype=torch.uint8), torch.arange(10))
>>> server, evaluation = hold_out(test, size=3, seed=1)
>>> len(server), len(evaluation), sorted(server.labels.tolist() + evaluation.labels.tolist()) == list(range(10))
(3, 7, True)
>>> match_shape(torch.zeros(2, 1, 28, 28, dtype=torch.uint8), channels=3, image_size=32).shape
torch.Size([2, 3, 32, 32])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from fedweigh.data.description import DatasetInfo
from fedweigh.data.files import EmptySplitError, image_and_label_columns
from fedweigh.data.sources import load_train_split, resolve_source
from fedweigh.data.tensors import ImageTensors, decode_images, decode_labels, match_channels
from fedweigh.data.transforms import BatchTransform

ServerDataKind = Literal["id", "ood"]

HOLD_OUT_STREAM = 6361
"""Seed stream of the held-out draw (apart from the subsets' and the partitioner's)."""


@dataclass(frozen=True, eq=False)
class ServerData:
    """Labelled images at the server, ready for a model of the clients' task.

    Attributes
    ----------
    kind : {"id", "ood"}
        The clients' classes, or a dataset's own.
    data : ImageTensors
        ``uint8`` images in the clients' input shape, and labels.
    num_classes : int
        Classes of ``data``'s labels (the clients' for ``"id"``).
    transform : BatchTransform
        Normalisation (and for ``"id"`` the clients' augmentation).
    source : str
        Where it came from, for the record.
    """

    kind: ServerDataKind
    data: ImageTensors
    num_classes: int
    transform: BatchTransform
    source: str

    def __len__(self) -> int:
        return len(self.data)


def hold_out(test: ImageTensors, size: int, seed: int) -> tuple[ImageTensors, ImageTensors]:
    """``(held out, the rest)``: ``size`` random images of ``test``, drawn with ``seed``.

    The held-out images come in the order of the draw, so the first k of a
    larger draw are exactly a draw of k; the rest keep the split's order.
    """
    if not 0 < size < len(test):
        raise ValueError(
            f"{size} images cannot be held out of a test split of {len(test)} images "
            f"(server-data-size, test-holdout); accepted: 1 to {len(test) - 1}"
        )
    order = np.random.default_rng([seed, HOLD_OUT_STREAM]).permutation(len(test))
    held, rest = order[:size], np.sort(order[size:])
    return test.subset(torch.from_numpy(held)), test.subset(torch.from_numpy(rest))


def match_shape(images: torch.Tensor, channels: int, image_size: int) -> torch.Tensor:
    """``uint8`` images ``[N, C, H, W]`` as ``[N, channels, image_size, image_size]``.

    One channel becomes three by replication; three become one by ITU-R 601
    luma; other sizes are resized bilinearly (antialiased when shrinking).
    """
    have, height, width = images.shape[1:]
    if have not in (1, 3) or channels not in (1, 3):
        raise ValueError(f"images with {have} channels cannot be brought to {channels}; accepted: 1 or 3 channels")
    x = match_channels(images, channels)
    if (height, width) != (image_size, image_size):
        resized = F.interpolate(
            x.float(), size=(image_size, image_size), mode="bilinear", align_corners=False, antialias=True
        )
        x = resized.round().clamp(0, 255).to(torch.uint8)
    return x.contiguous()


def pixel_statistics(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and standard deviation of ``uint8`` images, in ``[0, 1]`` units."""
    x = images.double() / 255.0
    mean = x.mean(dim=(0, 2, 3))
    std = x.std(dim=(0, 2, 3), unbiased=False).clamp_min(1e-3)
    return tuple(round(float(v), 4) for v in mean), tuple(round(float(v), 4) for v in std)


def load_other_dataset(
    location: str,
    size: int,
    seed: int,
    channels: int,
    image_size: int,
    transform: Callable[[DatasetInfo], BatchTransform] | None = None,
) -> ServerData:
    """A seeded sample of ``size`` train images (0: all) of another dataset, in the clients' input shape.

    Its batches are normalised with its own pixel statistics and not
    augmented; ``transform`` builds its batch transform from its
    :class:`DatasetInfo` instead (the model's input size and a pretrained
    model's statistics).

    Raises
    ------
    ValueError
        Naming ``server-data``: a dataset that cannot be found, has no label
        column, is empty, or has images that cannot take the clients' shape.
    """
    source = resolve_source(location)
    prefix = f"server-data = {location!r}"
    try:
        train = load_train_split(source)
    except EmptySplitError:
        train = None
    except ValueError as err:
        raise ValueError(f"{prefix}: its train split cannot be read ({err})") from None
    if train is None or train.num_rows == 0:
        raise ValueError(f"{prefix}: its train split is empty; accepted: a dataset with labelled images")
    image_column, label_column = image_and_label_columns(train.features, prefix)
    if size and size < train.num_rows:
        rows = np.sort(np.random.default_rng([seed, HOLD_OUT_STREAM]).choice(train.num_rows, size, replace=False))
        train = train.select(rows)
    try:
        images = decode_images(train, image_column)
        images = match_shape(images, channels, image_size)
    except (ValueError, OSError, RuntimeError) as err:  # an image Pillow (OSError) or torchvision cannot read
        raise ValueError(f"{prefix}: {err}") from None
    labels = decode_labels(train, label_column)
    mean, std = pixel_statistics(images)
    info = DatasetInfo(
        num_classes=int(labels.max()) + 1,
        in_channels=channels,
        image_size=image_size,
        mean=mean,
        std=std,
        augment="none",
        image_column=image_column,
        label_column=label_column,
    )
    batches = transform(info) if transform is not None else BatchTransform(info, False)
    return ServerData("ood", ImageTensors(images, labels), info.num_classes, batches, source.location)
