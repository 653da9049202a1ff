"""FLood's client half: OOD scores of the logits, adaptive sample weighting (ASW), the client's OOD score φ.

The FLood paper (Ling et al., "Adaptive Dual-Weighting Framework for Federated
Learning via Out-of-Distribution Detection", spec ``specs/flood.md`` §2)
treats the samples a client's model is least confident about as pseudo
out-of-distribution and weighs them by λ(t) in the loss:

* **scores** of the logits, "higher = more in-distribution" (§2.1):
  :func:`energy_score` ``T · logsumexp(z / T)`` (the default), :func:`msp_score`,
  :func:`max_logit_score`, :func:`gen_score`;
* the **batch threshold** (Eq. 7): the q-quantile of the batch's scores with
  'lower' interpolation, computed exactly (:func:`lower_quantile_index`);
* the **mask** (Eq. 8): ``m_i = λ(t)`` for a score strictly below the
  threshold (pseudo-OOD), 1 otherwise (:func:`asw_weights`); the loss is
  ``Σ m_i CE_i / B`` (Alg. 2), from the training forward pass itself, the
  scores detached (:class:`ASWWeighting`, step ``"asw"``);
* **φ** (Eq. 10): after training, the mean score of the trained model over the
  client's own training data, in eval mode (step ``"ood-score"``), the signal
  of the server's DAC rule (:mod:`fedweigh.methods.flood.server`).

λ(t) is the server's (:mod:`fedweigh.strategies.schedules`); it arrives with
each round's instruction.

Example
-------
>>> import torch
>>> scores = torch.tensor([0.5, 0.1, 0.9, 0.3, 0.7])
>>> lower_quantile_index(5, 0.7), asw_weights(scores, q=0.7, lam=4.0).tolist()
(2, [1.0, 4.0, 1.0, 4.0, 1.0])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from flwr.clientapp.typing import Mod
from torch import nn

from fedweigh.client.instruction import Instruction
from fedweigh.client.mods import signal_mod
from fedweigh.client.signals import Signals, batches_of
from fedweigh.client.steps import ClientStep, Metrics, StepContext
from fedweigh.data.loader import batches
from fedweigh.data.tensors import ImageTensors
from fedweigh.data.transforms import BatchTransform
from fedweigh.methods.catalog import STEPS
from fedweigh.methods.flood.protocol import ASW_LAMBDA, OOD_SCORE, FLoodSettings
from fedweigh.protocol import table_from_config

_FLOOD = FLoodSettings()

ScoreFunction = Callable[[torch.Tensor], torch.Tensor]


def energy_score(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``T · logsumexp(z / T)`` per sample (minus the free energy of Liu et al. 2020).

    >>> round(float(energy_score(torch.zeros(1, 10))[0]), 6) == round(math.log(10), 6)
    True
    """
    return temperature * torch.logsumexp(logits / temperature, dim=1)


