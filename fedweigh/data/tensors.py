"""Decoded images in memory: one ``uint8`` tensor per split or partition.

A Hugging Face dataset stores images encoded (PNG, JPEG) and decodes them one
at a time on access. Training re-reads every image every epoch, so the data
layer decodes a partition *once* into an :class:`ImageTensors` (``uint8``,
``[N, C, H, W]``: a quarter of the memory of ``float32``) and the batch
transforms convert to float on the training device.

Example
-------
>>> import torch
>>> data = ImageTensors(torch.zeros(4, 1, 8, 8, dtype=torch.uint8), torch.tensor([0, 1, 1, 2]))
>>> len(data), data.subset([1, 2]).labels.tolist()
(4, [1, 1])
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import datasets
import numpy as np
import pyarrow as pa
import torch

if TYPE_CHECKING:
    from torchvision.io import ImageReadMode

IndexLike = Sequence[int] | np.ndarray | torch.Tensor

DECODE_CHUNK = 4096
"""Images fetched from the Arrow table per step while decoding."""


@dataclass(frozen=True, eq=False)
class ImageTensors:
    """Images and labels of one split or partition, decoded.

    Attributes
    ----------
    images : torch.Tensor
        ``uint8`` tensor of shape ``[N, C, H, W]``.
    labels : torch.Tensor
        ``int64`` tensor of shape ``[N]``.

    Notes
    -----
    The data layer caches these per process and hands the same object to
    every caller: do not modify the tensors in place.
    """

    images: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.dim() != 4:
            raise ValueError(
                f"images must be a uint8 tensor [N, C, H, W], got {self.images.dtype} "
                f"of shape {tuple(self.images.shape)}"
            )
        if self.labels.dtype != torch.int64 or self.labels.dim() != 1:
            raise ValueError(
                f"labels must be an int64 tensor [N], got {self.labels.dtype} of shape {tuple(self.labels.shape)}"
            )
        if self.images.shape[0] != self.labels.shape[0]:
            raise ValueError(f"{self.images.shape[0]} images but {self.labels.shape[0]} labels")

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @classmethod
    def empty(cls, channels: int, image_size: int) -> ImageTensors:
        """No images, with the given image shape.

        Examples
        --------
        >>> ImageTensors.empty(3, 32).images.shape
        torch.Size([0, 3, 32, 32])
        """
        return cls(
            torch.empty((0, channels, image_size, image_size), dtype=torch.uint8),
            torch.empty((0,), dtype=torch.int64),
        )

    def subset(self, indices: IndexLike) -> ImageTensors:
        """The samples at ``indices`` (integer positions or a boolean mask), in that order."""
        index = torch.as_tensor(indices, device=self.labels.device)
        if index.dtype != torch.bool:
            index = index.long()
        return ImageTensors(self.images[index], self.labels[index])

    def to(self, device: torch.device | str) -> ImageTensors:
        """The same samples on ``device`` (``self`` when already there)."""
        if self.images.device == torch.device(device):
            return self
        return ImageTensors(self.images.to(device), self.labels.to(device))

    def label_counts(self, num_classes: int) -> torch.Tensor:
        """Number of samples of each class, an ``int64`` tensor ``[num_classes]``.

        Examples
        --------
        >>> ImageTensors(torch.zeros(3, 1, 2, 2, dtype=torch.uint8), torch.tensor([0, 2, 2])).label_counts(4)
        tensor([1, 0, 2, 0])
        """
        return torch.bincount(self.labels, minlength=num_classes)


def _luma(images: torch.Tensor) -> torch.Tensor:
    weights = torch.tensor([0.2989, 0.587, 0.114], dtype=torch.float32).view(1, 3, 1, 1)
    gray = (images[:, :3].float() * weights).sum(dim=1, keepdim=True)
    return gray.round_().clamp_(0, 255).to(torch.uint8)


def match_channels(images: torch.Tensor, channels: int | None) -> torch.Tensor:
    """``[N, C, H, W]`` with C in 1..4 (alpha dropped) turned into ``channels`` (1 or 3)."""
    have = images.shape[1]
    if have not in (1, 2, 3, 4):
        raise ValueError(f"cannot interpret {have} image channels (expected 1 to 4)")
    if have == 2:
        images, have = images[:, :1], 1
    elif have == 4:
        images, have = images[:, :3], 3
    if channels is None or channels == have:
        return images
    if channels == 3:
        return images.expand(-1, 3, -1, -1).contiguous()
    if channels == 1:
        return _luma(images)
    raise ValueError(f"channels must be 1 or 3, got {channels}")


def _decode_with_pil(payload: bytes, mode: ImageReadMode) -> torch.Tensor:
    from PIL import Image
    from torchvision.io import ImageReadMode

    with Image.open(io.BytesIO(payload)) as image:
        if mode == ImageReadMode.UNCHANGED:
            pil_mode = "L" if len(image.getbands()) <= 2 else "RGB"
        else:
            pil_mode = "L" if mode == ImageReadMode.GRAY else "RGB"
        array = np.asarray(image.convert(pil_mode), dtype=np.uint8)
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array.transpose(2, 0, 1).copy())


def _decode_one(payload: bytes, mode: ImageReadMode) -> torch.Tensor:
    """One encoded image as ``uint8 [C, H, W]``; torchvision first, Pillow as fallback."""
    from torchvision.io import decode_image

    try:
        image = decode_image(torch.frombuffer(bytearray(payload), dtype=torch.uint8), mode=mode)
    except (RuntimeError, ValueError):
        image = _decode_with_pil(payload, mode)
    if image.dtype != torch.uint8:
        image = _decode_with_pil(payload, mode)
    return image


def is_encoded_image(feature: object) -> bool:
    """A column of encoded images: an :class:`datasets.Image` feature, or the struct of ``bytes`` (and ``path``)
    it is stored as, which a parquet file written without the datasets library's metadata (plain pyarrow)
    reads back as.

    >>> is_encoded_image(datasets.Image()), is_encoded_image({"bytes": datasets.Value("binary")})
    (True, True)
    >>> is_encoded_image(datasets.Sequence(datasets.Value("uint8")))
    False
    """
    if isinstance(feature, datasets.Image):
        return True
    if not isinstance(feature, dict) or "bytes" not in feature or not set(feature) <= {"bytes", "path"}:
        return False
    content = feature["bytes"]
    return isinstance(content, datasets.Value) and content.dtype in ("binary", "large_binary")


def _payloads(table: pa.Table, column: str) -> list[bytes]:
    """Encoded bytes of each row of an Arrow table's image column (struct of bytes and, optionally, path)."""
    structs = table.column(column).combine_chunks()
    contents = structs.field("bytes").to_pylist()
    has_paths = any(structs.type.field(index).name == "path" for index in range(structs.type.num_fields))
    paths = structs.field("path").to_pylist() if has_paths else [None] * len(contents)
    payloads = []
    for content, path in zip(contents, paths, strict=True):
        if content is None:
            if path is None:
                raise ValueError(f"an image in column {column!r} has neither bytes nor a path")
            with open(path, "rb") as file:
                content = file.read()
        payloads.append(content)
    return payloads


