"""FedBuff's server step: a buffer of K client updates, a step when it is full.

Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation"
(AISTATS 2022, arXiv 2106.06639), Algorithm 1. Every client update
``Δ_k = θ_k − θ_start(k)`` (relative to the model the client started from)
is added to a buffer, weighted by its staleness; when the buffer holds K
updates the server steps

    w ← w + η_g · (1/K) · Σ_k s(τ_k) Δ_k,    s(τ) = 1/sqrt(1 + τ),

and the buffer empties. τ_k is the number of server steps taken since the
model the client trained was sent (the model's *version*, as the authors'
simulator FLSim counts it with its sequence numbers), not a number of rounds:
with K = 50 and 10 arrivals a round, an update 20 rounds late is about 4
steps stale.

Here the server runs in rounds. A round's arrivals (fresh, late ones of
simulated delays, or replies past a round's deadline) enter the buffer one
by one, in partition order, and the server steps as soon as the buffer holds
K, more than once in a round if enough arrive; an arrival after a step in
the same round is one step stale. A round that only buffers leaves the
global model as it is: it is aggregated (its updates were taken), and its
record's diagnostics say so (``server-steps`` 0, ``buffered``, the updates
waiting). Updates still in the buffer when the run ends are not applied, as
those still on their way are not. The buffer (one float64 sum the size of
the model, and its count) and the rounds of past steps are in the
checkpoint, so a resumed run steps exactly where the uninterrupted one does.

Every tensor the model exchanges takes the step, batch-norm statistics
included; an integer one (``num_batches_tracked``) is computed in float64
and rounded.

Defaults, and whose (``[fedbuff]``):

* ``buffer-size`` K = 10: Nguyen et al.'s (the buffer of their published
  example, FLSim's ``examples/configs/sent140_fedbuff_config.json``); the
  Feddle paper tuned K over {10, 20, 50};
* ``staleness-scaling`` on: Nguyen et al.'s s(τ) = 1/sqrt(1 + τ) (FLSim's
  polynomial staleness weight with exponent 1/2);
* ``server-lr`` η_g = 1: the Feddle spec's (§3.4), one of the Feddle paper's
  grid {0.01, 0.1, 1}. Nguyen et al. tune η_g per task, with server momentum
  (their example: η_g = 0.7, momentum 0.9); momentum is not implemented: the
  Feddle paper's FedBuff (spec §7) is the plain step above.

``buffer-size = 0`` is the step this package called FedBuff before (issue
51): every round, the mean of that round's arrivals,
``w + η_g/|B| Σ sw(τ) Δ`` with τ in rounds, which is Feddle's fallback with
the search off (:class:`~fedweigh.methods.feddle.update.FallbackStep`), bit for
bit; with ``staleness-scaling = false`` it is that FedBuff exactly.

Example
-------
>>> import numpy as np
>>> fedbuff = BufferedStep(buffer_size=2, server_lr=0.5)
>>> w0 = {"w": np.zeros(2, dtype=np.float32)}
>>> def arrival(round_, client):  # one fresh update arriving in round_
...     return RoundUpdate(round_, w0, [{"w": np.array(client, dtype=np.float32)}], [round_], np.ones(1), np.ones(1))
>>> first = arrival(1, [2.0, 0.0])
>>> fedbuff(first)["w"].tolist(), first.diagnostics["server-steps"], first.diagnostics["buffered"]
([0.0, 0.0], 0, 1)
>>> fedbuff(arrival(2, [0.0, 4.0]))["w"].tolist()  # full: w + 0.5 · (1/2) · ((2, 0) + (0, 4))
[0.5, 1.0]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedweigh.methods.declaration import Declaration, Method
from fedweigh.methods.fedavg.server import SAMPLE_COUNT
from fedweigh.methods.fedbuff.protocol import FedBuffSettings
from fedweigh.methods.feddle.update import FallbackStep
from fedweigh.settings import Settings
from fedweigh.strategies.averaging import NamedArrays
from fedweigh.strategies.library import MethodStrategy
from fedweigh.strategies.updates import RoundUpdate, ServerUpdate


def staleness_weight(staleness: int) -> float:
    """FedBuff's ``s(τ) = 1/sqrt(1 + τ)``.

    >>> staleness_weight(0), staleness_weight(3)
    (1.0, 0.5)
    """
    return 1.0 / math.sqrt(1.0 + staleness)


def buffered_step(
    model: NamedArrays, total: Mapping[str, np.ndarray], buffer_size: int, server_lr: float
) -> dict[str, np.ndarray]:
    """``w + η_g · total / K``, tensor by tensor: in float64, returned in each tensor's dtype (integers rounded)."""
    scale = server_lr / buffer_size
    stepped = {}
    for name, value in model.items():
        value = np.asarray(value)
        result = value.astype(np.float64) + scale * total[name]
        integer = not np.issubdtype(value.dtype, np.floating)
        stepped[name] = (np.rint(result) if integer else result).astype(value.dtype)
    return stepped


