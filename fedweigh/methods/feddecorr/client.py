"""FedDecorr's client step: the batch's features decorrelated by a term in the loss.

FedDecorr (Shi et al., "Towards Understanding and Mitigating Dimensional
Collapse in Heterogeneous Federated Learning", arXiv 2210.00226) standardises
the batch's features per dimension, ``r̂ = (r − mean(r)) / sqrt(var(r) + ε)``
(ε = 1e-8, the variance unbiased as ``torch.var``), forms ``C = r̂ᵀ r̂``
(d × d) and adds ``β · mean_{j≠k}(C_jk²) / B`` to the loss (0 for a batch of
one), as the FLood spec (§4) pins it from the authors' code. The features
are the input of the model's classifier.

>>> import torch
>>> r = torch.tensor([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]])  # two perfectly correlated dimensions
>>> round(float(decorrelation_loss(r)), 4)  # C_01 = C_10 = 2 (the unbiased variance): (4 + 4) / 2 / 3
1.3333
"""

from __future__ import annotations

import torch

from fedweigh.client.steps import ClientStep, StepContext
from fedweigh.client.training import LossTerm
from fedweigh.methods.feddecorr.protocol import FedDecorrSettings
from fedweigh.protocol import table_from_config

EPSILON = 1e-8
"""ε of the standardisation (the FLood authors' code)."""


def decorrelation_loss(features: torch.Tensor) -> torch.Tensor:
    """``mean_{j≠k}(C_jk²) / B`` of a batch's features ``[B, d]`` (without β); 0 for one sample or dimension."""
    count, dimensions = features.shape
    if count < 2 or dimensions < 2:
        return features.sum() * 0.0
    standardised = (features - features.mean(dim=0, keepdim=True)) / torch.sqrt(
        features.var(dim=0, keepdim=True) + EPSILON
    )
    correlation = standardised.T @ standardised
    off_diagonal = correlation[~torch.eye(dimensions, dtype=torch.bool, device=features.device)]
    return off_diagonal.pow(2).mean() / count


class Decorrelation:
    """The loss term ``β · decorrelation_loss(features)``."""

    def __init__(self, beta: float) -> None:
        self.beta = beta

    def __call__(self, features: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        return self.beta * decorrelation_loss(features)


class DecorrelationStep(ClientStep):
    """During training: FedDecorr's term, at ``feddecorr.beta``."""

    name = "feddecorr"

    def loss_term(self, context: StepContext) -> LossTerm | None:
        options = table_from_config("feddecorr", FedDecorrSettings, context.config)
        return Decorrelation(options.beta) if options.beta > 0 else None


STEP_CLASSES = (DecorrelationStep,)
"""This package's client steps (gathered by :mod:`fedweigh.client.registry`)."""

__all__ = ["Decorrelation", "DecorrelationStep", "decorrelation_loss"]