def _decode_encoded(
    dataset: datasets.Dataset, column: str, channels: int | None, image_size: int | None
) -> torch.Tensor:
    # Imported here, not at module level: torchvision.io imports all of
    # torchvision (about a second), which only encoded images need.
    from torchvision.io import ImageReadMode

    rows = dataset.select_columns([column]).with_format("arrow")
    out: torch.Tensor | None = None
    mode = ImageReadMode.UNCHANGED
    position = 0
    for table in rows.iter(batch_size=DECODE_CHUNK):
        for payload in _payloads(table, column):
            if out is None:
                if channels is None:
                    first = _decode_one(payload, ImageReadMode.UNCHANGED)
                    channels = 1 if first.shape[0] <= 2 else 3
                mode = ImageReadMode.GRAY if channels == 1 else ImageReadMode.RGB
                first = _decode_one(payload, mode)
                _check_size(first.shape[1], first.shape[2], image_size)
                out = torch.empty((dataset.num_rows, *first.shape), dtype=torch.uint8)
            image = _decode_one(payload, mode)
            if image.shape != out.shape[1:]:
                raise ValueError(
                    f"image {position} of column {column!r} is {image.shape[1]}x{image.shape[2]}, but image 0 is "
                    f"{out.shape[2]}x{out.shape[3]}; accepted: images of one size (resize them beforehand)"
                )
            out[position] = image
            position += 1
    assert out is not None
    return out


