"""Vision Transformers from Hugging Face ``transformers``: ViT-B/16, and a tiny one of the same architecture.

Why ``transformers`` (and not torchvision or timm)
--------------------------------------------------
* Its attention has separate query, key, value and output projections
  (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``), which is what LoRA
  adapts one by one and what ``peft`` targets by name; torchvision's ViT fuses
  them into one ``nn.MultiheadAttention`` (peft adapts it only as a whole,
  experimentally) and timm's into one ``qkv`` linear layer.
* The checkpoint the Feddle paper fine-tunes is the supervised ImageNet-21k
  ViT-B/16 (spec ``feddle.md`` A20), published on the Hub as
  ``google/vit-base-patch16-224-in21k``; torchvision only has ImageNet-1k
  ViTs. Any other Hub ViT, or a folder written by ``save_pretrained``, loads
  the same way (``model-weights``).
* ``peft`` depends on ``transformers`` already, so it adds no dependency.

The model
---------
:class:`ViTClassifier` is a ``ViTModel`` without its pooler, a parameter-free
``pooled`` tap on the final [CLS] representation, and a fresh linear ``head``.
It returns logits only, like every model here.

* ``probe_layer = "pooled"``: FedOUI's OUI reads the [CLS] feature the head
  reads (the pre-activation before the head). ``oui.probe-layer`` can name
  another module, for example ``vit.layers.11.mlp.fc1`` (the last block's
  pre-GELU activations, a ``[B, T, 4d]`` tensor flattened per sample).
* MC dropout (UFL): the ViT's own dropout when ``model-dropout`` > 0 (its
  ``hidden_dropout_prob``), otherwise one inserted before the head (the
  ``ufl.dropout`` probability), as for every model without dropout.
* Energy scores (FLood) read the logits, as for every model.

:data:`LORA_TARGETS` are the default LoRA target modules (the four attention
projections, spec A19: rank 4 on them in 12 layers is the paper's ~0.3M
trainable parameters with the head).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fedweigh.models import options
from fedweigh.models import weights as weights_module

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
"""The attention projections of every layer: LoRA's default targets for a ViT."""

VIT_B16: dict[str, Any] = {
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "patch_size": 16,
    "image_size": 224,
}
"""ViT-B/16 (86M parameters in the body)."""

VIT_TINY: dict[str, Any] = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "patch_size": 8,
}
"""ViT-B/16's architecture at toy size (about 26K parameters) for tests and CPU smoke runs; image size an option."""


class ViTClassifier(nn.Module):
    """A ``transformers`` ``ViTModel`` body, the [CLS] feature, and a linear head returning logits.

    Parameters
    ----------
    body : transformers.ViTModel
        Built without a pooling layer.
    num_classes : int
        Outputs of the new head.
    """

    probe_layer: str = "pooled"
    classifier_layer: str = "head"
    lora_targets: tuple[str, ...] = LORA_TARGETS
    default_fine_tuning: str = "lora"

    def __init__(self, body: nn.Module, num_classes: int) -> None:
        super().__init__()
        self.vit = body
        self.pooled = nn.Identity()
        self.head = nn.Linear(body.config.hidden_size, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images ``[B, 3, S, S]`` (S the configured image size) to logits ``[B, num_classes]``."""
        hidden = self.vit(pixel_values=x).last_hidden_state
        return self.head(self.pooled(hidden[:, 0]))


def _config(name: str, architecture: dict[str, Any], dropout: float) -> Any:
    from transformers import ViTConfig

    p = options.dropout(name, dropout)
    return ViTConfig(**architecture, num_channels=3, hidden_dropout_prob=p, attention_probs_dropout_prob=0.0)


def _body(name: str, config: Any, pretrained: bool, weights: str) -> nn.Module:
    """A ``ViTModel`` of ``config``: fresh, or loaded from the checkpoint ``weights`` names."""
    from transformers import ViTModel

    if not pretrained:
        return ViTModel(config, add_pooling_layer=False)
    source = weights_module.fetch(name, weights)
    if source.is_file() or not (source / "config.json").is_file():
        body = ViTModel(config, add_pooling_layer=False)
        state = weights_module.read_state_dict(weights_module.state_dict_file(source))
        state = {key.removeprefix("vit."): value for key, value in state.items() if not key.startswith("classifier.")}
        state = {key: value for key, value in state.items() if not key.startswith("pooler.")}
        try:
            body.load_state_dict(state)
        except RuntimeError as err:
            raise weights_module.WeightsUnavailable(
                f"setting model-weights = {weights!r} does not fit model {name!r}: {str(err).splitlines()[0]}"
            ) from err
        return body
    try:
        return ViTModel.from_pretrained(str(source), config=config, add_pooling_layer=False)
    except (OSError, ValueError, RuntimeError) as err:
        raise weights_module.WeightsUnavailable(
            f"setting model-weights = {weights or str(source)!r} does not hold a checkpoint of model {name!r}: "
            f"{str(err).splitlines()[0] if str(err) else type(err).__name__}"
        ) from err


def vit_b16(
    num_classes: int,
    in_channels: int,
    image_size: int,
    *,
    pretrained: bool = False,
    weights: str = "",
    dropout: float = 0.0,
) -> ViTClassifier:
    """ViT-B/16 at 224x224 with a new head; ImageNet-21k weights when ``pretrained``.

    ``in_channels`` and ``image_size`` are the model's input (3, 224: the
    input pipeline resizes and replicates channels to them).

    Examples
    --------
    >>> model = vit_b16(10, 3, 224)
    >>> sum(p.numel() for p in model.vit.parameters()), model.head
    (85798656, Linear(in_features=768, out_features=10, bias=True))
    """
    del in_channels, image_size  # fixed by the architecture: 3 x 224 x 224
    body = _body("vit-b16", _config("vit-b16", VIT_B16, dropout), pretrained, weights)
    return ViTClassifier(body, num_classes)


def vit_tiny(
    num_classes: int,
    in_channels: int,
    image_size: int,
    *,
    pretrained: bool = False,
    weights: str = "",
    dropout: float = 0.0,
    input_size: int = 32,
) -> ViTClassifier:
    """ViT-B/16's architecture at toy size (2 layers, width 32, patch 8) for ``input_size`` images.

    Random weights, unless ``pretrained`` with a local ``weights`` checkpoint
    of the same configuration (it has no published weights).

    Examples
    --------
    >>> model = vit_tiny(10, 3, 32)
    >>> model(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    """
    del in_channels, image_size
    size = options.positive_int("vit-tiny", "input_size", input_size)
    if size % VIT_TINY["patch_size"]:
        raise ValueError(
            f"vit-tiny option 'input_size' must be a multiple of the patch size {VIT_TINY['patch_size']}, got {size}"
        )
    config = _config("vit-tiny", {**VIT_TINY, "image_size": size}, dropout)
    return ViTClassifier(_body("vit-tiny", config, pretrained, weights), num_classes)
