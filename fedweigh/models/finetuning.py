"""Fine-tuning: which tensors of a model train, and therefore which travel.

Three modes (``fine-tuning``; ``""`` is the model's own: LoRA for the ViTs,
full for every other model):

``full``
    Every parameter trains; every ``state_dict`` entry travels (BatchNorm
    buffers included), as for the models trained from scratch.
``lora``
    ``peft`` LoRA adapters (rank ``lora-rank``, scale ``lora-alpha / rank``,
    dropout ``lora-dropout``) on the modules ``lora-targets`` names (default:
    the model's own targets, the ViT's four attention projections), injected
    in place, so that the model keeps its module names (``probe_layer``,
    ``classifier_layer``). The adapters and the classifier train; the rest is
    frozen.
``head``
    Only the classifier trains (linear probing of a pretrained body).

What travels (:func:`exchanged_keys`) follows from what trains: with a frozen
part, only the trainable parameters and the buffers of the modules that own
trainable parameters. The frozen part never leaves a machine; every party
builds it from the same weights, and :func:`frozen_digest` lets the server
check that a client did. Frozen BatchNorm layers stay in eval mode while the
rest trains (:func:`train_mode`), so that their running statistics, which do
not travel, cannot drift apart.

Example
-------
>>> from torch import nn
>>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
>>> model.classifier_layer = "2"
>>> model = apply_fine_tuning(model, FineTuning(mode="lora", lora_rank=2, lora_targets=("0",)))
>>> exchanged_keys(model)
['0.lora_A.default.weight', '0.lora_B.default.weight', '2.weight', '2.bias']
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

FINE_TUNING_MODES = ("full", "lora", "head")
"""The accepted ``fine-tuning`` values besides ``""`` (the model's own)."""


@dataclass(frozen=True)
class FineTuning:
    """How a model is fine-tuned (the ``fine-tuning`` and ``lora-*`` settings)."""

    mode: str = ""
    lora_rank: int = 4
    lora_alpha: float = 8.0
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = ()  # (): the model's own (its ``lora_targets`` attribute)


def mode_of(model: nn.Module, tuning: FineTuning) -> str:
    """The mode ``tuning`` gives ``model``: its own default when the setting is ``""``."""
    return tuning.mode or getattr(model, "default_fine_tuning", "full")


def target_matches(name: str, targets: tuple[str, ...]) -> bool:
    """peft's rule for a string target: the module's full name, or its dotted suffix."""
    return any(name == target or name.endswith("." + target) for target in targets)


def apply_fine_tuning(model: nn.Module, tuning: FineTuning) -> nn.Module:
    """Freeze, and inject LoRA adapters into, ``model`` as ``tuning`` says; return it.

    Raises
    ------
    ValueError
        Naming the setting: an unknown mode, a LoRA rank below 1, LoRA on a
        model with no default targets and none given, or targets that match
        no module (or only modules LoRA cannot adapt).
    """
    mode = mode_of(model, tuning)
    if mode not in FINE_TUNING_MODES:
        raise ValueError(
            f"setting fine-tuning = {mode!r} is not accepted; accepted: '', {', '.join(FINE_TUNING_MODES)}"
        )
    head = getattr(model, "classifier_layer", "")
    if mode == "full":
        return model
    if not head:
        raise ValueError(f"fine-tuning = {mode!r} trains the classifier, but {type(model).__name__} names none")
    if mode == "lora":
        _inject_lora(model, tuning, head)
    if mode == "head":
        model.requires_grad_(False)
    for parameter in model.get_submodule(head).parameters():
        parameter.requires_grad_(True)
    return model


def _inject_lora(model: nn.Module, tuning: FineTuning, head: str) -> None:
    from peft import LoraConfig, inject_adapter_in_model

    if isinstance(tuning.lora_rank, bool) or not isinstance(tuning.lora_rank, int) or tuning.lora_rank < 1:
        raise ValueError(f"setting lora-rank = {tuning.lora_rank!r}; accepted: an int >= 1")
    targets = tuning.lora_targets or tuple(getattr(model, "lora_targets", ()))
    adaptable = [
        name for name, module in model.named_modules() if isinstance(module, nn.Linear | nn.Conv2d) and name != head
    ]
    examples = ", ".join(adaptable[:6]) + (", ..." if len(adaptable) > 6 else "")
    if not targets:
        raise ValueError(
            f"fine-tuning = 'lora': model {type(model).__name__} has no default LoRA target modules; accepted: "
            f"lora-targets = names (or dotted suffixes) of its Linear or Conv2d modules ({examples or 'it has none'})"
        )
    matched = [name for name, _ in model.named_modules() if target_matches(name, targets)]
    unusable = [name for name in matched if name not in adaptable]
    if not matched or unusable:
        found = f"they match no module of {type(model).__name__}" if not matched else f"{unusable} cannot take LoRA"
        raise ValueError(
            f"setting lora-targets = {','.join(targets)!r}: {found}; accepted: names (or dotted suffixes) of the "
            f"model's Linear or Conv2d modules other than its classifier ({examples or 'it has none'})"
        )
    config = LoraConfig(
        r=tuning.lora_rank,
        lora_alpha=tuning.lora_alpha,
        lora_dropout=tuning.lora_dropout,
        target_modules=list(targets),
        bias="none",
    )
    inject_adapter_in_model(config, model)  # freezes every parameter but the adapters'


def exchanged_keys(model: nn.Module) -> list[str]:
    """The ``state_dict`` keys that travel between server and clients, in ``state_dict`` order.

    Every key when every parameter trains; otherwise the trainable parameters
    and the buffers of the modules that own a trainable parameter.
    """
    if all(p.requires_grad for p in model.parameters()):
        return list(model.state_dict())
    chosen: set[str] = set()
    for prefix, module in model.named_modules():
        trainable = [name for name, p in module.named_parameters(prefix=prefix, recurse=False) if p.requires_grad]
        chosen.update(trainable)
        if trainable:
            chosen.update(name for name, _ in module.named_buffers(prefix=prefix, recurse=False))
    return [key for key in model.state_dict() if key in chosen]


def exchanged_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors that travel (see :func:`exchanged_keys`), detached, on their device."""
    state = model.state_dict()
    return {key: state[key].detach() for key in exchanged_keys(model)}


def load_exchanged_state(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load the tensors that travel into ``model``; the frozen part stays as it is.

    Raises
    ------
    ValueError
        When ``state`` does not hold exactly the model's exchanged tensors
        (for example a full model sent to a LoRA client, or the other way
        round), naming a few of the missing and unexpected keys.
    """
    keys = exchanged_keys(model)
    if set(state) != set(keys):
        missing, extra = sorted(set(keys) - set(state)), sorted(set(state) - set(keys))
        raise ValueError(
            f"the received model does not fit this one's trainable tensors: {len(missing)} missing "
            f"{missing[:3]}, {len(extra)} unexpected {extra[:3]}; server and clients must use the same model, "
            "fine-tuning and lora-* settings"
        )
    model.load_state_dict(dict(state), strict=False)  # strict on the exchanged keys, checked above


def frozen_digest(model: nn.Module) -> str:
    """A short hash of the frozen tensors (names, dtypes, shapes, values); ``""`` when nothing is frozen."""
    exchanged = set(exchanged_keys(model))
    digest = hashlib.blake2b(digest_size=8)
    frozen = [(key, value) for key, value in model.state_dict().items() if key not in exchanged]
    for key, value in frozen:
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest() if frozen else ""


def train_mode(model: nn.Module) -> nn.Module:
    """``model.train()``, except frozen BatchNorm layers (statistics that do not travel), which stay in eval mode."""
    model.train()
    exchanged = set(exchanged_keys(model))
    for name, module in model.named_modules():
        key = f"{name}.running_mean" if name else "running_mean"
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats and key not in exchanged:
            module.eval()
    return model


def trainable_count(model: nn.Module) -> int:
    """Parameters that train."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
