"""Client steps: what a method asks a client to do besides plain training.

A strategy names the steps in its recipe (``client-steps = ["oui"]``); the
generic ClientApp runs them around local training without knowing which
strategy sent them. A step may

* before training, return a :class:`~fedweigh.client.training.SampleWeighting`
  that re-weights the client's samples in the loss (UFL, FLood's ASW), and
  metrics measured on the received global model;
* after training, return metrics measured on the trained model (FedOUI's OUI).

Metric names are the signals a server rule reads. Steps compose: their sample
weights multiply, their metrics are merged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fedweigh.client.training import SampleWeighting
from fedweigh.data.tensors import ImageTensors
from fedweigh.data.transforms import BatchTransform

if TYPE_CHECKING:
    from fedweigh.settings import Settings

Metrics = dict[str, float]


@dataclass
class StepContext:
    """Everything a step may need about this client and round."""

    model: nn.Module
    data: ImageTensors
    transform: BatchTransform
    device: torch.device
    seed: int
    partition_id: int
    server_round: int
    options: Mapping[str, Any] = field(default_factory=dict)


class ClientStep:
    """Base step: does nothing. Subclasses override one or both hooks.

    :meth:`recipe` says which options the step needs from the run settings;
    the server puts them into the train ConfigRecord, and the step finds them
    in ``StepContext.options``.
    """

    name = "step"

    @classmethod
    def recipe(cls, settings: Settings) -> dict[str, Any]:
        """Recipe entries this step reads (none by default)."""
        return {}

    def before_training(self, context: StepContext) -> tuple[SampleWeighting | None, Metrics]:
        return None, {}

    def after_training(self, context: StepContext) -> Metrics:
        return {}


CLIENT_STEPS: dict[str, Callable[[], ClientStep]] = {}


def register_step(name: str) -> Callable[[type[ClientStep]], type[ClientStep]]:
    """Class decorator adding a step to :data:`CLIENT_STEPS` under ``name``."""

    def add(step: type[ClientStep]) -> type[ClientStep]:
        step.name = name
        CLIENT_STEPS[name] = step
        return step

    return add


def with_steps(recipe: dict[str, Any], settings: Settings, names: list[str]) -> dict[str, Any]:
    """Add client steps (and the options they read) to a strategy's recipe.

    Steps already in the recipe are kept and not repeated, so a strategy's own
    step and the same step named in the ``client-steps`` setting run once.
    """
    unknown = [name for name in names if name not in CLIENT_STEPS]
    if unknown:
        raise ValueError(f"unknown client step(s) {unknown}; known: {sorted(CLIENT_STEPS)}")
    steps = list(recipe.get("client-steps", []))
    for name in names:
        if name not in steps:
            steps.append(name)
            recipe.update(CLIENT_STEPS[name].recipe(settings))
    if steps:
        recipe["client-steps"] = steps
    return recipe


def build_steps(names: list[str]) -> list[ClientStep]:
    """Instantiate the steps a recipe names; an unknown name is an error."""
    unknown = [name for name in names if name not in CLIENT_STEPS]
    if unknown:
        raise ValueError(f"unknown client step(s) {unknown}; known: {sorted(CLIENT_STEPS)}")
    return [CLIENT_STEPS[name]() for name in names]


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