def msp_score(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The largest softmax probability."""
    return torch.softmax(logits / temperature, dim=1).max(dim=1).values


def max_logit_score(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The largest logit."""
    return logits.max(dim=1).values


GEN_GAMMA = 0.1
GEN_TOP = 10


def gen_score(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """GEN (the authors' code): ``-Σ_{top-M p} p^γ (1 - p)^γ`` with γ = 0.1, M = 10; always negative."""
    probabilities = torch.softmax(logits / temperature, dim=1)
    top = probabilities.topk(min(GEN_TOP, probabilities.shape[1]), dim=1).values
    return -(top**GEN_GAMMA * (1.0 - top) ** GEN_GAMMA).sum(dim=1)


SCORES: dict[str, Callable[..., torch.Tensor]] = {
    "energy": energy_score,
    "msp": msp_score,
    "max-logit": max_logit_score,
    "gen": gen_score,
}
"""OOD scores by the name ``flood.score`` takes."""


def lower_quantile_index(batch_size: int, q: float) -> int:
    """Position of the q-quantile with 'lower' interpolation in a sorted batch: ``⌊q (B − 1)⌋``.

    The product is rounded to 9 decimals first, so float noise cannot move the
    floor: ``torch.quantile`` in float32 gives one sample fewer at B = 11, 21, ...

    Examples
    --------
    >>> [lower_quantile_index(b, 0.7) for b in (1, 2, 11, 21, 50)]
    [0, 0, 7, 14, 34]
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"flood.q = {q!r} is not accepted; accepted: 0 <= q <= 1")
    if batch_size < 1:
        raise ValueError(f"a batch needs at least one sample, got {batch_size}")
    return math.floor(round(q * (batch_size - 1), 9))


def pseudo_ood_mask(scores: torch.Tensor, q: float) -> torch.Tensor:
    """True for the samples scoring strictly below the batch's lower q-quantile (Eqs. 7-8).

    Without ties exactly ``⌊q (B − 1)⌋`` samples are marked; with ties fewer
    (every sample equal to the threshold counts as in-distribution).
    """
    threshold = torch.kthvalue(scores, lower_quantile_index(len(scores), q) + 1).values
    return scores < threshold


def asw_weights(scores: torch.Tensor, q: float, lam: float) -> torch.Tensor:
    """``λ`` for the pseudo-OOD samples (:func:`pseudo_ood_mask`), 1 for the others."""
    marked = pseudo_ood_mask(scores, q)
    return torch.where(marked, torch.full_like(scores, lam), torch.ones_like(scores))


# ---------------------------------------------------------------------------
# the client steps
# ---------------------------------------------------------------------------


def flood_options(config: Mapping[str, Any]) -> FLoodSettings:
    """The ``flood.*`` options of a train instruction (missing ones take their defaults)."""
    return table_from_config(STEPS["asw"].options, FLoodSettings, config)


def score_function(options: FLoodSettings) -> ScoreFunction:
    """The score the options name, at their temperature."""
    score = SCORES[options.score]
    return lambda logits: score(logits, options.temperature)


class ASWWeighting:
    """FLood's per-sample loss weights, from each training batch's own logits (a ``SampleWeighting``).

    ``mask = "scores"`` (the paper): :func:`asw_weights`. ``mask = "uniform"``
    (the spec's control for the larger effective learning rate): every sample
    of a batch gets that batch's mean ASW weight, so the loss is scaled as by
    ASW but no sample is preferred. Counts the share of samples marked
    pseudo-OOD, for the record.
    """

    normalize = False  # the loss is divided by B, not by the sum of the weights (Alg. 2)

    def __init__(self, score: ScoreFunction, q: float, lam: float, mask: str = "scores") -> None:
        self.score, self.q, self.lam, self.mask = score, q, lam, mask
        self.marked: torch.Tensor | int = 0  # a device tensor once training runs: no host sync per batch
        self.seen = 0

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            marked = pseudo_ood_mask(self.score(logits.detach()), self.q)
            weights = torch.where(marked, torch.full_like(marked, self.lam, dtype=logits.dtype), 1.0)
        self.marked = self.marked + marked.sum()
        self.seen += len(labels)
        if self.mask == "uniform":
            return weights.mean().expand_as(weights)
        return weights

    @property
    def pseudo_ood_fraction(self) -> float:
        return float(self.marked) / self.seen if self.seen else 0.0


class ASWStep(ClientStep):
    """FLood's ASW: pseudo-OOD samples of each batch weigh λ(t) in the loss (λ comes with the round's instruction).

    Options (``[flood]``): ``q``, ``score``, ``temperature``, ``mask``. Reports
    ``pseudo-ood-fraction`` (the share of training samples weighted by λ) and
    ``asw-lambda`` (the λ it trained with).
    """

    name = "asw"

    def __init__(self) -> None:
        self.weighting: ASWWeighting | None = None

    def before_training(self, context: StepContext) -> tuple[ASWWeighting, Metrics]:
        options = flood_options(context.config)
        if ASW_LAMBDA not in context.config:
            raise ValueError(f"the train instruction lacks {ASW_LAMBDA!r}: the server's schedule of λ(t) sends it")
        lam = float(context.config[ASW_LAMBDA])
        self.weighting = ASWWeighting(score_function(options), options.q, lam, options.mask)
        return self.weighting, {}

    def after_training(self, context: StepContext) -> Metrics:
        assert self.weighting is not None
        return {"pseudo-ood-fraction": self.weighting.pseudo_ood_fraction, "asw-lambda": self.weighting.lam}


@torch.no_grad()
def mean_score(
    model: nn.Module,
    data: ImageTensors,
    transform: BatchTransform,
    device: torch.device,
    score: ScoreFunction,
    *,
    augment: bool = False,
    generator: torch.Generator | None = None,
    batch_size: int = 256,
) -> float:
    """φ: the mean score of ``model`` (in eval mode) over ``data`` (Eq. 10); the model's modes are restored."""
    inputs = (
        transform(images.to(device), train=augment, generator=generator)
        for images, _, _ in batches(data, batch_size, shuffle=False)
    )
    return mean_score_of(model, inputs, score)


@torch.no_grad()
def mean_score_of(model: nn.Module, inputs: Iterable[torch.Tensor], score: ScoreFunction) -> float:
    """:func:`mean_score` over batches of model inputs as they are (a user's own pipeline's)."""
    modes = {module: module.training for module in model.modules()}
    model.eval()
    total, count = 0.0, 0
    try:
        for x in inputs:
            total += float(score(model(x)).double().sum())
            count += len(x)
    finally:
        for module, training in modes.items():
            module.training = training
    if count == 0:
        raise ValueError("the OOD score needs at least one sample")
    return total / count


class OODScoreStep(ClientStep):
    """After training: φ, the trained model's mean OOD score over the client's own training data.

    Options (``[flood]``): ``score``, ``temperature``, ``phi-augment`` (the
    authors' code scores augmented inputs; the paper's Eq. 10, the default,
    the data as it is). Reports the ``ood-score`` signal (DAC's).
    """

    name = "ood-score"

    def after_training(self, context: StepContext) -> Metrics:
        options = flood_options(context.config)
        if len(context.data) == 0:
            raise ValueError(f"ood-score: partition {context.partition_id} has no training samples")
        generator = torch.Generator().manual_seed(context.seed)
        phi = mean_score(
            context.model,
            context.data,
            context.transform,
            context.device,
            score_function(options),
            augment=options.phi_augment,
            generator=generator,
        )
        return {OOD_SCORE: phi}


# ---------------------------------------------------------------------------
# for your own ClientApp
# ---------------------------------------------------------------------------


def energy_scores(logits: torch.Tensor, temperature: float = _FLOOD.temperature) -> torch.Tensor:
    """FLood's OOD score per sample: ``T · logsumexp(logits / T)`` (low: out-of-distribution-like)."""
    return SCORES["energy"](logits, temperature)


def asw_sample_weights(
    logits: torch.Tensor,
    lam: float,
    *,
    q: float = _FLOOD.q,
    score: str = _FLOOD.score,
    temperature: float = _FLOOD.temperature,
) -> torch.Tensor:
    """FLood's ASW for one batch: its pseudo-OOD samples (scoring below the batch's lower q-quantile) weigh λ.

    ``lam`` is the round's λ(t), which the instruction carries
    (``Instruction.asw_lambda``); the others weigh 1. No gradient flows
    through the weights.
    """
    if score not in SCORES:
        raise ValueError(f"flood.score = {score!r}; accepted: {', '.join(SCORES)}")
    if not math.isfinite(lam) or lam < 0:
        raise ValueError(f"asw-lambda = {lam!r}; accepted: a finite number >= 0")
    with torch.no_grad():
        return asw_weights(SCORES[score](logits.detach(), temperature), q, lam).to(logits.dtype)


def ood_score_signal(
    model: nn.Module,
    inputs: torch.Tensor | Iterable[torch.Tensor],
    *,
    score: str = _FLOOD.score,
    temperature: float = _FLOOD.temperature,
) -> Signals:
    """FLood's signal for DAC after training: φ, the trained model's mean OOD score over the client's inputs."""
    if score not in SCORES:
        raise ValueError(f"flood.score = {score!r}; accepted: {', '.join(SCORES)}")
    return {OOD_SCORE: mean_score_of(model, batches_of(inputs), lambda logits: SCORES[score](logits, temperature))}


def ood_score_mod(
    model_fn: Callable[[], nn.Module], inputs: Callable[[], torch.Tensor | Iterable[torch.Tensor]]
) -> Mod:
    """FLood's φ (:func:`ood_score_signal`) over ``inputs()``, the client's own inputs."""

    def measure(model: nn.Module, instruction: Instruction) -> Signals:
        options = instruction.flood
        return ood_score_signal(model, inputs(), score=options.score, temperature=options.temperature)

    return signal_mod("ood-score", model_fn, measure)


STEP_CLASSES = (ASWStep, OODScoreStep)
"""This package's client steps (gathered by :mod:`fedweigh.client.registry`)."""

__all__ = ["ASWStep", "OODScoreStep", "asw_sample_weights", "energy_scores", "ood_score_mod", "ood_score_signal"]
