"""CIFAR-style residual networks: FLood's ResNet-8 and a 32x32 ResNet-18.

Probe tap
---------
A ResNet has no hidden linear layer: the classifier reads the global average
of the last block's ReLU output. That pooled vector is non-negative, so the
sign test of FedOUI's OUI (``a > 0``) on it only detects channels that are
dead on the whole image; it is not a pre-activation. The last point where a
ReLU makes an on/off decision is the **residual sum of the last block,
before its final ReLU**. Every block here routes that sum through a
parameter-free ``nn.Identity`` called ``preact``, so a forward hook on
``<last block>.preact`` sees the pre-activation ``[B, C, H, W]`` (flattened
per sample to ``d = C*H*W`` units by the OUI code). The final ReLU is not in
place, so a tensor captured by the hook keeps its negative entries. The
identity has no parameters, so ``state_dict`` keys are unchanged (the
ResNet-18 keys are exactly torchvision's).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.resnet import BasicBlock, ResNet, conv1x1, conv3x3


class TappedBasicBlock(BasicBlock):
    """torchvision's ``BasicBlock`` with a hookable pre-activation output.

    Computes ``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))`` like the
    parent class, but passes the residual sum through ``self.preact``
    (``nn.Identity``) before a non-in-place final ReLU.

    Parameters
    ----------
    *args, **kwargs
        Forwarded to :class:`torchvision.models.resnet.BasicBlock`
        (``inplanes, planes, stride=1, downsample=None, ...``).
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.preact = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the residual block to ``x`` of shape ``[B, C, H, W]``."""
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.preact(out + shortcut)
        return F.relu(out)


def _block(inplanes: int, planes: int, stride: int) -> TappedBasicBlock:
    """A basic block with a 1x1-conv+BN shortcut when the shape changes."""
    downsample = None
    if stride != 1 or inplanes != planes:
        downsample = nn.Sequential(conv1x1(inplanes, planes, stride), nn.BatchNorm2d(planes))
    return TappedBasicBlock(inplanes, planes, stride, downsample)


class ResNet8(nn.Module):
    """FLood's ResNet-8 for 32x32 images.

    ``conv1`` (3x3, stride 1, pad 1, no bias, ``width`` ch) -> ``bn1`` ->
    ReLU -> ``layer1`` (w -> w, stride 1) -> ``layer2`` (w -> 2w, stride 2)
    -> ``layer3`` (2w -> 4w, stride 2) -> ``avgpool`` (adaptive, 1x1) ->
    ``flatten`` -> ``fc`` (4w -> num_classes). Each layer is one
    :class:`TappedBasicBlock`. With ``width=128`` and 10 classes it has
    4,896,394 parameters. Unlike FLood's code, ``forward`` returns logits
    only; the pooled feature is the output of ``flatten``.

    Parameters
    ----------
    num_classes : int, default 10
        Number of output logits.
    in_channels : int, default 3
        Channels of the input image.
    width : int, default 128
        Channels of the stem and the first block.

    Attributes
    ----------
    probe_layer : str
        ``"layer3.preact"``: the last block's residual sum before its final
        ReLU, shape ``[B, 4w, H/4, W/4]`` (see the module docstring).
    classifier_layer : str
        ``"fc"``, the final ``nn.Linear``.

    Raises
    ------
    ValueError
        If ``width`` is not a positive integer.
    """

    probe_layer: str = "layer3.preact"
    classifier_layer: str = "fc"

    def __init__(self, num_classes: int = 10, in_channels: int = 3, width: int = 128) -> None:
        super().__init__()
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"resnet8 option 'width' must be a positive int, got {width!r}")
        self.conv1 = conv3x3(in_channels, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.layer1 = _block(width, width, stride=1)
        self.layer2 = _block(width, 2 * width, stride=2)
        self.layer3 = _block(2 * width, 4 * width, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten(start_dim=1)
        self.fc = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch of images ``[B, C, H, W]`` to logits ``[B, num_classes]``."""
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(self.flatten(self.avgpool(x)))


def resnet8(num_classes: int = 10, in_channels: int = 3, width: int = 128) -> ResNet8:
    """Build FLood's ResNet-8 (see :class:`ResNet8`).

    Parameters
    ----------
    num_classes : int, default 10
        Number of output logits.
    in_channels : int, default 3
        Channels of the input image.
    width : int, default 128
        Channels of the stem; the blocks use ``width``, ``2*width`` and
        ``4*width``.

    Returns
    -------
    ResNet8
        A freshly initialised model (PyTorch default initialisation).

    Examples
    --------
    >>> model = resnet8(num_classes=10)
    >>> sum(p.numel() for p in model.parameters())
    4896394
    """
    return ResNet8(num_classes=num_classes, in_channels=in_channels, width=width)


def resnet18(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    """Build torchvision's ResNet-18 adapted to 32x32 inputs.

    The network is ``torchvision.models.resnet.ResNet`` with ``[2, 2, 2, 2]``
    basic blocks, exactly what ``torchvision.models.resnet18(weights=None,
    num_classes=num_classes)`` builds, except that

    * the blocks are :class:`TappedBasicBlock` (same parameters and keys,
      plus a hookable ``preact`` identity);
    * ``conv1`` is a 3x3, stride-1, padding-1 convolution without bias from
      ``in_channels`` channels, initialised like torchvision's other
      convolutions (Kaiming normal, ``fan_out``);
    * ``maxpool`` is ``nn.Identity``.

    A 32x32 input therefore reaches ``layer4`` at 4x4. The ``state_dict``
    keys equal torchvision's.

    Parameters
    ----------
    num_classes : int, default 10
        Number of output logits.
    in_channels : int, default 3
        Channels of the input image.

    Returns
    -------
    torchvision.models.ResNet
        The model, with ``probe_layer = "layer4.1.preact"`` (the last block's
        residual sum before its final ReLU, ``[B, 512, H/8, W/8]``) and
        ``classifier_layer = "fc"``.

    Examples
    --------
    >>> model = resnet18(num_classes=10)
    >>> model.conv1.kernel_size, model.conv1.stride
    ((3, 3), (1, 1))
    """
    model = ResNet(TappedBasicBlock, [2, 2, 2, 2], num_classes=num_classes)
    model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    model.maxpool = nn.Identity()
    model.probe_layer = "layer4.1.preact"
    model.classifier_layer = "fc"
    return model
