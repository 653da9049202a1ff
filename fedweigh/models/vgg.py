"""VGG-9 with BatchNorm, the FedNolowe paper's CIFAR-10 network."""

from __future__ import annotations

import torch
from torch import nn

from fedweigh.models import options

#: Convolution widths of VGG-9; ``"M"`` is a 2x2 max-pool.
VGG9_CONFIG: tuple[int | str, ...] = (64, 64, "M", 128, 128, "M", 256, 256, "M")


class VGG9(nn.Module):
    """VGG-9: six 3x3 conv-BN-ReLU layers, three pools, a three-layer head.

    ``features`` follows :data:`VGG9_CONFIG` (each convolution is 3x3 with
    padding 1 and bias, followed by BatchNorm and ReLU), then flatten (4096
    for 32x32 inputs) -> ``fc1`` (512) -> ReLU -> Dropout(0.5) -> ``fc2``
    (512) -> ReLU -> Dropout(0.5) -> ``fc3`` (logits). The model has
    3,512,650 parameters for 10 classes on 3x32x32 inputs.

    Parameters
    ----------
    num_classes : int, default 10
        Number of output logits.
    in_channels : int, default 3
        Channels of the input image.
    image_size : int, default 32
        Side length of the square input image; must be at least 8.
    width : int, default 64
        Channels of the first convolutions; the others scale with it as in
        :data:`VGG9_CONFIG` (keyword only, the option ``model-width``).

    Attributes
    ----------
    probe_layer : str
        ``"fc2"``, the last hidden linear layer; its output is taken before
        its ReLU.
    classifier_layer : str
        ``"fc3"``, the final ``nn.Linear``. Its input already passes through
        the model's own ``nn.Dropout(0.5)``.

    Raises
    ------
    ValueError
        If ``image_size`` leaves no spatial extent after the third pool.

    Examples
    --------
    >>> model = VGG9()
    >>> sum(p.numel() for p in model.parameters())
    3512650
    >>> model(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    """

    cpu_channels_last = True  # faster on CPU in NHWC: see fedweigh.models.on_device

    probe_layer: str = "fc2"
    classifier_layer: str = "fc3"

    def __init__(self, num_classes: int = 10, in_channels: int = 3, image_size: int = 32, *, width: int = 64) -> None:
        super().__init__()
        scale = options.width("vgg9", width) / VGG9_CONFIG[0]
        layers: list[nn.Module] = []
        channels = in_channels
        side = image_size
        for item in VGG9_CONFIG:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
                side //= 2
            else:
                out = max(1, round(int(item) * scale))
                layers += [
                    nn.Conv2d(channels, out, kernel_size=3, padding=1),
                    nn.BatchNorm2d(out),
                    nn.ReLU(),
                ]
                channels = out
        if side < 1:
            raise ValueError(f"vgg9 needs image_size >= 8, got {image_size}")
        self.features = nn.Sequential(*layers)
        self.flatten = nn.Flatten(start_dim=1)
        self.fc1 = nn.Linear(channels * side * side, 512)
        self.relu1 = nn.ReLU()
        self.dropout1 = nn.Dropout(0.5)
        self.fc2 = nn.Linear(512, 512)
        self.relu2 = nn.ReLU()
        self.dropout2 = nn.Dropout(0.5)
        self.fc3 = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch of images ``[B, C, H, W]`` to logits ``[B, num_classes]``."""
        x = self.flatten(self.features(x))
        x = self.dropout1(self.relu1(self.fc1(x)))
        x = self.dropout2(self.relu2(self.fc2(x)))
        return self.fc3(x)
