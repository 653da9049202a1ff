"""Model zoo and registry.

Every model is built through :func:`build_model` from a registry name, the
number of classes, the input channels and the (square) image size, plus
model-specific options. Every built model returns logits only and carries two
string attributes, both usable with ``model.get_submodule``:

``probe_layer``
    The module whose forward **output** is the penultimate pre-activation
    monitored by FedOUI's OUI: the last hidden linear layer, before its ReLU.

    ============  ====================  =========================================
    name          probe_layer           what it is
    ============  ====================  =========================================
    fedoui-cnn    ``fc1``               Linear(4096, 128)
    fashion-cnn   ``fc1``               Linear(1152, 512)
    feddle-cnn    ``fc1``               Linear(1568, 64)
    lenet5        ``fc2``               Linear(256, 128)
    vgg9          ``fc2``               Linear(512, 512)
    mlp           ``fc1``               Linear(64, hidden)
    resnet8       ``layer3.preact``     last block's residual sum before its ReLU
    resnet18      ``layer4.1.preact``   last block's residual sum before its ReLU
    ============  ====================  =========================================

    ResNets have no hidden linear layer; see :mod:`fedweigh.models.resnet`
    for why the tap is the last residual sum (a ``[B, C, H, W]`` tensor to be
    flattened per sample) rather than the non-negative pooled feature.

``classifier_layer``
    The final ``nn.Linear`` producing the logits (``fc2``, ``fc3`` or ``fc``).

A model class may also set ``cpu_channels_last = True``: :func:`on_device`
then keeps its weights channels-last (NHWC) on a CPU, which made the small
CNNs' training 1.4-1.7x and their inference 2.4-3x faster on the project's
machine (PyTorch's NCHW CPU max-pooling alone was 7x slower than NHWC); the
ResNets were not faster and do not set it. Results are the same up to float
rounding; inputs stay NCHW (a convolution with channels-last weights returns
channels-last output).

Examples
--------
>>> from fedweigh.models import build_model
>>> model = build_model("fedoui-cnn", num_classes=10, in_channels=3, image_size=32)
>>> model.probe_layer, model.classifier_layer
('fc1', 'fc2')
>>> build_model("resnet8", 10, 3, 32, width=16).fc.in_features
64
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import nn

from fedweigh.models.cnn import FashionCNN, FeddleCNN, FedOUICNN
from fedweigh.models.lenet import LeNet5BN
from fedweigh.models.mlp import DigitsMLP
from fedweigh.models.vgg import VGG9

# The ResNet adapters import fedweigh.models.resnet when called, not here: it
# builds on torchvision, whose import costs about a second in every process
# that imports this registry (each ClientApp process, for one), ResNet or not.


def _build_resnet8(num_classes: int, in_channels: int, image_size: int, *, width: int = 128) -> nn.Module:
    """Registry adapter for :func:`~fedweigh.models.resnet.resnet8`; ``image_size`` is not needed."""
    from fedweigh.models.resnet import resnet8

    del image_size  # global average pooling accepts any size
    return resnet8(num_classes=num_classes, in_channels=in_channels, width=width)


def _build_resnet18(num_classes: int, in_channels: int, image_size: int, *, width: int = 64) -> nn.Module:
    """Registry adapter for :func:`~fedweigh.models.resnet.resnet18`; ``image_size`` is not needed."""
    from fedweigh.models.resnet import resnet18

    del image_size  # global average pooling accepts any size
    return resnet18(num_classes=num_classes, in_channels=in_channels, width=width)


#: Registry name -> builder called as
#: ``builder(num_classes, in_channels, image_size, **options)``. A builder's
#: keyword-only parameters are the options that model accepts.
MODEL_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "fedoui-cnn": FedOUICNN,
    "fashion-cnn": FashionCNN,
    "feddle-cnn": FeddleCNN,
    "lenet5": LeNet5BN,
    "vgg9": VGG9,
    "resnet8": _build_resnet8,
    "resnet18": _build_resnet18,
    "mlp": DigitsMLP,
}

_CORE_ARGUMENTS = ("num_classes", "in_channels", "image_size")


def model_names() -> list[str]:
    """Return the registered model names, sorted.

    Returns
    -------
    list of str
        The names accepted by :func:`build_model`.
    """
    return sorted(MODEL_BUILDERS)


def model_options(name: str) -> list[str]:
    """Return the option names a registered model accepts.

    Parameters
    ----------
    name : str
        A registry name from :func:`model_names`.

    Returns
    -------
    list of str
        The keyword-only parameters of the model's builder, sorted (for
        example ``["width"]`` for ``"resnet8"``).

    Raises
    ------
    ValueError
        If ``name`` is not registered.
    """
    builder = _builder(name)
    parameters = inspect.signature(builder).parameters.values()
    return sorted(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


def build_model(name: str, num_classes: int, in_channels: int, image_size: int, **options: object) -> nn.Module:
    """Build a freshly initialised model from the registry.

    Parameters
    ----------
    name : str
        One of :func:`model_names`.
    num_classes : int
        Number of output logits (positive).
    in_channels : int
        Channels of the input image (positive).
    image_size : int
        Side length of the square input image (positive). Models with a
        fixed-size flatten use it to size their first linear layer; ResNets
        ignore it.
    **options
        Model-specific options: ``width`` for the CNN and ResNet families,
        ``hidden`` and ``dropout`` for ``"mlp"``; see :func:`model_options`.

    Returns
    -------
    torch.nn.Module
        The model, returning logits, with ``probe_layer`` and
        ``classifier_layer`` attributes (see the module docstring).

    Raises
    ------
    ValueError
        If the name, an option, or a size is not accepted. The message names
        the offending value and what is accepted.
    """
    builder = _builder(name)
    accepted = model_options(name)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"model {name!r} does not accept option(s) {', '.join(map(repr, unknown))}; "
            f"accepted options: {', '.join(accepted) if accepted else '(none)'}"
        )
    for argument, value in zip(_CORE_ARGUMENTS, (num_classes, in_channels, image_size), strict=True):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{argument} must be a positive int for model {name!r}, got {value!r}")
    model = builder(num_classes, in_channels, image_size, **options)
    for attribute in ("probe_layer", "classifier_layer"):
        model.get_submodule(getattr(model, attribute))  # fails loudly on a bad name
    return model


def _builder(name: str) -> Callable[..., nn.Module]:
    """Look up a builder, raising ``ValueError`` that lists the valid names."""
    try:
        return MODEL_BUILDERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model {name!r}; accepted names: {', '.join(model_names())}") from None


def on_device(model: nn.Module, device: torch.device) -> nn.Module:
    """``model`` on ``device``, in the memory format that is fastest there (see the module docstring)."""
    if device.type == "cpu" and getattr(model, "cpu_channels_last", False):
        model = model.to(memory_format=torch.channels_last)
    return model.to(device)