class UpdateBuffer:
    """The sum ``Σ s(τ_k) Δ_k`` of the buffered updates (float64, tensor by tensor) and how many it holds."""

    def __init__(self) -> None:
        self.total: dict[str, np.ndarray] = {}
        self.count = 0

    def add(self, model: NamedArrays, start: NamedArrays, weight: float) -> None:
        """Buffer the update ``model − start``, times ``weight``."""
        for name, value in model.items():
            delta = np.asarray(value, dtype=np.float64) - np.asarray(start[name], dtype=np.float64)
            if name in self.total:
                self.total[name] += weight * delta
            else:
                self.total[name] = weight * delta
        self.count += 1

    def clear(self) -> None:
        self.total, self.count = {}, 0

    def state(self) -> dict[str, Any]:
        return {"count": self.count, "total": {name: value.copy() for name, value in self.total.items()}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.count = int(state.get("count", 0))
        self.total = {name: np.array(value, dtype=np.float64) for name, value in state.get("total", {}).items()}


class BufferedStep(ServerUpdate):
    """Nguyen et al.'s FedBuff: a step ``w + η_g/K Σ s(τ) Δ`` whenever K updates are buffered (module docstring).

    Parameters
    ----------
    buffer_size : int
        K, at least 1 (``fedbuff.buffer-size = 0`` builds :class:`~fedweigh.methods.feddle.update.FallbackStep`).
    server_lr : float
        η_g.
    staleness_scaling : bool
        Weigh each update by ``s(τ) = 1/sqrt(1 + τ)``, τ in server steps; off: by 1.
    """

    name = "fedbuff"
    uses_weights = False

    def __init__(self, buffer_size: int = 10, server_lr: float = 1.0, staleness_scaling: bool = True) -> None:
        if buffer_size < 1:
            raise ValueError(
                f"fedbuff.buffer-size = {buffer_size!r} is not a buffer; accepted here: an integer >= 1 "
                "(0, a step every round on what arrived, is BufferedStep.build's FallbackStep)"
            )
        self.buffer_size, self.server_lr, self.staleness_scaling = buffer_size, server_lr, staleness_scaling
        self.buffer = UpdateBuffer()
        self.step_rounds: list[int] = []  # the round of every server step so far, in order

    @classmethod
    def build(cls, settings: Settings, server_data: object | None = None) -> ServerUpdate:
        options = settings.fedbuff
        if options.buffer_size == 0:
            return FallbackStep.build(settings)
        return cls(options.buffer_size, options.server_lr, options.staleness_scaling)

    @property
    def steps(self) -> int:
        """Server steps taken since the start: the global model's version."""
        return len(self.step_rounds)

    def staleness(self, model_round: int) -> int:
        """Server steps taken since the global model of ``model_round`` was sent: those of that round or later."""
        return sum(1 for step_round in self.step_rounds if step_round >= model_round)

    def __call__(self, update: RoundUpdate) -> dict[str, np.ndarray]:
        model = {name: np.asarray(value) for name, value in update.global_model.items()}
        staleness: list[int] = []
        weights: list[float] = []
        steps_before = self.steps
        for index, client in enumerate(update.models):
            tau = self.staleness(update.model_rounds[index])
            weight = staleness_weight(tau) if self.staleness_scaling else 1.0
            self.buffer.add(client, update.start_model(index), weight)
            staleness.append(tau)
            weights.append(round(weight, 6))
            if self.buffer.count == self.buffer_size:
                model = buffered_step(model, self.buffer.total, self.buffer_size, self.server_lr)
                self.buffer.clear()
                self.step_rounds.append(update.server_round)
        update.diagnostics.update(
            {
                "server-steps": self.steps - steps_before,
                "buffered": self.buffer.count,
                "model-version": self.steps,
                "staleness-steps": staleness,
                "staleness-weights": weights,
            }
        )
        return model

    def state(self) -> dict[str, Any]:
        return {"buffer": self.buffer.state(), "step-rounds": list(self.step_rounds)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.buffer.load_state(state.get("buffer", {}))
        self.step_rounds = [int(r) for r in state.get("step-rounds", [])]


FEDBUFF = Method(
    "fedbuff",
    SAMPLE_COUNT,
    update=BufferedStep,
    meaning="FedBuff: a step with the staleness-weighted mean of every K buffered updates",
)
_FEDBUFF = FedBuffSettings()


class FedBuff(MethodStrategy):
    """FedBuff (Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation", arXiv 2106.06639).

    Client updates wait in a buffer; once it holds ``buffer_size`` (K) the
    server steps, ``w ← w + η_g / K · Σ s(τ) Δ``, ``s(τ) = 1/√(1 + τ)`` with τ
    the server steps since the update's model (``staleness_scaling``), and the
    buffer empties. Made for asynchrony: give ``round_deadline`` (a
    deployment) or ``delay_std`` (a simulation) and ``max_staleness``.
    ``buffer_size = 0``: a step every round on what arrived. Options as
    ``[fedbuff]``.
    """

    method = FEDBUFF

    def __init__(
        self,
        *,
        buffer_size: int = _FEDBUFF.buffer_size,
        server_lr: float = _FEDBUFF.server_lr,
        staleness_scaling: bool = _FEDBUFF.staleness_scaling,
        **kwargs: Any,
    ) -> None:
        fedbuff = {"buffer_size": buffer_size, "server_lr": server_lr, "staleness_scaling": staleness_scaling}
        super().__init__(options={"fedbuff": fedbuff}, **kwargs)


DECLARATION = Declaration(methods=(FEDBUFF,), updates=(BufferedStep,), strategies=(FedBuff,))
