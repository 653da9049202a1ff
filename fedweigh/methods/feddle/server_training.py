"""Training on the server's own data: the Center and Fed+FT baselines of the Feddle paper.

* :class:`Center`: the model trained on the server's in-distribution data
  alone, from the same initial model, with Adam; no client is sent anything.
  Its ``center.epochs`` are spread evenly over the run's rounds (round t runs
  the epochs up to ``⌊E t / R⌋``), so that it is evaluated like every other
  arm, round by round; its optimizer state carries over between rounds.
* :class:`FineTunedMean` (Fed+FT): every round, FedAvg's weighted mean of the
  arrivals (stale ones rebased), then ``fedft.epochs`` of fine-tuning on the
  server's data with a fresh Adam.

Both train exactly as a client does (:func:`fedweigh.client.training.train_locally`).

Example
-------
>>> [epochs_in_round(server_round, total_epochs=5, num_rounds=10) for server_round in range(1, 11)]
[0, 1, 0, 1, 0, 1, 0, 1, 0, 1]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from fedweigh.arrays import NamedArrays
from fedweigh.client.training import train_locally
from fedweigh.components import new_model, resolve_device
from fedweigh.data.server import ServerData
from fedweigh.models import on_device
from fedweigh.models.finetuning import exchanged_state, load_exchanged_state
from fedweigh.protocol import TrainRecipe
from fedweigh.settings import Settings
from fedweigh.strategies.updates import RoundUpdate, ServerUpdate, WeightedMean


def epochs_in_round(server_round: int, total_epochs: int, num_rounds: int) -> int:
    """Epochs of ``total_epochs`` that fall in ``server_round`` when spread evenly over ``num_rounds``."""
    return total_epochs * server_round // num_rounds - total_epochs * (server_round - 1) // num_rounds


class ServerTrainer:
    """Trains a model of the run's architecture on the server's data, as a client would."""

    def __init__(self, model: nn.Module, data: ServerData, recipe: TrainRecipe, seed: int, device: torch.device):
        self.model = on_device(model, device)
        self.data = data
        self.recipe = recipe
        self.seed = seed
        self.device = device

    def train(
        self, arrays: NamedArrays, epochs: int, server_round: int, optimizer_state: dict | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]:
        """``arrays`` trained ``epochs`` on the server's data; the model and the optimizer's final state."""
        load_exchanged_state(self.model, {name: torch.tensor(np.asarray(value)) for name, value in arrays.items()})
        recipe = TrainRecipe(**{**vars(self.recipe), "local_epochs": epochs})
        generator = torch.Generator(device="cpu").manual_seed(
            int(np.random.SeedSequence([self.seed, server_round, 31]).generate_state(1)[0])
        )
        stats = train_locally(
            self.model,
            self.data.data.to(self.device),
            recipe,
            self.data.transform,
            self.device,
            generator,
            optimizer_state=optimizer_state,
        )
        trained = {name: value.cpu().numpy().copy() for name, value in exchanged_state(self.model).items()}
        return trained, stats.optimizer_state or {}


def _recipe(learning_rate: float, batch_size: int, keep_state: bool) -> TrainRecipe:
    return TrainRecipe(
        local_epochs=1,
        batch_size=batch_size,
        optimizer="adam",
        learning_rate=learning_rate,
        weight_decay=0.0,
        persist_optimizer_state=keep_state,
    )


def _in_distribution(server_data: object | None, name: str) -> ServerData:
    if not isinstance(server_data, ServerData) or server_data.kind != "id":
        raise ValueError(
            f"strategy = {name!r} trains on the server's in-distribution data; accepted: server-data = 'id'"
        )
    return server_data


class Center(ServerUpdate):
    """The model trained on the server's data alone (see the module docstring)."""

    name = "center"
    uses_weights = False
    server_data = ("id",)
    needs_clients = False

    def __init__(self, trainer: ServerTrainer, total_epochs: int, num_rounds: int) -> None:
        self.trainer = trainer
        self.total_epochs = total_epochs
        self.num_rounds = num_rounds
        self.optimizer_state: dict[str, torch.Tensor] = {}

    @classmethod
    def build(cls, settings: Settings, server_data: object | None = None) -> Center:
        data = _in_distribution(server_data, cls.name)
        recipe = _recipe(settings.center.learning_rate, settings.center.batch_size, keep_state=True)
        trainer = ServerTrainer(new_model(settings), data, recipe, settings.seed, resolve_device(settings.device))
        return cls(trainer, settings.center.epochs, settings.num_server_rounds)

    def __call__(self, update: RoundUpdate) -> dict[str, np.ndarray]:
        epochs = epochs_in_round(update.server_round, self.total_epochs, self.num_rounds)
        update.diagnostics["server-epochs"] = epochs
        if epochs == 0:
            return dict(update.global_model)
        trained, self.optimizer_state = self.trainer.train(
            update.global_model, epochs, update.server_round, self.optimizer_state
        )
        return trained

    def state(self) -> dict[str, Any]:
        return {"optimizer": dict(self.optimizer_state)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.optimizer_state = dict(state.get("optimizer", {}))


class FineTunedMean(ServerUpdate):
    """Fed+FT: the weighted mean of the arrivals, then fine-tuning on the server's data."""

    name = "fedft"
    server_data = ("id",)

    def __init__(self, trainer: ServerTrainer, epochs: int) -> None:
        self.trainer = trainer
        self.epochs = epochs
        self.mean = WeightedMean()

    @classmethod
    def build(cls, settings: Settings, server_data: object | None = None) -> FineTunedMean:
        data = _in_distribution(server_data, cls.name)
        recipe = _recipe(settings.fedft.learning_rate, settings.fedft.batch_size, keep_state=False)
        trainer = ServerTrainer(new_model(settings), data, recipe, settings.seed, resolve_device(settings.device))
        return cls(trainer, settings.fedft.epochs)

    def __call__(self, update: RoundUpdate) -> dict[str, np.ndarray]:
        averaged = self.mean(update)
        trained, _ = self.trainer.train(averaged, self.epochs, update.server_round)
        update.diagnostics["server-epochs"] = self.epochs
        return trained
