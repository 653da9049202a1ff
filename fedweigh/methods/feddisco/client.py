"""FedDisco's client step: d_k, the distance of this client's label distribution from the uniform one.

FedDisco (Ye et al., arXiv 2305.19229, Sec. 4) measures each client's
discrepancy ``d_k = ‖D_k − T‖₂`` between its label distribution ``D_k`` and
the global one ``T``; with a balanced global task (the test sets here) ``T``
is uniform over the C classes, and ``d_k² = Σ_c D_{k,c}² − 1/C``. The number
of classes is the model's output size.

>>> import torch
>>> label_discrepancy(torch.tensor([0, 0, 1, 1]), num_classes=2)
{'label-discrepancy': 0.0}
>>> round(label_discrepancy(torch.tensor([0, 0, 0, 0]), num_classes=2)["label-discrepancy"], 4)  # (1, 0) vs (½, ½)
0.7071
"""

from __future__ import annotations

import torch

from fedweigh.client.signals import Signals
from fedweigh.client.steps import ClientStep, Metrics, StepContext
from fedweigh.methods.feddisco.protocol import LABEL_DISCREPANCY


def label_discrepancy(labels: torch.Tensor, num_classes: int) -> Signals:
    """FedDisco's signal for a client holding ``labels``: ``‖D_k − uniform‖₂`` over ``num_classes`` classes."""
    largest = int(labels.max()) if len(labels) else -1
    if num_classes < 1 or largest >= num_classes:
        raise ValueError(
            f"num_classes = {num_classes}: accepted: at least 1 and more than the largest label ({largest})"
        )
    counts = torch.bincount(labels.to(torch.int64).cpu(), minlength=num_classes).to(torch.float64)
    share = counts / max(float(counts.sum()), 1.0)
    return {LABEL_DISCREPANCY: float(torch.linalg.vector_norm(share - 1.0 / num_classes))}


class LabelDiscrepancyStep(ClientStep):
    """After training: ``label-discrepancy`` of the client's training labels (the classes: the model's outputs)."""

    name = "label-discrepancy"

    def after_training(self, context: StepContext) -> Metrics:
        model = context.model
        was_training = model.training
        model.eval()
        with torch.no_grad():
            probe = context.transform(context.data.images[:1].to(context.device), train=False, generator=None)
            num_classes = int(model(probe).shape[1])
        model.train(was_training)
        return label_discrepancy(context.data.labels, num_classes)


STEP_CLASSES = (LabelDiscrepancyStep,)
"""This package's client steps (gathered by :mod:`fedweigh.client.registry`)."""

__all__ = ["LabelDiscrepancyStep", "label_discrepancy"]
