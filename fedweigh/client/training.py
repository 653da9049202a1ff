"""Local training and evaluation, with room for per-sample loss weights.

The loop is written once for every method; the server's
:class:`~fedweigh.protocol.TrainRecipe` says how it runs (epochs, batch size,
SGD with momentum or Adam, learning rate, weight decay, proximal term). A method that re-weights its own
samples (UFL's uncertainty weights, FLood's energy-score weights) passes a
:class:`SampleWeighting`: given a batch's logits, labels and the samples'
local indices it returns one weight per sample, and the batch loss becomes

    sum_i w_i * CE_i / B            (default, as UFL's paper does), or
    sum_i w_i * CE_i / sum_i w_i    (``normalize=True``).

FedProx's proximal term ``mu/2 * ||w - w_global||^2`` is added when
``proximal_mu > 0``, and a client step's loss terms (MOON's, FedDecorr's) are
added unweighted. The reported ``train_loss`` is the per-sample mean of
the plain (unweighted) cross-entropy over all local epochs, each batch's loss
taken before its step: exactly the quantity FedNolowe weighs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from fedweigh.data.loader import batches
from fedweigh.data.tensors import ImageTensors
from fedweigh.data.transforms import BatchTransform
from fedweigh.models.finetuning import train_mode
from fedweigh.protocol import TrainRecipe

OptimizerState = dict[str, torch.Tensor]
"""An optimizer's state by ``"<parameter name>/<slot>"`` (``fc1.weight/momentum_buffer``), on the CPU."""


def seed_torch(seed: int, device: torch.device) -> None:
    """Seed torch's global random generators for work on ``device`` (dropout draws from them).

    On an accelerator this is ``torch.manual_seed``. On the CPU only the CPU
    generator is used, and only it is seeded: with a torch build that has
    CUDA, ``torch.manual_seed`` also queues a seeding of every accelerator
    for when one starts, and records a stack trace to do so (0.4 ms a call,
    once a message). The CPU's random draws are the same either way.
    """
    if device.type == "cpu":
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


class SampleWeighting(Protocol):
    """Per-sample loss weights for one batch (see the module docstring)."""

    normalize: bool

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor) -> torch.Tensor: ...


class LossTerm(Protocol):
    """A term added to every batch's loss: ``term(features, inputs)``, a scalar with a gradient.

    ``features`` are the batch's features under the model being trained (the
    input of its classifier, ``[B, d]``, :func:`features_of`), ``inputs`` the
    batch as the model took it.
    """

    def __call__(self, features: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class TrainStats:
    """What local training reports."""

    train_loss: float
    num_examples: int
    steps: int
    seconds: float
    cpu_seconds: float  # the calling thread's CPU time (time.thread_time) over the same span
    optimizer_state: OptimizerState | None = None  # kept when the recipe asks (persist-optimizer-state)


def weighted_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None, normalize: bool = False
) -> torch.Tensor:
    """Batch loss ``sum(w * CE) / B`` (or ``/ sum(w)``); plain mean CE without weights."""
    per_sample = F.cross_entropy(logits, labels, reduction="none")
    if weights is None:
        return per_sample.mean()
    weighted = (weights * per_sample).sum()
    return weighted / weights.sum() if normalize else weighted / len(labels)


def proximal_term(model: nn.Module, anchor: list[torch.Tensor]) -> torch.Tensor:
    """``sum ||w - w_anchor||^2`` over trainable parameters."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    return sum(((p - a) ** 2).sum() for p, a in zip(parameters, anchor, strict=True))


def make_optimizer(parameters: list[torch.nn.Parameter], recipe: TrainRecipe) -> torch.optim.Optimizer:
    """The recipe's optimizer over ``parameters``: SGD with momentum, or Adam."""
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(
            parameters, lr=recipe.learning_rate, momentum=recipe.momentum, weight_decay=recipe.weight_decay
        )
    if recipe.optimizer == "adam":
        return torch.optim.Adam(
            parameters,
            lr=recipe.learning_rate,
            betas=(recipe.adam_beta1, recipe.adam_beta2),
            eps=recipe.adam_eps,
            weight_decay=recipe.weight_decay,
        )
    raise ValueError(f"optimizer = {recipe.optimizer!r} is not accepted; accepted: sgd, adam")


def export_state(optimizer: torch.optim.Optimizer, named: list[tuple[str, nn.Parameter]]) -> OptimizerState:
    """Every tensor of the optimizer's per-parameter state, keyed ``"<name>/<slot>"``, on the CPU."""
    exported: OptimizerState = {}
    for name, parameter in named:
        for slot, value in optimizer.state.get(parameter, {}).items():
            tensor = value if isinstance(value, torch.Tensor) else torch.tensor(value)
            exported[f"{name}/{slot}"] = tensor.detach().cpu().clone().contiguous()
    return exported


