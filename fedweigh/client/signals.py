"""The client halves of the methods for any Flower ClientApp: signals measured with your own model and data.

A strategy of :mod:`fedweigh.strategies` weighs each client by what its
reply reports. Your ClientApp trains as it always does; these functions
measure what the method needs, with your model and your tensors, and
:func:`fedweigh.client.train_reply` puts it in the reply under the keys
the strategy reads. Each returns a ``dict`` of signals (or sample weights
for the loss), so that they combine:

=========  =================================================  ==============================
method     in your train handler                               reported
=========  =================================================  ==============================
FedNolowe  nothing: your mean training loss is the signal     ``train_loss``
FedOUI     after training: :func:`oui_signal`                 ``oui``
UFL        before training: :func:`ufl_weights`, then         ``uncertainty``,
           :func:`weighted_loss` with them                     ``uncertainty-mean``
FLood      each batch: :func:`asw_sample_weights` and          ``ood-score``
           :func:`weighted_loss`; after training:
           :func:`ood_score_signal`
=========  =================================================  ==============================

The options come with every instruction (:class:`fedweigh.client.Instruction`):
the values the server chose, with the papers' defaults.

Example
-------
>>> import torch
>>> from torch import nn
>>> model = nn.Sequential(nn.Flatten(), nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
>>> probe = torch.randn(16, 4)
>>> signals = oui_signal(model, probe, layer="1")
>>> sorted(signals), 0.0 <= signals["oui"] <= 1.0
(['oui'], True)
>>> asw_sample_weights(torch.tensor([[5.0, 0.0], [0.0, 0.1], [9.0, 0.0], [0.2, 0.1]]), lam=4.0, q=0.5).tolist()
[1.0, 4.0, 1.0, 1.0]
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from fedweigh.client.flood import SCORES, asw_weights, mean_score_of
from fedweigh.client.mc_dropout import MC_BATCH_SIZE, ensure_mc_dropout, mc_mean_probabilities_of
from fedweigh.client.oui import probe_oui, resolve_probe_layer
from fedweigh.client.training import weighted_cross_entropy
from fedweigh.client.ufl import loss_weights, sample_uncertainty, select_uncertain, uncertainty_summary
from fedweigh.options import FLoodSettings, UFLSettings
from fedweigh.protocol import OOD_SCORE, OUI

Signals = dict[str, float]

_UFL, _FLOOD = UFLSettings(), FLoodSettings()
BATCH_SIZE = 256
"""Samples per forward pass when a function is given all of a client's inputs in one tensor."""


def _batches(inputs: torch.Tensor | Iterable[torch.Tensor], batch_size: int = BATCH_SIZE) -> Iterator[torch.Tensor]:
    """``inputs`` in batches: a tensor is split along its first dimension; an iterable is taken as it is."""
    if isinstance(inputs, torch.Tensor):
        yield from inputs.split(batch_size)
    else:
        yield from inputs


def oui_signal(model: nn.Module, probe: torch.Tensor, layer: str = "") -> Signals:
    """FedOUI's signal: the OUI of ``layer``'s output on a probe batch, in eval mode, after training.

    Parameters
    ----------
    model : nn.Module
        The trained model (its modes are restored afterwards).
    probe : torch.Tensor
        The probe batch, ready for the model: the same images every round
        (the paper's fixed probe); ``oui.probe-size`` of the instruction says
        how many the server asks for.
    layer : str
        The submodule whose output (a pre-activation) is measured, by its
        name in ``model.named_modules()``; ``""`` uses ``model.probe_layer``.
    """
    return {OUI: probe_oui(model, resolve_probe_layer(model, layer), probe)}


def mc_uncertainty(
    model: nn.Module,
    inputs: torch.Tensor | Iterable[torch.Tensor],
    labels: torch.Tensor,
    *,
    passes: int = _UFL.mc_passes,
    dropout: float = _UFL.dropout,
    classifier: str = "",
    seed: int = 0,
) -> torch.Tensor:
    """UFL's per-sample uncertainty ``u_i = −log p̄_{i,y_i}`` under MC dropout (``passes`` forward passes).

    ``inputs``: all of the client's training inputs in order (a tensor, cut
    into batches of ``MC_BATCH_SIZE``, or its batches), ready for the model;
    ``labels`` the same samples' labels.
    A model without ``nn.Dropout`` gets dropout ``dropout`` before its
    ``classifier`` layer (by name), which then stays for training, as UFL
    trains with it. The masks are seeded by ``seed``; the global random
    state is left as it was.
    """
    ensure_mc_dropout(model, dropout, classifier)
    device = labels.device
    probabilities = mc_mean_probabilities_of(model, _batches(inputs, MC_BATCH_SIZE), device, passes, seed)
    if len(probabilities) != len(labels):
        raise ValueError(f"{len(probabilities)} inputs but {len(labels)} labels; accepted: one label per input")
    return sample_uncertainty(probabilities, labels)


def ufl_weights(
    model: nn.Module,
    inputs: torch.Tensor | Iterable[torch.Tensor],
    labels: torch.Tensor,
    *,
    passes: int = _UFL.mc_passes,
    ratio: float = _UFL.ratio,
    alpha: float = _UFL.alpha,
    dropout: float = _UFL.dropout,
    classifier: str = "",
    seed: int = 0,
) -> tuple[torch.Tensor, Signals]:
    """UFL before training: each sample's loss weight, and the signals U-Agg weighs with.

    The ``ratio`` most uncertain samples (:func:`mc_uncertainty`) weigh
    ``1 + alpha·u``, the others 1. Returns the weights, one per sample in
    the order of ``inputs`` (use them in :func:`weighted_loss` with each
    batch's sample indices), and ``uncertainty`` (U_k, the sum of the
    selected ``u``), ``uncertainty-mean`` and a summary of ``u``.
    """
    u = mc_uncertainty(model, inputs, labels, passes=passes, dropout=dropout, classifier=classifier, seed=seed)
    selected = select_uncertain(u, ratio)
    weights = loss_weights(u, selected, alpha)
    return weights, uncertainty_summary(u, selected, weights)


def weighted_loss(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None, normalize: bool = False
) -> torch.Tensor:
    """The methods' batch loss: ``Σ w_i CE_i / B`` (``/ Σ w_i`` with ``normalize``); the mean CE without weights."""
    return weighted_cross_entropy(logits, labels, weights, normalize)


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
    return {OOD_SCORE: mean_score_of(model, _batches(inputs), lambda logits: SCORES[score](logits, temperature))}
