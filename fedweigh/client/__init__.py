"""The client halves of the methods: for your own ClientApp, and for fedweigh's.

For your ClientApp (with your model, data and training loop; the strategies
are :mod:`fedweigh.strategies`):

* :class:`Instruction`: what a train message asks for (client steps, options, FLood's λ);
* :mod:`~fedweigh.client.signals`: :func:`oui_signal` (FedOUI), :func:`ufl_weights` and
  :func:`mc_uncertainty` (UFL), :func:`asw_sample_weights`, :func:`energy_scores` and
  :func:`ood_score_signal` (FLood), :func:`weighted_loss`;
* :func:`train_reply`: the reply the strategy reads (FedNolowe's signal is its ``train_loss``);
* :mod:`~fedweigh.client.mods`: :func:`oui_mod` and :func:`ood_score_mod`, the after-training signals as
  Flower mods.

Inside (fedweigh's own ClientApp, :mod:`fedweigh.client_app`):

* :mod:`~fedweigh.client.training`: local training and evaluation (per-sample loss weights, SGD or Adam);
* :mod:`~fedweigh.client.steps`: the step protocol;
* :mod:`~fedweigh.client.oui`, :mod:`~fedweigh.client.ufl` (with :mod:`~fedweigh.client.mc_dropout`),
  :mod:`~fedweigh.client.flood`: one module per paper's client step;
* :mod:`~fedweigh.client.registry`: the steps by name.
"""

from fedweigh.client.instruction import Instruction, train_reply
from fedweigh.client.mods import ood_score_mod, oui_mod, signal_mod
from fedweigh.client.signals import (
    asw_sample_weights,
    energy_scores,
    mc_uncertainty,
    ood_score_signal,
    oui_signal,
    ufl_weights,
    weighted_loss,
)

__all__ = [
    "Instruction",
    "asw_sample_weights",
    "energy_scores",
    "mc_uncertainty",
    "ood_score_mod",
    "ood_score_signal",
    "oui_mod",
    "oui_signal",
    "signal_mod",
    "train_reply",
    "ufl_weights",
    "weighted_loss",
]
