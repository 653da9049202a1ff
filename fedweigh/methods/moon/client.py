"""MOON's client step: a contrastive term between this model's features, the global model's and the last local's.

MOON (Li, He and Song, "Model-Contrastive Federated Learning", arXiv
2103.16257) adds to each batch's loss

    μ · CE([cos(r, r_glob) / τ, cos(r, r_prev) / τ], target 0)

with ``r`` the batch's features under the model being trained, ``r_glob``
under the global model the round received (frozen) and ``r_prev`` under
this client's own model after its last round of training (frozen; in its
first round, the global model, as the authors' code starts). The features
are the input of the model's classifier (the FLood spec's "penultimate
feature", §4; MOON's own networks add a projection head, which these models
do not have). The last local model is kept in the node's state between the
rounds it trains in (``moon-previous``), as Flower keeps a ``Context.state``.

>>> import torch
>>> r = torch.tensor([[1.0, 0.0]])
>>> round(float(moon_loss(r, torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]), 0.5)), 4)  # −log σ(2)
0.1269
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from torch import nn

from fedweigh.client.steps import ClientStep, Metrics, StepContext
from fedweigh.client.training import LossTerm, features_of
from fedweigh.methods.moon.protocol import MOONSettings
from fedweigh.models.finetuning import exchanged_state
from fedweigh.protocol import table_from_config

PREVIOUS = "moon-previous"
"""The node-state key of the client's last local model."""


def moon_loss(
    features: torch.Tensor, global_features: torch.Tensor, previous_features: torch.Tensor, temperature: float
) -> torch.Tensor:
    """``CE([cos(r, r_glob)/τ, cos(r, r_prev)/τ], 0)``, the batch's mean (without μ)."""
    positive = F.cosine_similarity(features, global_features, dim=1)
    negative = F.cosine_similarity(features, previous_features, dim=1)
    logits = torch.stack([positive, negative], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(len(features), dtype=torch.long, device=features.device))


class Contrast:
    """The loss term: ``μ · moon_loss`` against frozen copies of the global and the previous local model."""

    def __init__(self, global_model: nn.Module, previous_model: nn.Module, mu: float, temperature: float) -> None:
        self.mu, self.temperature = mu, temperature
        self.frozen = []
        for model in (global_model, previous_model):
            model.eval()
            model.requires_grad_(False)
            captured, _ = features_of(model)
            self.frozen.append((model, captured))

    def features(self, index: int, inputs: torch.Tensor) -> torch.Tensor:
        model, captured = self.frozen[index]
        with torch.no_grad():
            model(inputs)
        return captured.pop().float()

    def __call__(self, features: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        contrast = moon_loss(features, self.features(0, inputs), self.features(1, inputs), self.temperature)
        return self.mu * contrast


class ContrastStep(ClientStep):
    """During training: MOON's term; after it, this model kept as the next round's previous model."""

    name = "moon"

    def loss_term(self, context: StepContext) -> LossTerm | None:
        options = table_from_config("moon", MOONSettings, context.config)
        if options.mu == 0:
            return None
        global_model = copy.deepcopy(context.model)
        previous_model = copy.deepcopy(context.model)
        kept = context.node_state.get(PREVIOUS) if context.node_state is not None else None
        if isinstance(kept, ArrayRecord):
            previous_model.load_state_dict(kept.to_torch_state_dict(), strict=False)
        return Contrast(global_model, previous_model, options.mu, options.temperature)

    def after_training(self, context: StepContext) -> Metrics:
        if context.node_state is not None:
            context.node_state[PREVIOUS] = ArrayRecord(
                {name: tensor.detach().cpu() for name, tensor in exchanged_state(context.model).items()}
            )
        return {}


STEP_CLASSES = (ContrastStep,)
"""This package's client steps (gathered by :mod:`fedweigh.client.registry`)."""

__all__ = ["Contrast", "ContrastStep", "moon_loss"]
