"""Small convolutional networks from the FedOUI and FedNolowe papers.

Three models live here:

* :class:`FedOUICNN`, the CIFAR-10 network of the FedOUI paper (545,098
  parameters for 10 classes on 3x32x32 inputs; no BatchNorm, no dropout).
* :class:`FashionCNN`, the Fashion-MNIST network of the FedNolowe paper
  (688,586 parameters for 10 classes on 1x28x28 inputs).
* :class:`FeddleCNN`, the small "three convolutions, one pooling, two fully
  connected layers" network the Feddle paper trains from scratch, at the size
  its spec gives for a CPU (115,370 parameters on 1x28x28 inputs).

All return logits and name their OUI probe tap (``probe_layer``) and their
final linear layer (``classifier_layer``) so that client code can hook them
with ``model.get_submodule(...)``.
"""

from __future__ import annotations

import torch
from torch import nn

from fedweigh.models import options


def _pooled_size(image_size: int, num_halvings: int, model: str) -> int:
    """Spatial side length after ``num_halvings`` 2x2 max-pools.

    Parameters
    ----------
    image_size : int
        Side length of the square input image.
    num_halvings : int
        Number of ``MaxPool2d(2)`` layers between input and flatten
        (padding-1 3x3 convolutions keep the size).
    model : str
        Model name used in the error message.

    Returns
    -------
    int
        Side length of the final feature map.

    Raises
    ------
    ValueError
        If the feature map would be empty.
    """
    side = image_size
    for _ in range(num_halvings):
        side //= 2
    if side < 1:
        raise ValueError(f"{model} needs image_size >= {2**num_halvings}, got {image_size}")
    return side


