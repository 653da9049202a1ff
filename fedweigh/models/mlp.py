"""One-hidden-layer perceptron for scikit-learn's 8x8 digits."""

from __future__ import annotations

import torch
from torch import nn


class DigitsMLP(nn.Module):
    """Flatten -> ``fc1`` (hidden) -> ReLU -> ``fc2`` (logits).

    Sized for scikit-learn's ``load_digits`` (1x8x8 images, 64 inputs), the
    project's fast CPU smoke-test dataset, but any square image works.

    Parameters
    ----------
    num_classes : int, default 10
        Number of output logits.
    in_channels : int, default 1
        Channels of the input image.
    image_size : int, default 8
        Side length of the square input image.
    hidden : int, default 64
        Width of the hidden layer (keyword only; the registry option
        ``hidden``).

    Attributes
    ----------
    probe_layer : str
        ``"fc1"``, the hidden linear layer; its output is taken before the
        ReLU.
    classifier_layer : str
        ``"fc2"``, the final ``nn.Linear``.

    Raises
    ------
    ValueError
        If ``hidden`` is not a positive integer.

    Examples
    --------
    >>> model = DigitsMLP(hidden=32)
    >>> model(torch.zeros(2, 1, 8, 8)).shape
    torch.Size([2, 10])
    """

    probe_layer: str = "fc1"
    classifier_layer: str = "fc2"

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 8,
        *,
        hidden: int = 64,
    ) -> None:
        super().__init__()
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise ValueError(f"mlp option 'hidden' must be a positive int, got {hidden!r}")
        self.flatten = nn.Flatten(start_dim=1)
        self.fc1 = nn.Linear(in_channels * image_size * image_size, hidden)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch ``[B, C, H, W]`` (or ``[B, C*H*W]``) to logits."""
        return self.fc2(self.relu(self.fc1(self.flatten(x))))
