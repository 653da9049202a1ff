"""FedAvgM (Hsu et al., "Measuring the Effects of Non-Identical Data Distribution for Federated Visual
Classification", arXiv 1909.06335): FedAvg's update taken with server momentum.

Each round the rule's weighted mean of the replies gives the update
``Δ = Σ_k w_k θ_k − θ`` (stale replies rebased, as every update here does);
the server keeps a velocity ``v ← ρ v + Δ`` (``v = Δ`` in the first round)
and steps ``θ ← θ + η v``. With ``ρ = 0`` and ``η = 1`` this is FedAvg, bit
for bit up to float64 rounding; the step is Flower's ``FedAvgM`` with its
pseudo-gradient ``−Δ``. Integer buffers (BatchNorm's batch counts) take the
weighted mean, rounded. The velocity goes into the checkpoint.

>>> import numpy as np
>>> step = ServerMomentum(momentum=0.5)
>>> [float(momentum_step({"w": np.zeros(1)}, {"w": np.ones(1)}, step.velocity, 0.5, 1.0)["w"][0]) for _ in "ab"]
[1.0, 1.5]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fedweigh.methods.costs import MethodCost, sample_count_weighting
from fedweigh.methods.declaration import Declaration, Method
from fedweigh.methods.fedavg.server import SAMPLE_COUNT
from fedweigh.methods.fedavgm.protocol import FedAvgMSettings
from fedweigh.settings import Settings
from fedweigh.strategies.averaging import NamedArrays, weighted_average
from fedweigh.strategies.library import MethodStrategy
from fedweigh.strategies.updates import RoundUpdate, ServerUpdate


def momentum_step(
    model: NamedArrays, delta: Mapping[str, np.ndarray], velocity: dict[str, np.ndarray], momentum: float, lr: float
) -> dict[str, np.ndarray]:
    """``v ← ρ v + Δ`` (in place, float64; ``v = Δ`` for a tensor without one yet), then ``θ + η v`` per tensor.

    Tensors that are not floating point are left out (the caller takes their mean).
    """
    stepped = {}
    for name, value in model.items():
        value = np.asarray(value)
        if not np.issubdtype(value.dtype, np.floating):
            continue
        change = np.asarray(delta[name], dtype=np.float64)
        velocity[name] = momentum * velocity[name] + change if name in velocity else change.copy()
        stepped[name] = (value.astype(np.float64) + lr * velocity[name]).astype(value.dtype)
    return stepped


class ServerMomentum(ServerUpdate):
    """FedAvgM's server step (module docstring); ``momentum`` ρ, ``lr`` η."""

    name = "fedavgm"

    def __init__(
        self, momentum: float = FedAvgMSettings().server_momentum, lr: float = FedAvgMSettings().server_lr
    ) -> None:
        self.momentum, self.lr = momentum, lr
        self.velocity: dict[str, np.ndarray] = {}

    @classmethod
    def build(cls, settings: Settings, server_data: object | None = None) -> ServerMomentum:
        return cls(settings.fedavgm.server_momentum, settings.fedavgm.server_lr)

    def __call__(self, update: RoundUpdate) -> dict[str, np.ndarray]:
        mean = weighted_average(update.current_models(), update.weights)
        delta = {
            name: np.asarray(mean[name], dtype=np.float64) - np.asarray(value, dtype=np.float64)
            for name, value in update.global_model.items()
            if np.issubdtype(np.asarray(value).dtype, np.floating)
        }
        stepped = momentum_step(update.global_model, delta, self.velocity, self.momentum, self.lr)
        norm = float(np.sqrt(sum(float((v**2).sum()) for v in self.velocity.values())))
        update.diagnostics["velocity-norm"] = round(norm, 6)
        return {name: stepped.get(name, mean[name]) for name in update.global_model}

    def state(self) -> dict[str, Any]:
        return {"velocity": {name: value.copy() for name, value in self.velocity.items()}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.velocity = {name: np.asarray(value, dtype=np.float64) for name, value in state.get("velocity", {}).items()}


FEDAVGM = Method(
    "fedavgm", SAMPLE_COUNT, update=ServerMomentum, meaning="FedAvgM: FedAvg's update with server momentum"
)
_FEDAVGM = FedAvgMSettings()


class FedAvgM(MethodStrategy):
    """FedAvgM (Hsu et al., arXiv 1909.06335): ``v ← ρ v + Δ``, ``θ ← θ + η v`` with Δ the round's mean update.

    Its weights are the rule's (sample counts by default; ``aggregation=DAC()`` gives FLood's plug-in
    composition, spec §4). Options as ``[fedavgm]``.
    """

    method = FEDAVGM

    def __init__(
        self, *, server_momentum: float = _FEDAVGM.server_momentum, server_lr: float = _FEDAVGM.server_lr, **kwargs: Any
    ) -> None:
        super().__init__(options={"fedavgm": {"server_momentum": server_momentum, "server_lr": server_lr}}, **kwargs)


DECLARATION = Declaration(
    methods=(FEDAVGM,),
    updates=(ServerMomentum,),
    costs={"fedavgm": MethodCost(sample_count_weighting)},
    strategies=(FedAvgM,),
)
