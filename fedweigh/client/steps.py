"""Client steps: what a method asks a client to do besides plain training.

The server names the steps in its train instruction (``client-steps``); the
generic ClientApp runs them around local training without knowing which
strategy or rule asked for them. A step may

* before training, return a :class:`~fedweigh.client.training.SampleWeighting`
  that re-weights the client's samples in the loss (UFL, FLood's ASW), and
  signals measured on the received global model;
* during training, add a term to every batch's loss (a
  :class:`~fedweigh.client.training.LossTerm`: MOON's
  contrastive term, FedDecorr's decorrelation), computed from the batch's
  inputs and the model's features there (the input of its ``classifier_layer``),
  added unweighted after the (weighted) cross-entropy;
* after each optimizer step, change the parameters (SCAFFOLD's control-variate
  correction: a callable built before training);
* after training, return signals measured on the trained model (FedOUI's OUI).

Each step's options arrive in the instruction under its run-config table
(``oui.probe-size``; see :data:`fedweigh.methods.catalog.STEPS`). Steps compose:
their sample weights multiply, their signals are merged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from fedweigh.client.training import LossTerm, SampleWeighting
from fedweigh.data.tensors import ImageTensors
from fedweigh.data.transforms import BatchTransform

Metrics = dict[str, float]


@dataclass
class StepContext:
    """Everything a step may need about this client and round.

    Attributes
    ----------
    seed : int
        This client's seed for this round (see ``client_app.client_seed``).
    run_seed : int
        The run's ``seed`` setting (for what must be the same every round).
    partition_id : int
        The partition id; for a site without one, the key its seeds derive from.
    config : Mapping
        The train instruction's ConfigRecord entries (the steps' options).
    """

    model: nn.Module
    data: ImageTensors
    transform: BatchTransform
    device: torch.device
    seed: int
    run_seed: int
    partition_id: int
    server_round: int
    config: Mapping[str, Any] = field(default_factory=dict)
    node_state: Any = None
    """What this node keeps between the rounds it trains in (Flower's ``Context.state``, a ``RecordDict``);
    None where nothing is kept."""
    records: Mapping[str, Any] = field(default_factory=dict)
    """The train instruction's records by key (its ``RecordDict``: the model, the config and what a server update
    sends each client, SCAFFOLD's correction)."""


class ClientStep:
    """Base step: does nothing. Subclasses override one or both hooks.

    :meth:`check_model` lets the check before training
    (:mod:`fedweigh.preflight`) refuse a model the step cannot work on,
    before any client runs.
    """

    name: ClassVar[str] = "step"

    @classmethod
    def check_model(cls, model: nn.Module, config: Mapping[str, Any]) -> None:
        """Raise ``ValueError`` naming the option when the step cannot run on ``model``."""

    def before_training(self, context: StepContext) -> tuple[SampleWeighting | None, Metrics]:
        return None, {}

    def loss_term(self, context: StepContext) -> LossTerm | None:
        """A term for every batch's loss, built before training (None: none)."""
        return None

    def after_each_step(self, context: StepContext) -> Callable[[], None] | None:
        """A callable run after every optimizer step, built before training (None: none)."""
        return None

    def after_training(self, context: StepContext) -> Metrics:
        return {}


@dataclass
class CombinedWeighting:
    """Product of several steps' sample weights."""

    parts: list[SampleWeighting]

    @property
    def normalize(self) -> bool:
        return any(part.normalize for part in self.parts)

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        weights = self.parts[0](logits, labels, indices)
        for part in self.parts[1:]:
            weights = weights * part(logits, labels, indices)
        return weights


def combine(weightings: list[SampleWeighting]) -> SampleWeighting | None:
    """None, the one weighting, or their product."""
    if not weightings:
        return None
    return weightings[0] if len(weightings) == 1 else CombinedWeighting(weightings)
