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

The functions live in each method's package (``fedweigh/methods/<method>/client.py``);
:mod:`fedweigh.client` offers them all by name. This module holds what they share.

>>> import torch
>>> [batch.shape[0] for batch in batches_of(torch.zeros(5, 2), batch_size=2)]
[2, 2, 1]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from fedweigh.client.training import weighted_cross_entropy

Signals = dict[str, float]

BATCH_SIZE = 256
"""Samples per forward pass when a function is given all of a client's inputs in one tensor."""


def batches_of(inputs: torch.Tensor | Iterable[torch.Tensor], batch_size: int = BATCH_SIZE) -> Iterator[torch.Tensor]:
    """``inputs`` in batches: a tensor is split along its first dimension; an iterable is taken as it is."""
    if isinstance(inputs, torch.Tensor):
        yield from inputs.split(batch_size)
    else:
        yield from inputs


def weighted_loss(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None, normalize: bool = False
) -> torch.Tensor:
    """The methods' batch loss: ``Σ w_i CE_i / B`` (``/ Σ w_i`` with ``normalize``); the mean CE without weights."""
    return weighted_cross_entropy(logits, labels, weights, normalize)