def import_state(
    optimizer: torch.optim.Optimizer, named: list[tuple[str, nn.Parameter]], state: OptimizerState
) -> None:
    """Start ``optimizer`` from :func:`export_state`'s output; entries that do not fit are ignored."""
    for name, parameter in named:
        slots = {key.split("/", 1)[1]: value for key, value in state.items() if key.split("/", 1)[0] == name}
        if not slots:
            continue
        restored: dict[str, torch.Tensor] = {}
        for slot, value in slots.items():
            if slot == "step":  # Adam's step count stays a CPU scalar tensor
                restored[slot] = value.detach().clone().to(torch.float32)
            elif value.shape == parameter.shape:
                restored[slot] = value.to(parameter.device, parameter.dtype).clone()
        if restored:
            optimizer.state[parameter] = restored


PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""``mixed-precision`` values that autocast, and the dtype they compute in."""


def autocast(precision: str, device: torch.device) -> torch.autocast:
    """The autocast context of ``mixed-precision`` on ``device`` (disabled for ``"off"``).

    Raises
    ------
    ValueError
        For ``fp16`` on a CPU, where PyTorch's float16 kernels are slow or
        missing, naming the setting and what is accepted there.
    """
    if precision not in ("off", *PRECISIONS):
        raise ValueError(f"setting mixed-precision = {precision!r}; accepted: off, {', '.join(PRECISIONS)}")
    if precision == "fp16" and device.type != "cuda":
        raise ValueError(
            f"setting mixed-precision = 'fp16' needs a CUDA device, but this process runs on {device.type}; "
            "accepted here: 'bf16' or 'off'"
        )
    return torch.autocast(device.type, dtype=PRECISIONS.get(precision, torch.bfloat16), enabled=precision != "off")


def features_of(model: nn.Module, layer: str = "") -> tuple[list[torch.Tensor], Any]:
    """Capture the input of ``layer`` (default: the model's ``classifier_layer``) on every forward pass.

    Returns the list the batches' features (``[B, d]``, flattened) are appended to, and the hook's handle
    (``handle.remove()`` ends the capture).
    """
    name = layer or getattr(model, "classifier_layer", "")
    if not name:
        raise ValueError(
            "the model names no classifier_layer, whose input is its features; accepted: a model that does"
        )
    captured: list[torch.Tensor] = []
    handle = model.get_submodule(name).register_forward_pre_hook(
        lambda module, args: captured.append(args[0].flatten(1))
    )
    return captured, handle


def train_locally(
    model: nn.Module,
    data: ImageTensors,
    recipe: TrainRecipe,
    transform: BatchTransform,
    device: torch.device,
    generator: torch.Generator,
    sample_weighting: SampleWeighting | None = None,
    optimizer_state: OptimizerState | None = None,
    loss_terms: Sequence[LossTerm] = (),
    after_step: Sequence[Callable[[], None]] = (),
) -> TrainStats:
    """Run ``recipe.local_epochs`` epochs on ``data`` in place on ``model``.

    ``optimizer_state`` (an earlier call's ``TrainStats.optimizer_state``)
    starts the optimizer where that call left it (SGD's momentum, Adam's
    moments and step count) instead of fresh; entries whose parameter name or
    shape no longer match are ignored. The returned stats carry this call's
    final state when ``recipe.persist_optimizer_state`` is set. ``loss_terms``
    are added to every batch's loss, unweighted, given the batch's features
    (:func:`features_of`) and inputs. ``after_step`` are called, in order, after
    every optimizer step (SCAFFOLD's correction of the parameters).
    """
    if len(data) == 0:
        raise ValueError(
            "this client's partition holds no training examples, so it has nothing to train on (its reply is "
            "excluded from the round); a partitioner that leaves clients empty, e.g. Dirichlet with a small "
            "dirichlet-alpha over few images or class-sorted data, needs more images per client or fewer clients"
        )
    started, started_cpu = time.perf_counter(), time.thread_time()
    model.to(device)
    train_mode(model)  # frozen BatchNorm layers (a frozen pretrained body) stay in eval mode
    precision = autocast(recipe.mixed_precision, device)
    scaler = torch.amp.GradScaler(device.type, enabled=recipe.mixed_precision == "fp16")
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    optimizer = make_optimizer([p for _, p in named], recipe)
    if optimizer_state:
        import_state(optimizer, named, optimizer_state)
    anchor = [p.detach().clone() for _, p in named] if recipe.proximal_mu > 0 else []
    features, capture = features_of(model) if loss_terms else ([], None)
    loss_sum = 0.0
    steps = 0
    for _ in range(recipe.local_epochs):
        for images, labels, indices in batches(data, recipe.batch_size, shuffle=True, generator=generator):
            inputs = transform(images.to(device), train=True, generator=generator)
            labels = labels.to(device)
            with precision:
                logits = model(inputs).float()
            weights = sample_weighting(logits, labels, indices) if sample_weighting else None
            loss = weighted_cross_entropy(
                logits, labels, weights, normalize=bool(sample_weighting and sample_weighting.normalize)
            )
            if anchor:
                loss = loss + 0.5 * recipe.proximal_mu * proximal_term(model, anchor)
            if loss_terms:
                batch_features = features.pop().float()
                features.clear()
                for term in loss_terms:
                    loss = loss + term(batch_features, inputs)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            for hook in after_step:
                hook()
            with torch.no_grad():
                loss_sum += F.cross_entropy(logits.detach(), labels, reduction="sum").item()
            steps += 1
    if capture is not None:
        capture.remove()
    seen = recipe.local_epochs * len(data)
    kept = export_state(optimizer, named) if recipe.persist_optimizer_state else None
    return TrainStats(
        train_loss=loss_sum / seen,
        num_examples=len(data),
        steps=steps,
        seconds=time.perf_counter() - started,
        cpu_seconds=time.thread_time() - started_cpu,
        optimizer_state=kept or None,
    )


TOP_K = 5
"""Top-k accuracy is recorded for this k (the FedNolowe paper's top-5), on tasks with at least k classes."""


@dataclass(frozen=True)
class EvalStats:
    """Loss and accuracy of a model on a dataset."""

    loss: float
    accuracy: float
    num_examples: int
    macro_f1: float = float("nan")
    prediction_share: float = float("nan")  # of the most often predicted class: 1.0 when one class is predicted for all
    weighted_f1: float = float("nan")
    top5_accuracy: float = float("nan")  # NaN with fewer than TOP_K classes


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: ImageTensors,
    transform: BatchTransform,
    device: torch.device,
    batch_size: int = 512,
    precision: str = "off",
) -> EvalStats:
    """Mean cross-entropy, top-1 and top-:data:`TOP_K` accuracy, macro- and weighted F1, in eval mode.

    No augmentation; ``precision`` picks autocast.
    """
    model.to(device)
    model.eval()
    loss_sum, correct, top_correct, num_classes = 0.0, 0, 0, 0
    predictions, targets = [], []
    for images, labels, _ in batches(data, batch_size, shuffle=False, generator=None):
        with autocast(precision, device):
            logits = model(transform(images.to(device), train=False, generator=None)).float()
        labels = labels.to(device)
        loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
        predicted = logits.argmax(dim=1)
        correct += int((predicted == labels).sum().item())
        num_classes = logits.shape[1]
        if num_classes >= TOP_K:
            top_correct += top_k_correct(logits, labels, TOP_K)
        predictions.append(predicted.cpu())
        targets.append(labels.cpu())
    count = len(data)
    if not count:
        return EvalStats(loss=float("nan"), accuracy=float("nan"), num_examples=0)
    predicted_all, target_all = torch.cat(predictions), torch.cat(targets)
    share = float(torch.bincount(predicted_all).max()) / count
    return EvalStats(
        loss=loss_sum / count,
        accuracy=correct / count,
        num_examples=count,
        macro_f1=macro_f1(predicted_all, target_all),
        prediction_share=share,
        weighted_f1=weighted_f1(predicted_all, target_all),
        top5_accuracy=top_correct / count if num_classes >= TOP_K else float("nan"),
    )


def top_k_correct(logits: torch.Tensor, labels: torch.Tensor, k: int) -> int:
    """How many samples have their label among the ``k`` largest logits (ties: ``torch.topk``'s pick).

    >>> top_k_correct(torch.tensor([[0.1, 0.5, 0.4], [0.7, 0.2, 0.1]]), torch.tensor([2, 2]), 2)
    1
    """
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"top_k_correct: k = {k}; accepted: 1 to the number of classes ({logits.shape[1]})")
    top = logits.topk(k, dim=1).indices
    return int((top == labels.unsqueeze(1)).any(dim=1).sum().item())


def per_class_f1(predicted: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """F1 of every class present in ``target`` or ``predicted``, and its support (count in ``target``).

    F1 = 2 TP / (predicted + actual), defined for every class listed (one of
    the two counts is positive), as scikit-learn's ``f1_score`` computes it.

    >>> per_class_f1(torch.tensor([0, 1, 1]), torch.tensor([0, 1, 0]))
    (tensor([0.6667, 0.6667], dtype=torch.float64), tensor([2., 1.], dtype=torch.float64))
    """
    classes = torch.unique(torch.cat([predicted, target]))
    scores, support = [], []
    for label in classes:
        true_positive = int(((predicted == label) & (target == label)).sum())
        predicted_count, target_count = int((predicted == label).sum()), int((target == label).sum())
        scores.append(2 * true_positive / (predicted_count + target_count))
        support.append(target_count)
    return torch.tensor(scores, dtype=torch.float64), torch.tensor(support, dtype=torch.float64)


def macro_f1(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """Unweighted mean over the classes present in ``target`` or ``predicted`` of per-class F1.

    >>> macro_f1(torch.tensor([0, 1, 1]), torch.tensor([0, 1, 0]))
    0.6666666666666666
    """
    scores, _ = per_class_f1(predicted, target)
    return float(scores.mean())


def weighted_f1(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """Per-class F1 averaged with the classes' support in ``target`` (scikit-learn's ``average="weighted"``).

    A class only predicted (support 0) weighs nothing; the FedNolowe paper reports this F1.

    >>> round(weighted_f1(torch.tensor([0, 1, 1, 2]), torch.tensor([0, 1, 0, 0])), 4)  # (3 * 1/2 + 1 * 2/3) / 4
    0.5417
    """
    scores, support = per_class_f1(predicted, target)
    return float((scores * support).sum() / support.sum())
