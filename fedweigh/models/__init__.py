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
    resnet18-     ``layer4.1.preact``   the same, in torchvision's ImageNet layout
    imagenet
    vit-b16,      ``pooled``            the [CLS] feature the head reads
    vit-tiny
    ============  ====================  =========================================

    ResNets have no hidden linear layer; see :mod:`fedweigh.models.resnet`
    for why the tap is the last residual sum (a ``[B, C, H, W]`` tensor to be
    flattened per sample) rather than the non-negative pooled feature.

``classifier_layer``
    The final ``nn.Linear`` producing the logits (``fc2``, ``fc3``, ``fc`` or ``head``).

The pretrained models (:mod:`fedweigh.models.vit`, ``resnet18-imagenet``)
also declare the input they need (:func:`model_input`: 3 x 224 x 224 and the
checkpoint's normalisation), load their weights through
:mod:`fedweigh.models.weights`, and are fine-tuned as
:mod:`fedweigh.models.finetuning` says (LoRA by default for the ViTs), which
also decides which tensors travel.

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
from dataclasses import dataclass

import torch
from torch import nn

from fedweigh.models.cnn import FashionCNN, FeddleCNN, FedOUICNN
from fedweigh.models.lenet import LeNet5BN
from fedweigh.models.mlp import DigitsMLP
from fedweigh.models.vgg import VGG9
from fedweigh.models.vit import vit_b16, vit_tiny  # imports transformers only when a ViT is built

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


def _build_resnet18_imagenet(
    num_classes: int,
    in_channels: int,
    image_size: int,
    *,
    width: int = 64,
    pretrained: bool = False,
    weights: str = "",
    input_size: int = 224,
) -> nn.Module:
    """Registry adapter for :func:`~fedweigh.models.resnet.resnet18_imagenet` (``input_size``: the pipeline's)."""
    from fedweigh.models.resnet import resnet18_imagenet

    del image_size, input_size  # global average pooling accepts any size; the input pipeline resizes
    return resnet18_imagenet(num_classes, in_channels, width=width, pretrained=pretrained, weights=weights)


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
HALF = (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class ModelInput:
    """The input a model needs, when it is not the dataset's own.

    Attributes
    ----------
    size : int or None
        Side of the square input the images are resized to (None: the dataset's).
    channels : int or None
        Channels the images are converted to (grayscale replicated to 3; None: the dataset's).
    mean, std : tuple of float, or None
        Normalisation of the pretrained weights (None: the dataset's own statistics).
    """

    size: int | None = None
    channels: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None


def _pretrained_input(default_size: int, mean: tuple[float, ...], std: tuple[float, ...]) -> Callable[..., ModelInput]:
    def needs(pretrained: bool = False, input_size: int = default_size, **_: object) -> ModelInput:
        return ModelInput(input_size, 3, mean if pretrained else None, std if pretrained else None)

    return needs


#: Registry name -> the input it needs from its options (a model not listed takes the dataset's images as they are).
#: ImageNet-1k weights (torchvision) expect ImageNet's statistics; Google's ViT checkpoints expect mean = std = 0.5.
MODEL_INPUTS: dict[str, Callable[..., ModelInput]] = {
    "resnet18-imagenet": _pretrained_input(224, IMAGENET_MEAN, IMAGENET_STD),
    "vit-b16": _pretrained_input(224, HALF, HALF),
    "vit-tiny": _pretrained_input(32, HALF, HALF),
}


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
    "resnet18-imagenet": _build_resnet18_imagenet,
    "vit-b16": vit_b16,
    "vit-tiny": vit_tiny,
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


def model_input(name: str, **options: object) -> ModelInput:
    """The input ``name`` needs with ``options`` (see :class:`ModelInput`).

    >>> model_input("vit-b16", pretrained=True)
    ModelInput(size=224, channels=3, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    >>> model_input("mlp")
    ModelInput(size=None, channels=None, mean=None, std=None)
    """
    _builder(name)
    needs = MODEL_INPUTS.get(name)
    return needs(**options) if needs else ModelInput()


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
