"""LeNet-5 with BatchNorm, the FedNolowe paper's MNIST network."""

from __future__ import annotations

import torch
from torch import nn

from fedweigh.models import options


class LeNet5BN(nn.Module):
    """LeNet-5 variant with BatchNorm and dropout (FedNolowe, MNIST).

    ``Conv2d(1,32,5)`` -> BN -> ReLU -> MaxPool2 -> ``Conv2d(32,64,5)`` -> BN
    -> ReLU -> MaxPool2 -> flatten (1024) -> ``fc1`` (256) -> ReLU ->
    Dropout(0.5) -> ``fc2`` (128) -> ReLU -> ``fc3`` (logits). Spatial sizes
    for a 28x28 input: 28 -> 24 -> 12 -> 8 -> 4. The model has 348,874
    parameters for 10 classes on 1x28x28 inputs.

    Parameters
    ----------
    num_classes : int, default 10
        Number of output logits.
    in_channels : int, default 1
        Channels of the input image.
    image_size : int, default 28
        Side length of the square input image; must be at least 16.
    width : int, default 32
        Channels of ``conv1`` (``conv2`` has twice as many; keyword only, the
        option ``model-width``).

    Attributes
    ----------
    probe_layer : str
        ``"fc2"``, the last hidden linear layer; its output is taken before
        its ReLU.
    classifier_layer : str
        ``"fc3"``, the final ``nn.Linear``.

    Raises
    ------
    ValueError
        If ``image_size`` leaves no spatial extent after the second pool.

    Examples
    --------
    >>> model = LeNet5BN()
    >>> sum(p.numel() for p in model.parameters())
    348874
    >>> model(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    """

    cpu_channels_last = True  # faster on CPU in NHWC: see fedweigh.models.on_device

    probe_layer: str = "fc2"
    classifier_layer: str = "fc3"

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28, *, width: int = 32) -> None:
        super().__init__()
        side = ((image_size - 4) // 2 - 4) // 2
        if image_size < 16 or side < 1:
            raise ValueError(f"lenet5 needs image_size >= 16, got {image_size}")
        channels = options.width("lenet5", width)
        self.conv1 = nn.Conv2d(in_channels, channels, kernel_size=5)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(channels, 2 * channels, kernel_size=5)
        self.bn2 = nn.BatchNorm2d(2 * channels)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(2)
        self.flatten = nn.Flatten(start_dim=1)
        self.fc1 = nn.Linear(2 * channels * side * side, 256)
        self.relu3 = nn.ReLU()
        self.dropout = nn.Dropout(0.5)
        self.fc2 = nn.Linear(256, 128)
        self.relu4 = nn.ReLU()
        self.fc3 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch of images ``[B, C, H, W]`` to logits ``[B, num_classes]``."""
        x = self.pool1(self.relu1(self.bn1(self.conv1(x))))
        x = self.pool2(self.relu2(self.bn2(self.conv2(x))))
        x = self.dropout(self.relu3(self.fc1(self.flatten(x))))
        x = self.relu4(self.fc2(x))
        return self.fc3(x)
