"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning",
arXiv 1910.06378): client drift corrected by control variates.

The server keeps a control variate ``c`` and, for every client ``i``, the
client's ``c_i`` (all zero at the start). Each train instruction carries
``c − c_i`` (:mod:`.client` applies ``−η_l (c − c_i)`` after every local
step). From a reply ``y_i`` trained from ``x`` in ``K`` steps of learning rate
``η_l`` (the reported ``K · η_l``), the paper's option II gives the client's
new variate, and the server updates the model and ``c`` (Algorithm 1):

    c_i⁺ = c_i − c + (x − y_i) / (K η_l) = (x − y_i) / (K η_l) − (c − c_i)_sent
    x    ← x + η_g Σ_k w_k (y_k − x)
    c    ← c + (1/N) Σ_{i ∈ S} (c_i⁺ − c_i)

with ``N`` the federation's clients and ``w_k`` the rule's weights (the paper's
``1/|S|``; the sample counts by default, as FedAvg and the FLood authors'
baselines weigh, DAC's ``p_c`` in FLood's plug-in use, spec §4, where ``c``
keeps its own ``1/N``). Where the paper's client keeps ``c_i`` and sends
``Δc_i`` up, here the server keeps it, which is the same arithmetic: nothing
lives on the node, a resumed run continues exactly (the checkpoint holds
``c``, every ``c_i`` and what was sent to clients whose replies are still on
their way), and the reply is the model alone. The cost is one model-sized
array per client on the server. A stale reply's ``x`` is the model it
started from and ``(c − c_i)_sent`` the correction it was sent for that
round's model. Under simulated delays (``delay-std``) a late client's
instruction, and so its correction, is made in the round its update arrives
(as its model is the one of the round it was sampled in), so it carries that
round's ``c``; with a real deadline it is the ``c`` it was sent. The variates
are those of the trainable parameters (BatchNorm's statistics have none and
take the weighted mean, as every buffer). A round whose model or ``c`` is not
finite changes nothing. The reported ``K · η_l`` is trusted as the model is.
Option II assumes SGD steps, so Adam is refused.

>>> import numpy as np
>>> x, y = {"w": np.array([1.0])}, {"w": np.array([0.0])}
>>> client_variate(x, y, {"w": np.array([0.5])}, step_size=0.5)["w"].tolist()  # (1 − 0)/0.5 − 0.5
[1.5]
>>> control_step({"w": np.array([0.0])}, [{"w": np.array([1.5])}], num_clients=3)["w"].tolist()
[0.5]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fedweigh.components import new_model
from fedweigh.methods.costs import MethodCost, sample_count_weighting
from fedweigh.methods.declaration import Declaration, Method
from fedweigh.methods.fedavg.server import SAMPLE_COUNT
from fedweigh.methods.scaffold.client import corrected_parameters
from fedweigh.methods.scaffold.protocol import CORRECTION, STEP_SIZE, ScaffoldSettings
from fedweigh.settings import Settings
from fedweigh.strategies.averaging import NamedArrays, all_finite, weighted_average
from fedweigh.strategies.library import MethodStrategy
from fedweigh.strategies.updates import RoundUpdate, ServerUpdate


def _floating(model: NamedArrays) -> list[str]:
    return [name for name, value in model.items() if np.issubdtype(np.asarray(value).dtype, np.floating)]


def client_variate(
    start: NamedArrays, trained: NamedArrays, sent: Mapping[str, np.ndarray], step_size: float
) -> dict[str, np.ndarray]:
    """Option II's ``c_i⁺ = (x − y_i) / (K η_l) − (c − c_i)_sent`` per tensor ``sent`` names, in float64."""
    return {
        name: (np.asarray(start[name], np.float64) - np.asarray(trained[name], np.float64)) / step_size
        - np.asarray(correction, np.float64)
        for name, correction in sent.items()
    }


def control_step(
    control: Mapping[str, np.ndarray], changes: Sequence[Mapping[str, np.ndarray]], num_clients: int
) -> dict[str, np.ndarray]:
    """``c + (1/N) Σ_i Δc_i`` per tensor (float64; a tensor ``c`` lacks starts at zero)."""
    names = dict.fromkeys([*control, *(name for change in changes for name in change)])
    return {
        name: np.asarray(control.get(name, 0.0), np.float64)
        + sum(np.asarray(change.get(name, 0.0), np.float64) for change in changes) / num_clients
        for name in names
    }


