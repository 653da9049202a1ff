"""SCAFFOLD's client step: each local step corrected by ``c − c_i``, and the step size reported.

SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning", arXiv 1910.06378, Algorithm 1) corrects every local step
by the difference of the server's control variate ``c`` and the client's own
``c_i``: ``y ← y − η_l (g_i(y) − c_i + c)``. Here the optimizer takes its own
step on the (possibly ASW-weighted) loss and the correction follows it,
``y ← y − η_l (c − c_i)``, as the FLood spec's plug-in use (§4) and the common
implementations do; with plain SGD the two are the same step. The server sends
``c − c_i`` with the instruction (record ``scaffold-correction``) and keeps
every ``c_i`` itself (:mod:`.server`), so nothing stays on the node. The client
reports ``K · η_l`` (``scaffold-step-size``: the steps the correction followed
times their learning rate), from which the server computes the new ``c_i``.

For your own loop::

    correction = ControlCorrection.from_instruction(model, message.content, learning_rate)  # SGD's rate
    for ...:
        loss.backward(); optimizer.step(); correction()
    metrics.update(correction.report())

>>> import torch
>>> layer = torch.nn.Linear(1, 1, bias=False)
>>> _ = torch.nn.init.zeros_(layer.weight)
>>> correction = ControlCorrection(layer, {"weight": torch.tensor([[2.0]])}, learning_rate=0.1)
>>> correction(); correction()
>>> round(layer.weight.item(), 4), correction.report()  # two steps of −0.1 · 2
(-0.4, {'scaffold-step-size': 0.2})
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from flwr.app import ArrayRecord
from torch import nn

from fedweigh.arrays import to_tensors
from fedweigh.client.steps import ClientStep, Metrics, StepContext
from fedweigh.methods.scaffold.protocol import CORRECTION, STEP_SIZE
from fedweigh.protocol import TrainRecipe


def corrected_parameters(model: nn.Module) -> list[str]:
    """The names SCAFFOLD keeps variates for and corrects: the trainable parameters (not BatchNorm's statistics)."""
    return [name for name, parameter in model.named_parameters() if parameter.requires_grad]


class ControlCorrection:
    """After each optimizer step: ``p ← p − η_l (c − c_i)`` for every trainable parameter.

    ``correction`` maps the trainable parameters' names (:func:`corrected_parameters`) to ``c − c_i``. A
    correction that names anything else (a buffer, a frozen parameter) or lacks a trainable parameter is
    refused: server and client would then disagree about the variates.
    """

    def __init__(self, model: nn.Module, correction: Mapping[str, torch.Tensor], learning_rate: float) -> None:
        if not learning_rate > 0:
            raise ValueError(f"learning_rate = {learning_rate!r}: accepted: a number > 0")
        self.learning_rate = learning_rate
        self.steps = 0
        parameters = dict(model.named_parameters())
        trainable = corrected_parameters(model)
        foreign = sorted(set(correction) - set(trainable))
        missing = sorted(set(trainable) - set(correction))
        if foreign or missing:
            raise ValueError(
                f"{CORRECTION} names {len(foreign)} tensors that are not trainable parameters of this model "
                f"{foreign[:3]} and lacks {len(missing)} that are {missing[:3]}; accepted: one correction per "
                "trainable parameter (a library SCAFFOLD strategy takes their names: parameters=...)"
            )
        self.pairs = []
        for name in trainable:
            parameter, value = parameters[name], correction[name]
            if tuple(value.shape) != tuple(parameter.shape):
                raise ValueError(
                    f"{CORRECTION}[{name!r}] has shape {tuple(value.shape)}, the parameter "
                    f"{tuple(parameter.shape)}: the correction is for another model"
                )
            self.pairs.append((parameter, value.to(parameter.device, parameter.dtype)))

    @classmethod
    def from_instruction(
        cls, model: nn.Module, records: Mapping[str, object], learning_rate: float
    ) -> ControlCorrection:
        """The correction of a train instruction's ``scaffold-correction`` record."""
        record = records.get(CORRECTION)
        if not isinstance(record, ArrayRecord):
            raise ValueError(
                f"the train instruction has no ArrayRecord {CORRECTION!r}: SCAFFOLD's server sends one to every "
                "client it asks to train"
            )
        return cls(model, to_tensors(record), learning_rate)

    @torch.no_grad()
    def __call__(self) -> None:
        for parameter, value in self.pairs:
            parameter.sub_(value, alpha=self.learning_rate)
        self.steps += 1

    def report(self) -> Metrics:
        """``{"scaffold-step-size": K · η_l}`` for the reply (K: the steps corrected so far)."""
        return {STEP_SIZE: self.steps * self.learning_rate}


class CorrectionStep(ClientStep):
    """After every optimizer step, SCAFFOLD's correction; after training, ``K · η_l``."""

    name = "scaffold"

    def __init__(self) -> None:
        self.correction: ControlCorrection | None = None

    def after_each_step(self, context: StepContext) -> ControlCorrection:
        learning_rate = TrainRecipe.from_config(context.config).learning_rate
        self.correction = ControlCorrection.from_instruction(context.model, context.records, learning_rate)
        return self.correction

    def after_training(self, context: StepContext) -> Metrics:
        if self.correction is None:
            raise RuntimeError(
                "SCAFFOLD's step reports after training but was never given the steps to correct: the training "
                "loop must call after_each_step(context) before training and the callable it returns after every "
                "optimizer step (a loop of your own: ControlCorrection)"
            )
        return self.correction.report()


STEP_CLASSES = (CorrectionStep,)
"""This package's client steps (gathered by :mod:`fedweigh.client.registry`)."""

__all__ = ["ControlCorrection", "CorrectionStep", "corrected_parameters"]
