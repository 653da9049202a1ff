"""Mini-batches of decoded images, with each sample's local index.

A plain generator over an :class:`~fedweigh.data.tensors.ImageTensors`
replaces ``torch.utils.data.DataLoader``: the data is already decoded in
memory, so a batch is one indexing operation and worker processes would only
add overhead. Each batch carries the local indices of its samples, so that a
method can look up per-sample state (e.g. a loss weight) by index.

Example
-------
>>> import torch
>>> from fedweigh.data.tensors import ImageTensors
>>> data = ImageTensors(torch.zeros(5, 1, 2, 2, dtype=torch.uint8), torch.arange(5))
>>> [indices.tolist() for _, _, indices in batches(data, 2, shuffle=False)]
[[0, 1], [2, 3], [4]]
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from fedweigh.data.tensors import ImageTensors

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""``(images uint8 [B, C, H, W], labels int64 [B], local indices int64 [B])``."""


def batches(
    data: ImageTensors,
    batch_size: int,
    *,
    shuffle: bool,
    generator: torch.Generator | None = None,
) -> Iterator[Batch]:
    """One epoch over ``data`` in batches of ``batch_size`` (the last may be smaller).

    Parameters
    ----------
    data : ImageTensors
        The samples; batches live on the same device.
    batch_size : int
        Samples per batch; the last batch holds the remainder (no drop_last).
    shuffle : bool
        Visit the samples in a random order (drawn from ``generator``) rather
        than in order.
    generator : torch.Generator, optional
        Source of the order when shuffling, for reproducible epochs.

    Yields
    ------
    images, labels, indices : torch.Tensor
        ``indices`` are positions in ``data``: every index appears exactly
        once per epoch.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    total = len(data)
    device = data.labels.device
    if shuffle:
        draw_device = generator.device if generator is not None else torch.device("cpu")
        order = torch.randperm(total, generator=generator, device=draw_device).to(device)
        for start in range(0, total, batch_size):
            indices = order[start : start + batch_size]
            yield data.images[indices], data.labels[indices], indices
    else:
        for start in range(0, total, batch_size):
            stop = min(start + batch_size, total)
            yield data.images[start:stop], data.labels[start:stop], torch.arange(start, stop, device=device)
