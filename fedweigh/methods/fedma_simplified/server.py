"""FedMA as the FedNolowe authors' code has it: a simplified layer-wise matching, not FedMA.

The FedNolowe paper's third baseline is FedMA (Wang et al. 2020), but its
authors' code (spec §7, §10) runs a much simpler rule, and this module is
that rule, under the name ``fedma-simplified``:

* the first client of the round (here: the first in partition order) is the
  reference;
* for every tensor with two or more dimensions (a layer's weight matrix or
  convolution kernel), each other client's rows (output units or filters) are
  matched one-to-one to the reference's rows: the Hungarian algorithm
  (``scipy.optimize.linear_sum_assignment``) on their Euclidean distances,
  the rows reordered accordingly;
* the matched tensors, and every other tensor (biases, BatchNorm weights and
  buffers, *not* reordered), are averaged uniformly (w = 1/K).

It is not FedMA: there is no probabilistic (Beta-Bernoulli) matching, no
layer-wise freezing and retraining, no growing of the global layer, and a
permutation is not carried to the next layer's inputs nor to the layer's own
bias, so a matched unit's bias and BatchNorm statistics stay with its old
position. As every client starts from the same global model, the matching is
mostly the identity and the rule is close to the uniform mean (recorded per
round: ``rows-moved``).

The authors' code leaves the tensors whose name contains ``fc3`` or
``classifier`` unmatched: of their three models, that is LeNet-5's output
layer only (their CNN's and VGG-9's output layers are matched too).
``fedma-simplified.skip-layers`` names such layers (``"fc3"`` for fedweigh's
``lenet5``, whose output layer is ``fc3``; empty, the default, matches every
layer, as the authors' code does for its CNN and VGG-9).

Example
-------
>>> reference = np.array([[0.0, 0.0], [1.0, 1.0]])
>>> match_rows(reference, np.array([[1.1, 0.9], [0.1, 0.0]])).tolist()  # row 1 first, then row 0
[1, 0]
>>> swapped = np.array([[1.0, 1.0], [0.0, 0.0]])
>>> models = [{"w": reference, "b": np.array([0.0, 2.0])}, {"w": swapped, "b": np.array([2.0, 0.0])}]
>>> merged, moved = matched_mean(models)
>>> merged["w"].tolist(), merged["b"].tolist(), moved  # the rows are matched, the bias is not
([[0.0, 0.0], [1.0, 1.0]], [1.0, 1.0], 2)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import cdist

from fedweigh.methods.costs import MethodCost, uniform_weighting
from fedweigh.methods.declaration import Declaration, Method
from fedweigh.methods.fedavg.server import UNIFORM
from fedweigh.settings import Settings
from fedweigh.strategies.averaging import NamedArrays, weighted_average
from fedweigh.strategies.updates import RoundUpdate, ServerUpdate


def match_rows(reference: np.ndarray, other: np.ndarray) -> np.ndarray:
    """The order of ``other``'s rows (first axis) that best matches ``reference``'s, row for row.

    Row ``i`` of ``other[order]`` is the row assigned to reference row ``i`` by
    the Hungarian algorithm on the Euclidean distances of the flattened rows
    (the least total distance).
    """
    if reference.shape != other.shape or reference.ndim < 2:
        raise ValueError(f"match_rows needs arrays of one shape, 2+ dimensions; got {reference.shape}, {other.shape}")
    rows = reference.shape[0]
    cost = cdist(reference.reshape(rows, -1).astype(np.float64), other.reshape(rows, -1).astype(np.float64))
    _, order = linear_sum_assignment(cost)
    return order


def is_matched(name: str, array: np.ndarray, skip_layers: Sequence[str] = ()) -> bool:
    """Whether tensor ``name`` is matched: two or more dimensions, and not in a layer of ``skip_layers``.

    >>> is_matched("fc3.weight", np.zeros((2, 2)), ["fc3"]), is_matched("fc2.weight", np.zeros((2, 2)), ["fc3"])
    (False, True)
    >>> is_matched("bn1.running_mean", np.zeros(4))
    False
    """
    return array.ndim >= 2 and not any(name.startswith(f"{layer}.") for layer in skip_layers)


def matched_mean(models: Sequence[NamedArrays], skip_layers: Sequence[str] = ()) -> tuple[dict[str, np.ndarray], int]:
    """The uniform mean of ``models`` after matching each one's rows to ``models[0]``'s; and how many rows moved.

    A row moved when the matching put it elsewhere than at its own index.
    """
    if not models:
        raise ValueError("matched_mean needs at least one model")
    reference = models[0]
    aligned: list[dict[str, np.ndarray]] = [{name: np.asarray(value) for name, value in m.items()} for m in models]
    moved = 0
    for name, anchor in reference.items():
        anchor = np.asarray(anchor)
        if not is_matched(name, anchor, skip_layers):
            continue
        for model in aligned[1:]:
            order = match_rows(anchor, model[name])
            moved += int(np.sum(order != np.arange(len(order))))
            model[name] = model[name][order]
    return weighted_average(aligned, np.full(len(models), 1.0 / len(models))), moved


class FedMASimplified(ServerUpdate):
    """The FedNolowe authors' "FedMa": rows matched to the first client's, then the uniform mean (module docstring)."""

    name = "fedma-simplified"
    uses_weights = False

    def __init__(self, skip_layers: Sequence[str] = ()) -> None:
        self.skip_layers = tuple(skip_layers)

    @classmethod
    def build(cls, settings: Settings, server_data: object | None = None) -> FedMASimplified:
        return cls(skip_layer_names(settings.fedma_simplified.skip_layers))

    @classmethod
    def model_problems(cls, settings: Settings, model: torch.nn.Module) -> list[str]:
        layers = dict(model.named_modules())
        unknown = [name for name in skip_layer_names(settings.fedma_simplified.skip_layers) if name not in layers]
        if not unknown:
            return []
        return [
            f"fedma-simplified.skip-layers = {settings.fedma_simplified.skip_layers!r} names "
            f"{', '.join(unknown)}, not a layer of model = {settings.model!r}; accepted: comma-separated layer "
            f"names of the model, e.g. {', '.join(name for name in layers if name and '.' not in name)}"
        ]

    def __call__(self, update: RoundUpdate) -> dict[str, np.ndarray]:
        merged, moved = matched_mean(update.current_models(), self.skip_layers)
        update.diagnostics["rows-moved"] = moved
        return merged


def skip_layer_names(text: str) -> list[str]:
    """``"fc3, fc2"`` -> ``["fc3", "fc2"]``; ``""`` -> ``[]``."""
    return [name.strip() for name in text.split(",") if name.strip()]


def row_matching(num_clients: int, matched: Sequence[tuple[int, int]]) -> int:
    """``fedma-simplified``'s matching: per other client and matched ``(rows r, row length c)``, distances and the
    assignment bound (module docstring)."""
    per_client = sum(rows * rows * (3 * length - 1) + rows * rows + 2 * rows**3 for rows, length in matched)
    return (num_clients - 1) * per_client


DECLARATION = Declaration(
    methods=(
        Method(
            "fedma-simplified",
            UNIFORM,
            update=FedMASimplified,
            meaning="the FedNolowe authors' code's 'FedMa' (not FedMA): rows matched to one client's, uniform mean",
        ),
    ),
    updates=(FedMASimplified,),
    costs={"fedma-simplified": MethodCost(uniform_weighting, matching=row_matching)},
)
