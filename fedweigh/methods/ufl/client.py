"""UFL's client half: MC-dropout sample uncertainty and uncertainty-weighted local training.

The client side of the UFL paper ("UFL: Uncertainty-Driven Federated
Learning", spec ``specs/ufl.md``); the server's U-Agg is
:mod:`fedweigh.methods.ufl.server`:

* the **per-sample uncertainty** ``u_i = -log max(p̄_{i,y_i}, eps)`` of the
  received global model, where ``p̄_i`` is the mean of ``N`` Monte Carlo
  dropout softmax outputs (spec §2 C2): :func:`mc_mean_probabilities`,
  :func:`sample_uncertainty`. It is the true-label NLL of the MC predictive
  mean, which the paper calls "entropy";
* the **selection** of the top ``m = clip(ceil(r n), 1, n)`` samples by ``u``
  and their **loss weights** ``λ_i = 1 + α u_i`` (1 for the others; spec C3,
  C4): :func:`selection_size`, :func:`select_uncertain`, :func:`loss_weights`.
  The batch loss is ``Σ λ_i CE_i / B`` (paper Eq. 3), or ``Σ λ_i CE_i / Σ λ_i``
  with ``ufl.normalize`` (a control for the step-size effect of ``λ >= 1``);
* **MC dropout on any model** (spec §4): :mod:`fedweigh.client.mc_dropout`;
* the **client step** ``"ufl"`` (:class:`UFLStep`), which reports
  ``uncertainty`` (``U_k``, the sum of ``u`` over the selected samples),
  ``uncertainty-mean`` (``U_k / m_k``) and the long-tail record of ``u``
  (``u-p50`` ... ``u-p99``, ``u-above-1``); its options are the ``[ufl]``
  table (:class:`fedweigh.settings.UFLSettings`);
* :func:`model_uncertainty` (``u`` of any data under a model, the step's own
  path) and :func:`u_tail`: what the server reports of its final model's
  ``u`` on the test set with ``final-uncertainty``;
* the step ``"ufl-dropout"`` (:class:`UFLDropoutStep`): only the dropout, for
  baselines that should train the same architecture.

Example
-------
>>> import torch
>>> u = torch.tensor([0.1, 0.9, 0.3, 0.8, 0.2, 0.7, 0.0, 0.4, 0.5, 0.6])
>>> selected = select_uncertain(u, ratio=0.3)
>>> sorted(selected.tolist()), round(float(u[selected].sum()), 6)
([1, 3, 5], 2.4)
>>> [round(w, 4) for w in loss_weights(u, selected, alpha=0.2)[[0, 1, 3, 5]].tolist()]
[1.0, 1.18, 1.16, 1.14]
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fedweigh.client.mc_dropout import MC_BATCH_SIZE, ensure_mc_dropout, mc_mean_probabilities, mc_mean_probabilities_of
from fedweigh.client.signals import Signals, batches_of
from fedweigh.client.steps import ClientStep, Metrics, StepContext
from fedweigh.data.tensors import ImageTensors
from fedweigh.data.transforms import BatchTransform
from fedweigh.methods.catalog import STEPS
from fedweigh.methods.ufl.protocol import UNCERTAINTY, UNCERTAINTY_MEAN, UFLSettings
from fedweigh.protocol import MC_SECONDS, table_from_config

_UFL = UFLSettings()

logger = logging.getLogger("flwr.fedweigh")

PERCENTILES = (50, 90, 95, 99)
"""Percentiles of ``u`` over all local samples reported as ``u-p50`` ... (spec A20)."""
EPSILON = 1e-12
"""Floor of ``p̄_{i,y_i}`` before the log: ``u <= -log(1e-12) ≈ 27.63``."""

# ---------------------------------------------------------------------------
# pure math
# ---------------------------------------------------------------------------


def sample_uncertainty(mean_probabilities: torch.Tensor, labels: torch.Tensor, eps: float = EPSILON) -> torch.Tensor:
    """Per-sample uncertainty ``u_i = -log max(p̄_{i,y_i}, eps)`` (paper Eq. 1).

    Parameters
    ----------
    mean_probabilities : torch.Tensor
        MC-averaged class probabilities ``p̄``, shape ``[n, C]``.
    labels : torch.Tensor
        Integer labels, shape ``[n]``.
    eps : float
        Floor of the true-class probability.

    Returns
    -------
    torch.Tensor
        ``u``, shape ``[n]``, in ``[0, -log eps]``.

    Examples
    --------
    >>> p = torch.tensor([[math.exp(-1.0), 1 - math.exp(-1.0)], [0.0, 1.0]], dtype=torch.float64)
    >>> sample_uncertainty(p, torch.tensor([0, 0])).tolist()
    [1.0, 27.631021115928547]
    """
    true_class = mean_probabilities.gather(1, labels.view(-1, 1).to(mean_probabilities.device)).squeeze(1)
    # float64 for the log so that the clamp floor is represented exactly
    return -torch.log(true_class.double().clamp(min=eps))


def selection_size(count: int, ratio: float) -> int:
    """``m = clip(ceil(ratio * count), 1, count)``; 0 for an empty set (spec C3, A6).

    The product is rounded to 9 decimals before the ceiling so that float noise
    (``0.3 * 10 = 3.0000000000000004`` in some orders) does not add a sample.

    Examples
    --------
    >>> selection_size(10, 0.3), selection_size(11, 0.3), selection_size(2, 0.01), selection_size(5, 1.0)
    (3, 4, 1, 5)
    """
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"ufl.ratio = {ratio!r}: the selected fraction must be in (0, 1]")
    if count <= 0:
        return 0
    return min(max(math.ceil(round(ratio * count, 9)), 1), count)


def select_uncertain(u: torch.Tensor, ratio: float) -> torch.Tensor:
    """Indices of the ``selection_size(len(u), ratio)`` largest ``u`` (ties in any order)."""
    return torch.topk(u, selection_size(len(u), ratio), sorted=True).indices


def loss_weights(u: torch.Tensor, selected: torch.Tensor, alpha: float) -> torch.Tensor:
    """``λ_i = 1 + α u_i`` for the selected samples, 1 for the others (paper Eq. 2), as float32."""
    if alpha < 0 or not math.isfinite(alpha):
        raise ValueError(f"ufl.alpha = {alpha!r}: must be a finite number >= 0")
    weights = torch.ones(len(u), dtype=torch.float32, device=u.device)
    weights[selected] = (1.0 + alpha * u[selected]).float()
    return weights


def uncertainty_summary(u: torch.Tensor, selected: torch.Tensor, weights: torch.Tensor) -> Metrics:
    """The client's signals: ``U_k``, ``U_k / m_k``, and the long-tail record of ``u``.

    Returns
    -------
    dict
        ``uncertainty`` (Σ u over the selected), ``uncertainty-mean``,
        ``selected`` (m_k), ``lambda-mean``, ``u-mean``, ``u-p50`` ...
        ``u-p99`` and ``u-above-1`` (fraction of samples with ``u > 1``).
    """
    total = float(u[selected].sum())
    values = u.double().cpu()
    metrics: Metrics = {
        UNCERTAINTY: total,
        UNCERTAINTY_MEAN: total / len(selected),
        "selected": float(len(selected)),
        "lambda-mean": float(weights.double().mean()),
        "u-mean": float(values.mean()),
        "u-above-1": float((values > 1.0).double().mean()),
    }
    quantiles = torch.quantile(values, torch.tensor([q / 100 for q in PERCENTILES], dtype=torch.float64))
    metrics.update({f"u-p{q}": float(v) for q, v in zip(PERCENTILES, quantiles, strict=True)})
    return metrics


TAIL_PERCENTILE = 95
"""The percentile of ``u`` :func:`u_tail` reports (the spec's p95 of ``u``, §11)."""


def u_tail(u: torch.Tensor) -> tuple[float, float]:
    """The right tail of ``u``: its 95th percentile (linear interpolation) and the fraction with ``u > 1``.

    >>> u_tail(torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0], dtype=torch.float64))  # p95 = 1.5 + 0.8 * 0.5
    (1.9, 0.4)
    """
    values = u.double().cpu()
    return float(torch.quantile(values, TAIL_PERCENTILE / 100)), float((values > 1.0).double().mean())


def model_uncertainty(
    model: nn.Module,
    data: ImageTensors,
    transform: BatchTransform,
    device: torch.device,
    options: UFLSettings,
    seed: int,
    passes: int | None = None,
) -> torch.Tensor:
    """``u`` of every sample of ``data`` under ``model``: MC dropout as the ``ufl`` step does it.

    ``passes`` replaces ``options.mc_passes`` when given; ``options.dropout``
    is inserted before the classifier of a model without dropout (a model's
    own ``nn.Dropout`` is used as it is), ``options.cheap_path`` picks the path.
    """
    ensure_mc_dropout(model, options.dropout)
    probabilities = mc_mean_probabilities(
        model,
        data,
        transform,
        device,
        options.mc_passes if passes is None else passes,
        seed,
        cheap=options.cheap_path,
    )
    return sample_uncertainty(probabilities, data.labels)


# ---------------------------------------------------------------------------
# client step
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class UncertaintyWeighting:
    """UFL's per-sample loss weights for training: ``λ`` looked up by local index.

    Attributes
    ----------
    weights : torch.Tensor
        ``λ`` for every local sample, shape ``[n]``.
    normalize : bool
        Divide the batch loss by ``Σ λ`` instead of the batch size.
    """

    weights: torch.Tensor
    normalize: bool = False

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return self.weights.to(logits.device)[indices.to(self.weights.device)].to(logits.device)


def ufl_options(config: Mapping[str, Any]) -> UFLSettings:
    """UFL's ``ufl.*`` options of a train instruction (missing ones take their defaults)."""
    return table_from_config(STEPS["ufl"].options, UFLSettings, config)


class UFLStep(ClientStep):
    """UFL's client side, before local training (spec §2 C2-C6).

    On the received global model and every local training sample: ``N`` MC
    dropout passes, ``u``, the top-``r`` selection, ``λ``. Returns an
    :class:`UncertaintyWeighting` and the signals of
    :func:`uncertainty_summary` (plus ``mc-seconds``). Recipe options:
    ``ufl.mc-passes``, ``ufl.ratio``, ``ufl.alpha``, ``ufl.dropout``,
    ``ufl.normalize``, ``ufl.cheap-path`` (see :class:`fedweigh.settings.UFLSettings`).
    """

    name = "ufl"

    @classmethod
    def check_model(cls, model: nn.Module, config: Mapping[str, Any]) -> None:
        ensure_mc_dropout(model, ufl_options(config).dropout)

    def before_training(self, context: StepContext) -> tuple[UncertaintyWeighting | None, Metrics]:
        options = ufl_options(context.config)
        if len(context.data) == 0:
            raise ValueError(f"ufl: partition {context.partition_id} has no training samples")
        started = time.perf_counter()
        u = model_uncertainty(context.model, context.data, context.transform, context.device, options, context.seed)
        selected = select_uncertain(u, options.ratio)
        weights = loss_weights(u, selected, options.alpha)
        metrics = uncertainty_summary(u, selected, weights)
        metrics[MC_SECONDS] = time.perf_counter() - started
        return UncertaintyWeighting(weights.to(context.device), normalize=options.normalize), metrics


class UFLDropoutStep(ClientStep):
    """Only the dropout UFL inserts (``ufl.dropout``), no weighting, no signal.

    For baselines that should train the same architecture as UFL (spec §4
    item 7): list ``"ufl-dropout"`` in their ``client-steps``.
    """

    name = "ufl-dropout"

    @classmethod
    def check_model(cls, model: nn.Module, config: Mapping[str, Any]) -> None:
        ensure_mc_dropout(model, ufl_options(config).dropout)

    def before_training(self, context: StepContext) -> tuple[None, Metrics]:
        ensure_mc_dropout(context.model, ufl_options(context.config).dropout)
        return None, {}


# ---------------------------------------------------------------------------
# for your own ClientApp
# ---------------------------------------------------------------------------


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
    probabilities = mc_mean_probabilities_of(model, batches_of(inputs, MC_BATCH_SIZE), device, passes, seed)
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


STEP_CLASSES = (UFLStep, UFLDropoutStep)
"""This package's client steps (gathered by :mod:`fedweigh.client.registry`)."""

__all__ = ["UFLDropoutStep", "UFLStep", "mc_uncertainty", "ufl_weights"]
