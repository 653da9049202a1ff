"""FedNova (Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization", arXiv 2007.07481): each client's update normalised by its local steps.

A client that takes more local steps moves further; averaging the raw
updates then optimises a different objective than the clients' weighted one.
FedNova divides each update by its client's effective step count ``a_k``,
averages the normalised updates with the rule's weights and takes one step
of the averaged count:

    d_k = (θ − θ_k) / a_k,    d = Σ_k p_k d_k,    τ_eff = Σ_k p_k a_k,    θ ← θ − τ_eff · d.

``a_k`` is the number of local steps ``τ_k`` for plain SGD; with momentum ρ
(SGD's ``momentum``) it is ``[τ_k − ρ (1 − ρ^τ_k) / (1 − ρ)] / (1 − ρ)``
(the paper's Sec. 5 for momentum SGD). Adam has no such form; with it
``a_k = τ_k``. The server counts ``τ_k = E · ⌈n_k / B⌉`` from the reply's
``num-examples`` and the train recipe (epochs E, batch size B), as the
ClientApp trains; equal step counts give FedAvg. Stale replies are rebased
first, as every update here does; integer buffers take the weighted mean,
rounded. No options.

>>> effective_steps(10, 0.0), round(effective_steps(10, 0.9), 4)
(10.0, 41.3811)
>>> import numpy as np
>>> nova_step({"w": np.array([0.0])}, [{"w": np.array([2.0])}, {"w": np.array([4.0])}], np.array([0.5, 0.5]),
...           np.array([1.0, 4.0]))["w"].tolist()  # d = 0.5·(−2) + 0.5·(−1) = −1.5, τ_eff = 2.5
[3.75]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedweigh.methods.costs import MethodCost, sample_count_weighting
from fedweigh.methods.declaration import Declaration, Method
from fedweigh.methods.fedavg.server import SAMPLE_COUNT
from fedweigh.settings import Settings, validate
from fedweigh.strategies.averaging import NamedArrays, weighted_average
from fedweigh.strategies.library import MethodStrategy
from fedweigh.strategies.updates import RoundUpdate, ServerUpdate


def local_steps(num_examples: float, epochs: int, batch_size: int) -> int:
    """``E · ⌈n / B⌉``: the steps of the ClientApp's loop (the last batch of an epoch may be smaller)."""
    return epochs * math.ceil(num_examples / batch_size)


def effective_steps(steps: float, momentum: float = 0.0) -> float:
    """FedNova's ``a``: ``τ`` for plain SGD, ``[τ − ρ (1 − ρ^τ) / (1 − ρ)] / (1 − ρ)`` with momentum ρ."""
    if momentum == 0.0:
        return float(steps)
    return (steps - momentum * (1.0 - momentum**steps) / (1.0 - momentum)) / (1.0 - momentum)


def nova_step(
    model: NamedArrays, clients: Sequence[NamedArrays], weights: np.ndarray, steps: np.ndarray
) -> dict[str, np.ndarray]:
    """``θ − τ_eff Σ_k p_k (θ − θ_k) / a_k`` for floating-point tensors, in float64; the others are left out."""
    tau_effective = float(np.dot(weights, steps))
    stepped = {}
    for name, value in model.items():
        value = np.asarray(value)
        if not np.issubdtype(value.dtype, np.floating):
            continue
        start = value.astype(np.float64)
        direction = sum(
            p / a * (start - np.asarray(client[name], dtype=np.float64))
            for p, a, client in zip(weights, steps, clients, strict=True)
        )
        stepped[name] = (start - tau_effective * direction).astype(value.dtype)
    return stepped


class NormalizedAveraging(ServerUpdate):
    """FedNova's server step (module docstring), for a recipe of ``epochs``, ``batch_size`` and ``momentum``."""

    name = "fednova"

    def __init__(self, epochs: int, batch_size: int, momentum: float = 0.0) -> None:
        self.epochs, self.batch_size, self.momentum = epochs, batch_size, momentum

    @classmethod
    def model_problems(cls, settings: Settings, model: Any) -> list[str]:
        """FedNova's ``a_k`` counts a momentum buffer that starts at zero each round."""
        if settings.persist_optimizer_state and settings.optimizer == "sgd" and settings.momentum > 0:
            return [
                "strategy = 'fednova' with persist-optimizer-state = true: FedNova normalises by the steps of a "
                "momentum that starts at zero every round, which a kept momentum buffer does not; accepted: "
                "persist-optimizer-state = false, or momentum = 0"
            ]
        return []

    @classmethod
    def build(cls, settings: Settings, server_data: object | None = None) -> NormalizedAveraging:
        momentum = settings.momentum if settings.optimizer == "sgd" else 0.0
        return cls(settings.local_epochs, settings.batch_size, momentum)

    def __call__(self, update: RoundUpdate) -> dict[str, np.ndarray]:
        taus = [local_steps(n, self.epochs, self.batch_size) for n in update.num_examples]
        steps = np.array([effective_steps(tau, self.momentum) for tau in taus])
        clients = update.current_models()
        stepped = nova_step(update.global_model, clients, update.weights, steps)
        update.diagnostics.update(
            {"local-steps": taus, "tau-effective": round(float(np.dot(update.weights, steps)), 6)}
        )
        if len(stepped) == len(update.global_model):
            return stepped
        mean = weighted_average(clients, update.weights)
        return {name: stepped.get(name, mean[name]) for name in update.global_model}


_RUN = Settings()

FEDNOVA = Method(
    "fednova", SAMPLE_COUNT, update=NormalizedAveraging, meaning="FedNova: updates normalised by local steps"
)


class FedNova(MethodStrategy):
    """FedNova (Wang et al., arXiv 2007.07481): each update divided by its local steps, one step of their mean.

    The steps are counted from each reply's ``num-examples`` with the instruction's ``local-epochs`` and
    ``batch-size`` (``E · ⌈n / B⌉``), and the recipe's SGD momentum; give ``local_epochs``, ``batch_size``,
    ``momentum`` and ``optimizer`` as your clients train (the defaults are the run config's: 3 epochs of 32,
    SGD with momentum 0.9). No options of its own.
    """

    method = FEDNOVA

    def __init__(
        self,
        *,
        local_epochs: int = _RUN.local_epochs,
        batch_size: int = _RUN.batch_size,
        momentum: float = _RUN.momentum,
        optimizer: str = _RUN.optimizer,
        **kwargs: Any,
    ) -> None:
        recipe = {"local-epochs": local_epochs, "batch-size": batch_size, "momentum": momentum, "optimizer": optimizer}
        self._recipe = validate(recipe)  # checked as the run config is, named by its keys
        super().__init__(**kwargs)

    def server_update(self, settings: Settings) -> ServerUpdate:
        return NormalizedAveraging.build(self._recipe)


DECLARATION = Declaration(
    methods=(FEDNOVA,),
    updates=(NormalizedAveraging,),
    costs={"fednova": MethodCost(sample_count_weighting)},
    strategies=(FedNova,),
)