def _decode_arrays(
    dataset: datasets.Dataset, column: str, channels: int | None, image_size: int | None
) -> torch.Tensor:
    values = dataset.select_columns([column]).with_format("numpy")[:][column]
    array = np.asarray(values)
    if array.dtype == object:
        raise ValueError(f"the arrays in column {column!r} differ in shape; accepted: images of one size")
    if array.ndim == 3:  # [N, H, W]: grayscale
        array = array[:, None]
    elif array.ndim == 4:  # [N, H, W, C]: channels last, as decoded images are
        array = array.transpose(0, 3, 1, 2)
    else:
        raise ValueError(f"column {column!r} holds {array.ndim - 1}-D arrays; expected [H, W] or [H, W, C]")
    if array.dtype != np.uint8:
        if not np.issubdtype(array.dtype, np.integer) or array.min() < 0 or array.max() > 255:
            raise ValueError(f"column {column!r} must hold 8-bit pixel values 0..255, got dtype {array.dtype}")
        array = array.astype(np.uint8)
    images = match_channels(torch.from_numpy(np.ascontiguousarray(array)), channels)
    _check_size(images.shape[2], images.shape[3], image_size)
    return images


def _check_size(height: int, width: int, image_size: int | None) -> None:
    if image_size is not None and (height, width) != (image_size, image_size):
        raise ValueError(
            f"images are {height}x{width}, expected {image_size}x{image_size}; accepted: the train split's image size"
        )


def decode_images(
    dataset: datasets.Dataset,
    image_column: str,
    *,
    channels: int | None = None,
    image_size: int | None = None,
) -> torch.Tensor:
    """Decode a dataset's image column into one ``uint8`` tensor ``[N, C, H, W]``.

    Parameters
    ----------
    dataset : datasets.Dataset
        Any dataset, possibly a shuffled or selected view of a larger one.
    image_column : str
        A column of encoded images (:func:`is_encoded_image`, decoded with
        ``torchvision.io`` and Pillow as fallback), or a column of ``uint8``
        arrays ``[H, W]`` (grayscale) or ``[H, W, C]``.
    channels : int, optional
        1 or 3. Every image is converted to this many channels (grayscale or
        RGB); by default the first image decides (alpha is dropped).
    image_size : int, optional
        Expected height and width; also the shape of an empty result.

    Raises
    ------
    ValueError
        If the images differ in shape or do not match ``image_size``, or the
        dataset is empty and ``channels`` or ``image_size`` is missing.
    """
    if image_column not in dataset.column_names:
        raise ValueError(f"no column {image_column!r} among {dataset.column_names}")
    if dataset.num_rows == 0:
        if channels is None or image_size is None:
            raise ValueError("an empty dataset needs channels and image_size to shape its tensor")
        return ImageTensors.empty(channels, image_size).images
    if is_encoded_image(dataset.features[image_column]):
        return _decode_encoded(dataset, image_column, channels, image_size)
    return _decode_arrays(dataset, image_column, channels, image_size)


def decode_labels(dataset: datasets.Dataset, label_column: str) -> torch.Tensor:
    """A dataset's integer label column as an ``int64`` tensor ``[N]``."""
    if label_column not in dataset.column_names:
        raise ValueError(f"no column {label_column!r} among {dataset.column_names}")
    if dataset.num_rows == 0:
        return torch.empty((0,), dtype=torch.int64)
    values = dataset.select_columns([label_column]).with_format("numpy")[:][label_column]
    return torch.from_numpy(np.asarray(values, dtype=np.int64))


def to_image_tensors(
    hf_dataset: datasets.Dataset,
    image_column: str,
    label_column: str,
    *,
    channels: int | None = None,
    image_size: int | None = None,
) -> ImageTensors:
    """Decode a Hugging Face dataset of images and labels, once, into tensors.

    Grayscale images give one channel, colour images three (see
    :func:`decode_images` for ``channels`` and ``image_size``).

    Examples
    --------
    >>> import datasets, numpy as np
    >>> ds = datasets.Dataset.from_dict(
    ...     {"image": np.zeros((2, 8, 8), np.uint8), "label": [3, 4]},
    ...     features=datasets.Features({"image": datasets.Array2D((8, 8), "uint8"),
    ...                                 "label": datasets.Value("int64")}))
    >>> data = to_image_tensors(ds, "image", "label")
    >>> tuple(data.images.shape), data.labels.tolist()
    ((2, 1, 8, 8), [3, 4])
    """
    images = decode_images(hf_dataset, image_column, channels=channels, image_size=image_size)
    return ImageTensors(images, decode_labels(hf_dataset, label_column))