class ControlVariates(ServerUpdate):
    """SCAFFOLD's server (module docstring): the model step, ``c`` and every client's ``c_i``.

    ``parameters`` names the tensors with variates, the trainable parameters
    (:func:`~fedweigh.methods.scaffold.client.corrected_parameters`); None: every floating-point tensor (a
    model without floating-point buffers).
    """

    name = "scaffold"
    sends_per_client = True

    def __init__(
        self, server_lr: float = ScaffoldSettings().server_lr, parameters: Sequence[str] | None = None
    ) -> None:
        self.server_lr = server_lr
        self.parameters = None if parameters is None else list(parameters)
        self.control: dict[str, np.ndarray] = {}  # c, float64
        self.variates: dict[str, dict[str, np.ndarray]] = {}  # client key -> c_i, float64
        self.sent: dict[str, tuple[int, dict[str, np.ndarray]]] = {}  # client -> (round, c − c_i) of its instruction

    @classmethod
    def build(cls, settings: Settings, server_data: object | None = None) -> ControlVariates:
        with torch.device("meta"):  # the names of the trainable parameters, without memory or weights
            model = new_model(settings, pretrained_weights=False)
        return cls(settings.scaffold.server_lr, corrected_parameters(model))

    @classmethod
    def model_problems(cls, settings: Settings, model: Any) -> list[str]:
        if settings.optimizer != "sgd":
            return [
                f"strategy = 'scaffold' with optimizer = {settings.optimizer!r}: SCAFFOLD's control variates "
                "(option II) are the mean SGD step, which Adam's steps are not; accepted: optimizer = 'sgd'"
            ]
        return []

    def instruction_arrays(self, client: str, model: NamedArrays, model_round: int) -> dict[str, NamedArrays]:
        own = self.variates.get(client, {})
        names = _floating(model) if self.parameters is None else self.parameters
        correction = {}
        for name in names:
            value = np.asarray(model[name])
            difference = self.control.get(name, 0.0) - own.get(name, 0.0)
            correction[name] = np.broadcast_to(np.asarray(difference, np.float64), value.shape).astype(value.dtype)
        self.sent[client] = (model_round, correction)
        return {CORRECTION: correction}

    def __call__(self, update: RoundUpdate) -> dict[str, np.ndarray]:
        mean = weighted_average(update.current_models(), update.weights)
        model = dict(mean)
        if self.server_lr != 1.0:
            for name in _floating(update.global_model):
                start = np.asarray(update.global_model[name])
                step = np.asarray(mean[name], np.float64) - start.astype(np.float64)
                model[name] = (start.astype(np.float64) + self.server_lr * step).astype(start.dtype)
        variates, changes, unmatched = {}, [], 0
        for index, client in enumerate(update.clients):
            sent_round, sent = self.sent.pop(client, (None, None))
            step_size = update.reports[index].get(STEP_SIZE) if index < len(update.reports) else None
            if sent is None or sent_round != update.model_rounds[index] or not step_size:
                unmatched += 1  # no instruction of ours for the model it trained: its variate stays
                continue
            new = client_variate(update.start_model(index), update.models[index], sent, float(step_size))
            old = self.variates.get(client, {})
            variates[client] = new
            changes.append({name: value - old.get(name, 0.0) for name, value in new.items()})
        control = self.control
        if changes:
            control = control_step(self.control, changes, max(update.num_clients, len(self.variates | variates), 1))
        if all_finite(model) and all_finite(control):  # else the round is not aggregated: nothing changes
            self.control = control
            self.variates.update(variates)
        else:
            update.diagnostics["scaffold-kept"] = "the new model or control variate is not finite"
        update.diagnostics["control-norm"] = round(
            float(np.sqrt(sum(float((value**2).sum()) for value in self.control.values()))), 6
        )
        if unmatched:
            update.diagnostics["scaffold-unmatched"] = unmatched
        return model

    def state(self) -> dict[str, Any]:
        copy = lambda arrays: {name: np.array(value) for name, value in arrays.items()}  # noqa: E731
        return {
            "control": copy(self.control),
            "variates": {client: copy(value) for client, value in self.variates.items()},
            "sent": {client: {"round": sent[0], "correction": copy(sent[1])} for client, sent in self.sent.items()},
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        load = lambda arrays: {name: np.asarray(value) for name, value in arrays.items()}  # noqa: E731
        self.control = load(state.get("control", {}))
        self.variates = {client: load(value) for client, value in state.get("variates", {}).items()}
        self.sent = {
            client: (int(sent["round"]), load(sent["correction"])) for client, sent in state.get("sent", {}).items()
        }


SCAFFOLD_METHOD = Method(
    "scaffold",
    SAMPLE_COUNT,
    steps=("scaffold",),
    update=ControlVariates,
    meaning="SCAFFOLD: local steps corrected by control variates",
)
_SCAFFOLD = ScaffoldSettings()


class SCAFFOLD(MethodStrategy):
    """SCAFFOLD (Karimireddy et al., arXiv 1910.06378): local steps corrected by ``c − c_i``, option II variates.

    Each instruction carries the client's ``c − c_i`` (ArrayRecord ``scaffold-correction``); your ClientApp
    applies it after every optimizer step with :class:`fedweigh.client.ControlCorrection` and reports
    ``scaffold-step-size`` (``K · η_l``). The server keeps ``c`` and every ``c_i``, so clients keep nothing.
    Train with SGD. ``parameters``: the names of your model's trainable parameters
    (``fedweigh.client.corrected_parameters(net)``), needed when its state has floating-point buffers
    (BatchNorm); None: every floating-point tensor. Options as ``[scaffold]``.
    """

    method = SCAFFOLD_METHOD

    def __init__(
        self, *, server_lr: float = _SCAFFOLD.server_lr, parameters: Sequence[str] | None = None, **kwargs: Any
    ) -> None:
        self._parameters = parameters
        super().__init__(options={"scaffold": {"server_lr": server_lr}}, **kwargs)

    def server_update(self, settings: Settings) -> ServerUpdate:
        return ControlVariates(settings.scaffold.server_lr, self._parameters)


DECLARATION = Declaration(
    methods=(SCAFFOLD_METHOD,),
    updates=(ControlVariates,),
    costs={"scaffold": MethodCost(sample_count_weighting, extra_per_step=lambda d: 2 * d)},
    strategies=(SCAFFOLD,),
)
