"""CIFAR-style residual networks: FLood's ResNet-8 and a 32x32 ResNet-18, each with a width option.

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
from torchvision.models.resnet import BasicBlock, conv1x1, conv3x3

from fedweigh.models import options
from fedweigh.models import weights as weights_module


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
        width = options.width("resnet8", width)
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


class ResNet18(nn.Module):
    """torchvision's ResNet-18, adapted to 32x32 inputs, with a width option.

    ``conv1`` (3x3, stride 1, pad 1, no bias, ``width`` ch) -> ``bn1`` ->
    ReLU -> ``maxpool`` (``nn.Identity``) -> ``layer1`` .. ``layer4`` (two
    :class:`TappedBasicBlock` each: ``w``, ``2w`` (stride 2), ``4w`` (stride
    2), ``8w`` (stride 2)) -> ``avgpool`` -> flatten -> ``fc``. With the
    default ``width = 64`` it is exactly torchvision's ResNet-18 except for
    the stem (3x3, stride 1, no max-pool) and has the same ``state_dict``
    keys; initialisation as torchvision's (Kaiming normal ``fan_out`` for the
    convolutions, BatchNorm at 1 and 0).

    Parameters
    ----------
    num_classes : int, default 10
    in_channels : int, default 3
    width : int, default 64
        Channels of the stem and ``layer1``.
    imagenet_stem : bool, default False
        torchvision's own stem (7x7 convolution with stride 2 and a max-pool)
        for 224x224 inputs, exactly torchvision's ``resnet18`` architecture:
        see :func:`resnet18_imagenet`.
    """

    probe_layer: str = "layer4.1.preact"
    classifier_layer: str = "fc"

    def __init__(
        self, num_classes: int = 10, in_channels: int = 3, width: int = 64, imagenet_stem: bool = False
    ) -> None:
        super().__init__()
        width = options.width("resnet18", width)
        if imagenet_stem:  # torchvision's: 7x7 stride 2, then a 3x3 stride-2 max-pool (224x224 inputs)
            self.conv1 = nn.Conv2d(in_channels, width, kernel_size=7, stride=2, padding=3, bias=False)
            self.maxpool: nn.Module = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        else:
            self.conv1 = nn.Conv2d(in_channels, width, kernel_size=3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        channels = width
        for index, (stage, stride) in enumerate(((width, 1), (2 * width, 2), (4 * width, 2), (8 * width, 2)), 1):
            self.add_module(f"layer{index}", nn.Sequential(_block(channels, stage, stride), _block(stage, stage, 1)))
            channels = stage
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(channels, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.constant_(module.weight, 1)
                nn.init.constant_(module.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch of images ``[B, C, H, W]`` to logits ``[B, num_classes]``."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 10, in_channels: int = 3, width: int = 64) -> ResNet18:
    """Build the 32x32 ResNet-18 (see :class:`ResNet18`).

    Examples
    --------
    >>> model = resnet18(num_classes=10)
    >>> model.conv1.kernel_size, model.conv1.stride, sum(p.numel() for p in model.parameters())
    ((3, 3), (1, 1), 11173962)
    """
    return ResNet18(num_classes=num_classes, in_channels=in_channels, width=width)


def resnet18_imagenet(
    num_classes: int = 10, in_channels: int = 3, *, width: int = 64, pretrained: bool = False, weights: str = ""
) -> ResNet18:
    """torchvision's ResNet-18 for 224x224 inputs, optionally with its ImageNet weights and a new head.

    The architecture, parameter names and initialisation are torchvision's
    ``resnet18`` (11,181,642 parameters for 10 classes); the last block's
    residual sum is hookable as in :class:`ResNet18`. With ``pretrained`` every
    tensor but the classifier ``fc`` comes from the ImageNet checkpoint
    (:mod:`fedweigh.models.weights`: torchvision's store, or the local file
    ``weights``); ``fc`` is a fresh ``Linear(512, num_classes)``.

    Raises
    ------
    ValueError
        If pretrained weights are asked for a shape they do not have
        (``in_channels`` other than 3, ``width`` other than 64), or cannot be
        had (:class:`~fedweigh.models.weights.WeightsUnavailable`).

    Examples
    --------
    >>> model = resnet18_imagenet(num_classes=10)
    >>> model.conv1.kernel_size, sum(p.numel() for p in model.parameters())
    ((7, 7), 11181642)
    """
    model = ResNet18(num_classes=num_classes, in_channels=in_channels, width=width, imagenet_stem=True)
    if not pretrained:
        return model
    if in_channels != 3 or width != 64:
        raise ValueError(
            f"model-pretrained = true: the ImageNet weights of resnet18-imagenet are for 3 channels and width 64, "
            f"not {in_channels} channels and model-width = {width}; accepted: model-width = 0 (the model's own)"
        )
    source = weights_module.fetch("resnet18-imagenet", weights)
    state = weights_module.read_state_dict(weights_module.state_dict_file(source))
    body = {name: value for name, value in state.items() if not name.startswith("fc.")}
    expected = {name for name in model.state_dict() if not name.startswith("fc.")}
    if set(body) != expected:
        missing, extra = sorted(expected - set(body))[:5], sorted(set(body) - expected)[:5]
        raise weights_module.WeightsUnavailable(
            f"setting model-weights = {weights!r} does not hold a torchvision ResNet-18 state_dict "
            f"(missing {missing}, unexpected {extra})"
        )
    model.load_state_dict(body, strict=False)  # strict on the body (checked above); fc stays fresh
    return model