class FedOUICNN(nn.Module):
    """The FedOUI paper's two-convolution CIFAR-10 network.

    ``conv1`` (3x3, pad 1, 32 ch) -> ReLU -> MaxPool2 -> ``conv2`` (3x3,
    pad 1, 64 ch) -> ReLU -> MaxPool2 -> flatten -> ``fc1`` (128) -> ReLU ->
    ``fc2`` (logits). With 3x32x32 inputs the flattened size is 4096 and the
    model has 545,098 parameters for 10 classes.

    Parameters
    ----------
    num_classes : int, default 10
        Number of output logits.
    in_channels : int, default 3
        Channels of the input image.
    image_size : int, default 32
        Side length of the square input image; must be at least 4.
    width : int, default 32
        Channels of ``conv1`` (``conv2`` has twice as many; keyword only, the
        option ``model-width``).

    Attributes
    ----------
    probe_layer : str
        ``"fc1"``: its output is the penultimate pre-activation (before the
        ReLU), the layer monitored by FedOUI's OUI.
    classifier_layer : str
        ``"fc2"``, the final ``nn.Linear``.

    Examples
    --------
    >>> model = FedOUICNN()
    >>> sum(p.numel() for p in model.parameters())
    545098
    >>> model(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    """

    cpu_channels_last = True  # faster on CPU in NHWC: see fedweigh.models.on_device

    probe_layer: str = "fc1"
    classifier_layer: str = "fc2"

    def __init__(self, num_classes: int = 10, in_channels: int = 3, image_size: int = 32, *, width: int = 32) -> None:
        super().__init__()
        side = _pooled_size(image_size, 2, "fedoui-cnn")
        channels = options.width("fedoui-cnn", width)
        self.conv1 = nn.Conv2d(in_channels, channels, kernel_size=3, padding=1)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(channels, 2 * channels, kernel_size=3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(2)
        self.flatten = nn.Flatten(start_dim=1)
        self.fc1 = nn.Linear(2 * channels * side * side, 128)
        self.relu3 = nn.ReLU()
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch of images ``[B, C, H, W]`` to logits ``[B, num_classes]``."""
        x = self.pool1(self.relu1(self.conv1(x)))
        x = self.pool2(self.relu2(self.conv2(x)))
        x = self.relu3(self.fc1(self.flatten(x)))
        return self.fc2(x)


class FashionCNN(nn.Module):
    """The FedNolowe paper's three-stage Fashion-MNIST network.

    Three stages of Conv3x3 (pad 1) -> BatchNorm -> ReLU -> MaxPool2 with
    1->32->64->128 channels (28 -> 14 -> 7 -> 3), then flatten (1152) ->
    ``fc1`` (512) -> ReLU -> Dropout(0.3) -> ``fc2`` (logits). The model has
    688,586 parameters for 10 classes on 1x28x28 inputs.

    Parameters
    ----------
    num_classes : int, default 10
        Number of output logits.
    in_channels : int, default 1
        Channels of the input image.
    image_size : int, default 28
        Side length of the square input image; must be at least 8.
    width : int, default 32
        Channels of the first stage (then twice and four times as many;
        keyword only, the option ``model-width``).

    Attributes
    ----------
    probe_layer : str
        ``"fc1"``, the only hidden linear layer; its output is taken before
        the ReLU.
    classifier_layer : str
        ``"fc2"``, the final ``nn.Linear``. Its input already passes through
        the model's own ``nn.Dropout(0.3)``.

    Examples
    --------
    >>> model = FashionCNN()
    >>> sum(p.numel() for p in model.parameters())
    688586
    >>> model(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    """

    cpu_channels_last = True  # faster on CPU in NHWC: see fedweigh.models.on_device

    probe_layer: str = "fc1"
    classifier_layer: str = "fc2"

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28, *, width: int = 32) -> None:
        super().__init__()
        side = _pooled_size(image_size, 3, "fashion-cnn")
        base = options.width("fashion-cnn", width)
        layers: list[nn.Module] = []
        channels = in_channels
        for stage in (base, 2 * base, 4 * base):
            layers += [
                nn.Conv2d(channels, stage, kernel_size=3, padding=1),
                nn.BatchNorm2d(stage),
                nn.ReLU(),
                nn.MaxPool2d(2),
            ]
            channels = stage
        self.features = nn.Sequential(*layers)
        self.flatten = nn.Flatten(start_dim=1)
        self.fc1 = nn.Linear(channels * side * side, 512)
        self.relu = nn.ReLU()
        self.dropout = nn.Dropout(0.3)
        self.fc2 = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch of images ``[B, C, H, W]`` to logits ``[B, num_classes]``."""
        x = self.flatten(self.features(x))
        x = self.dropout(self.relu(self.fc1(x)))
        return self.fc2(x)


class FeddleCNN(nn.Module):
    """The Feddle paper's from-scratch CNN: three convolutions, one pooling layer, two linear layers.

    The paper gives only the layer counts; this is the CPU-sized network of
    its spec (``specs/feddle.md`` §11): ``conv1`` (5x5, pad 2, 16 ch) -> ReLU
    -> MaxPool2 -> ``conv2`` (3x3, stride 2, pad 1, 32 ch) -> ReLU ->
    ``conv3`` (3x3, pad 1, 32 ch) -> ReLU -> flatten -> ``fc1`` (64) -> ReLU
    -> ``fc2`` (logits). The stride-2 convolution stands in for a second
    pooling layer. On 1x28x28 inputs (Fashion-MNIST as it is, rather than
    zero-padded to 32x32) the flattened size is 32x7x7 = 1568 and the model
    has 115,370 parameters for 10 classes; on 32x32 inputs, 2048 and 146,090.

    Parameters
    ----------
    num_classes : int, default 10
    in_channels : int, default 1
    image_size : int, default 28
        Side length of the square input image; at least 4.
    width : int, default 16
        Channels of ``conv1`` (``conv2`` and ``conv3`` have twice as many;
        the option ``model-width``).

    Attributes
    ----------
    probe_layer : str
        ``"fc1"``, the hidden linear layer (before its ReLU).
    classifier_layer : str
        ``"fc2"``, the final ``nn.Linear``: the head that Feddle's
        out-of-distribution search replaces with one of the server's classes.

    Examples
    --------
    >>> model = FeddleCNN()
    >>> sum(p.numel() for p in model.parameters())
    115370
    >>> sum(p.numel() for p in FeddleCNN(image_size=32).parameters())
    146090
    >>> model(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    """

    cpu_channels_last = True  # faster on CPU in NHWC: see fedweigh.models.on_device

    probe_layer: str = "fc1"
    classifier_layer: str = "fc2"

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28, *, width: int = 16) -> None:
        super().__init__()
        channels = options.width("feddle-cnn", width)
        pooled = _pooled_size(image_size, 1, "feddle-cnn")
        side = (pooled - 1) // 2 + 1  # the stride-2 convolution (3x3, pad 1)
        if image_size < 4:
            raise ValueError(f"feddle-cnn needs image_size >= 4, got {image_size}")
        self.conv1 = nn.Conv2d(in_channels, channels, kernel_size=5, padding=2)
        self.relu1 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(channels, 2 * channels, kernel_size=3, stride=2, padding=1)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv2d(2 * channels, 2 * channels, kernel_size=3, padding=1)
        self.relu3 = nn.ReLU()
        self.flatten = nn.Flatten(start_dim=1)
        self.fc1 = nn.Linear(2 * channels * side * side, 64)
        self.relu4 = nn.ReLU()
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch of images ``[B, C, H, W]`` to logits ``[B, num_classes]``."""
        x = self.pool(self.relu1(self.conv1(x)))
        x = self.relu3(self.conv3(self.relu2(self.conv2(x))))
        x = self.relu4(self.fc1(self.flatten(x)))
        return self.fc2(x)
