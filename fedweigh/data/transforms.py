"""Batch-level image transforms, run on the training device.

Per-image PIL transforms cost tens of microseconds per image on the CPU; the
same work done once per batch, vectorised on whatever device holds the batch,
is much cheaper. The pipeline matches torchvision's usual CIFAR recipe
``RandomCrop(32, padding=4) -> RandomHorizontalFlip -> ToTensor -> Normalize``:
pixels are scaled to ``[0, 1]``, padded with zeros (black) and cropped, flipped,
and only then normalised.

Example
-------
>>> import torch
>>> batch = torch.full((2, 3, 32, 32), 255, dtype=torch.uint8)
>>> normalize(batch, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)).unique().tolist()
[1.0]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from fedweigh.data.description import DatasetInfo


def to_unit_float(images: torch.Tensor) -> torch.Tensor:
    """``uint8`` pixels scaled to ``float32`` in ``[0, 1]``; float input passes through as float32."""
    if images.dtype == torch.uint8:
        return images.float().div_(255.0)
    return images.float()


def normalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """Per-channel ``(x - mean) / std`` of a batch ``[N, C, H, W]``.

    Parameters
    ----------
    images : torch.Tensor
        ``uint8`` pixels 0..255 (scaled to ``[0, 1]`` first), or float pixels
        already in ``[0, 1]``.
    mean, std : sequence of float
        One value per channel, for pixels in ``[0, 1]``.

    Returns
    -------
    torch.Tensor
        ``float32`` on the device of ``images``.
    """
    channels = images.shape[1]
    if len(mean) != channels or len(std) != channels:
        raise ValueError(f"{channels} channels but {len(mean)} means and {len(std)} stds")
    x = to_unit_float(images)
    shift = torch.as_tensor(mean, dtype=x.dtype, device=x.device).view(1, channels, 1, 1)
    scale = torch.as_tensor(std, dtype=x.dtype, device=x.device).view(1, channels, 1, 1)
    return (x - shift) / scale


def random_crop_flip(images: torch.Tensor, padding: int = 4, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random crop after zero padding, and random horizontal flip, per sample.

    Each image of the batch is padded with ``padding`` zeros on every side,
    cropped back to its size at an offset drawn uniformly from
    ``0 .. 2 * padding`` in each direction, and mirrored left-right with
    probability 1/2: torchvision's ``RandomCrop(size, padding)`` and
    ``RandomHorizontalFlip()``, for a whole batch in two indexing operations.

    Parameters
    ----------
    images : torch.Tensor
        Batch ``[N, C, H, W]``, any dtype, any device.
    padding : int
        Zero padding on each side (0: flip only).
    generator : torch.Generator, optional
        Source of the random offsets and flips (on its own device; the draws
        are moved to the batch's device), for reproducible augmentation.

    Returns
    -------
    torch.Tensor
        A new batch with the shape, dtype and device of ``images``.

    Examples
    --------
    >>> import torch
    >>> batch = torch.arange(2 * 1 * 4 * 4, dtype=torch.float32).view(2, 1, 4, 4)
    >>> out = random_crop_flip(batch, padding=1, generator=torch.Generator().manual_seed(0))
    >>> out.shape
    torch.Size([2, 1, 4, 4])
    """
    if padding < 0:
        raise ValueError(f"padding must be >= 0, got {padding}")
    n, _, height, width = images.shape
    draw_device = generator.device if generator is not None else torch.device("cpu")
    offsets = torch.randint(0, 2 * padding + 1, (n, 2), generator=generator, device=draw_device)
    flips = torch.randint(0, 2, (n,), generator=generator, device=draw_device).bool()
    offsets, flips = offsets.to(images.device), flips.to(images.device)

    padded = F.pad(images, (padding, padding, padding, padding)) if padding else images
    rows = offsets[:, :1] + torch.arange(height, device=images.device)  # [N, H]
    columns = torch.arange(width, device=images.device).expand(n, width)
    columns = torch.where(flips[:, None], width - 1 - columns, columns) + offsets[:, 1:]  # [N, W]
    samples = torch.arange(n, device=images.device)[:, None, None]
    # Advanced indices on dims 0, 2, 3 around a slice: the result is [N, H, W, C].
    cropped = padded[samples, :, rows[:, :, None], columns[:, None, :]]
    return cropped.permute(0, 3, 1, 2).contiguous()


class BatchTransform:
    """The transform of a dataset's batches: augmentation (training only), then normalisation.

    Parameters
    ----------
    info : DatasetInfo
        Supplies ``mean``, ``std`` and the ``augment`` kind.
    augment : bool
        Whether to augment training batches at all; with ``True`` the
        dataset's kind applies (``"crop-flip"``: :func:`random_crop_flip`
        with padding 4; ``"none"``: nothing).
    size : int, optional
        Side the batches are resized to for the model (a pretrained model's
        224); None or the dataset's own size: no resizing.
    channels : int, optional
        3 to replicate grayscale images to three channels.
    mean, std : sequence of float, optional
        Normalisation of a pretrained model's weights, replacing the
        dataset's own statistics.
    per_feature : pair of torch.Tensor, optional
        Mean and std of every pixel, each ``[C, H, W]`` (``normalization =
        'feature'``): ``(x - mean) / std`` element-wise instead of per channel.
        Only at the dataset's own size and channels, without ``mean``/``std``.

    Examples
    --------
    >>> import torch
    >>> from fedweigh.data.description import DatasetInfo
    >>> info = DatasetInfo(10, 3, 32, (0.5,) * 3, (0.25,) * 3, "crop-flip", "img", "label")
    >>> transform = BatchTransform(info, augment=True)
    >>> transform(torch.zeros(8, 3, 32, 32, dtype=torch.uint8), train=True).shape
    torch.Size([8, 3, 32, 32])
    >>> gray = DatasetInfo(10, 1, 28, (0.3,), (0.3,), "none", "image", "label")
    >>> BatchTransform(gray, augment=False, size=224, channels=3)(torch.zeros(2, 1, 28, 28), train=False).shape
    torch.Size([2, 3, 224, 224])
    """

    padding = 4

    def __init__(
        self,
        info: DatasetInfo,
        augment: bool,
        *,
        size: int | None = None,
        channels: int | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        per_feature: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        self.channels = channels if channels and channels != info.in_channels else None
        if self.channels not in (None, 3) or (self.channels == 3 and info.in_channels != 1):
            raise ValueError(f"cannot turn {info.in_channels}-channel images into {channels} channels")
        replicate = 3 if self.channels else 1
        self.mean = tuple(mean) if mean is not None else tuple(info.mean) * replicate
        self.std = tuple(std) if std is not None else tuple(info.std) * replicate
        expected = self.channels or info.in_channels
        if len(self.mean) != expected or len(self.std) != expected:
            raise ValueError(
                f"normalisation mean {self.mean} and std {self.std} need one value per input channel, {expected} here"
            )
        self.size = size if size and size != info.image_size else None
        self.crop_flip = bool(augment) and info.augment == "crop-flip"
        shape = (info.in_channels, info.image_size, info.image_size)
        if per_feature is not None and (
            self.size or self.channels or mean is not None or per_feature[0].shape != shape
        ):
            raise ValueError(
                "normalization = 'feature' standardises every pixel of the dataset's own images; the model needs "
                "another input size, channels or normalisation; accepted: normalization = 'channel' with this model"
            )
        self.per_feature = per_feature

    def __repr__(self) -> str:
        return (
            f"BatchTransform(mean={self.mean}, std={self.std}, crop_flip={self.crop_flip}, "
            f"size={self.size}, channels={self.channels})"
        )

    def __call__(self, images: torch.Tensor, train: bool, generator: torch.Generator | None = None) -> torch.Tensor:
        """Float batch ready for the model, on the device of ``images``.

        Augmentation (training only) runs at the images' own size; then the
        batch is resized to the model's input (bilinear), grayscale is
        replicated to three channels, and the result is normalised.

        Parameters
        ----------
        images : torch.Tensor
            ``uint8`` batch ``[N, C, H, W]``.
        train : bool
            Augment (if enabled) when true; evaluation batches are only normalised.
        generator : torch.Generator, optional
            Seeds the augmentation.
        """
        x = to_unit_float(images)
        if train and self.crop_flip:
            x = random_crop_flip(x, self.padding, generator)
        if self.size is not None:
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False, antialias=False)
        if self.channels is not None:
            x = x.expand(-1, self.channels, -1, -1)
        if self.per_feature is not None:
            mean, std = self.per_feature
            return (x - mean.to(x.device, x.dtype)) / std.to(x.device, x.dtype)
        return normalize(x, self.mean, self.std)
