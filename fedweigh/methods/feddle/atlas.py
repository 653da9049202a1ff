"""Feddle's model atlas: a bounded buffer of client updates, their importance, and merging coefficients.

The Feddle paper (Zhu et al., "Guided Model Merging for Hybrid Data Learning:
Leveraging Centralized Data to Refine Decentralized Models", spec
``specs/feddle.md`` §3.2-3.4, §3.7) keeps at most M client deltas ("anchors")
and merges them into the global model with coefficients searched on
server-held data. This module holds the pieces that do not need a model:

* :class:`ModelAtlas`: the anchors (flattened trainable parameters), their
  importance scores ``|ĉ|``, which are new since the last search, and where
  each came from; adding evicts the least important anchor when full (new
  anchors are protected until scored; if all are, the oldest new one goes);
* :func:`median_norm_ratios`: ``r_m = median ||a|| / ||a_m||``, so that the
  normalised anchor ``ā_m = r_m a_m`` has the median norm (Eq. 4);
* :func:`fallback_coefficients`: the coefficients whose merge is exactly
  FedBuff's step, ``c'_m = η_g sw(τ_m) / |B| / r_m`` for the new anchors, 0
  for the others (§3.4);
* :func:`merged` and :func:`coefficient_gradient`: ``w' = w + Σ c_m r_m a_m``
  and ``∂L/∂c_m = r_m <∂L/∂w', a_m> + λ (c_m − c'_m)`` (App. E, Eq. 16): the
  model is linear in c, so one backward pass at w' and one product with the
  anchors give the exact gradient, without a graph through the anchors.

Example
-------
>>> import torch
>>> atlas = ModelAtlas(capacity=2)
>>> for arrival, delta in enumerate([[3.0, 4.0], [0.0, 1.0], [1.0, 0.0]]):
...     atlas.add(torch.tensor(delta), origin=arrival, num_examples=10, dispatch_round=1, arrival_round=1)
>>> len(atlas), atlas.evictions  # the third arrival evicted the oldest of the two unscored anchors
(2, 1)
>>> median_norm_ratios(torch.stack([torch.tensor([3.0, 4.0]), torch.tensor([0.0, 1.0])])).round(decimals=6).tolist()
[0.6, 3.0]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

NORM_FLOOR = 1e-12
"""``||a_m||`` below this counts as this, so that a zero update does not divide by zero."""


@dataclass
class Anchor:
    """One client update in the atlas, with where it came from."""

    delta: torch.Tensor  # flattened trainable parameters, float32, never rescaled in storage
    score: float = math.inf  # |ĉ| of its last search; +inf until first scored
    new: bool = True  # received since the last search
    origin: int = -1  # the client (partition id)
    num_examples: int = 0
    dispatch_round: int = 0
    arrival_round: int = 0
    order: int = 0  # arrival order, for "oldest"

    @property
    def staleness(self) -> int:
        return self.arrival_round - self.dispatch_round


@dataclass
class ModelAtlas:
    """At most ``capacity`` anchors; adding to a full atlas evicts the least important one.

    ``fifo = True`` evicts the oldest instead (the paper's "Base" ablation).
    The anchors live as the rows of one ``[capacity, d]`` tensor on
    ``device``, allocated at the first update: an anchor is written into the
    row of its slot, and :meth:`matrix` is a view, not a copy (with
    ResNet-18, a copy of 20 anchors would be 0.9 GB every round).
    """

    capacity: int
    fifo: bool = False
    device: torch.device | str = "cpu"
    anchors: list[Anchor] = field(default_factory=list)
    evictions: int = 0
    _arrivals: int = 0
    _rows: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.anchors)

    def add(self, delta: torch.Tensor, **where: Any) -> None:
        """Store ``delta`` (a new, unscored anchor), evicting when the atlas is full (spec §3.2)."""
        if self.capacity < 1:
            raise ValueError(f"feddle.atlas-size = {self.capacity!r} is not accepted; accepted: an integer >= 1")
        flat = delta.detach().flatten()
        if self._rows is None or self._rows.shape != (self.capacity, flat.numel()):
            self._rows = torch.zeros(self.capacity, flat.numel(), dtype=torch.float32, device=self.device)
        if len(self.anchors) < self.capacity:
            slot = len(self.anchors)
            self.anchors.append(None)  # type: ignore[arg-type]  # filled below
        else:
            slot = self._victim()
            self.evictions += 1
        self._rows[slot].copy_(flat)
        self.anchors[slot] = Anchor(self._rows[slot], order=self._arrivals, **where)
        self._arrivals += 1

    def _victim(self) -> int:
        indices = range(len(self.anchors))
        if self.fifo:
            return min(indices, key=lambda i: self.anchors[i].order)
        scored = [i for i in indices if not self.anchors[i].new]
        if not scored:  # every slot is unscored: the oldest new anchor goes (spec A7)
            return min(indices, key=lambda i: self.anchors[i].order)
        return min(scored, key=lambda i: (self.anchors[i].score, self.anchors[i].order))  # ties: the oldest

    def matrix(self) -> torch.Tensor:
        """The anchors as the rows of a ``[|A|, d]`` matrix (a view of the atlas's storage)."""
        if self._rows is None:
            raise ValueError("the atlas is empty")
        return self._rows[: len(self.anchors)]

    @property
    def nbytes(self) -> int:
        """Bytes the anchors' storage takes."""
        return 0 if self._rows is None else self._rows.element_size() * self._rows.numel()

    def score(self, coefficients: torch.Tensor) -> None:
        """After a search: each anchor's score becomes |ĉ_m|, and none is new any more."""
        for anchor, value in zip(self.anchors, coefficients.tolist(), strict=True):
            anchor.score, anchor.new = abs(value), False

    def state(self) -> dict[str, Any]:
        """Everything needed to continue after a restart (the checkpoint holds it), on the CPU."""
        return {
            "capacity": self.capacity,
            "fifo": self.fifo,
            "evictions": self.evictions,
            "arrivals": self._arrivals,
            "anchors": [
                {**{k: v for k, v in vars(a).items() if k != "delta"}, "delta": a.delta.detach().cpu().clone()}
                for a in self.anchors
            ],
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.evictions = int(state.get("evictions", 0))
        entries = state.get("anchors", [])
        self.anchors, self._rows = [], None
        for entry in entries:
            self.add(entry["delta"], **{k: v for k, v in entry.items() if k not in ("delta", "order", "score", "new")})
            self.anchors[-1].order, self.anchors[-1].score, self.anchors[-1].new = (
                entry["order"],
                entry["score"],
                entry["new"],
            )
        self._arrivals = int(state.get("arrivals", 0))


def median_norm_ratios(anchors: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    """``r_m = median_j ||a_j|| / ||a_m||`` (Eq. 4; numpy's median: the mean of the middle two), or ones."""
    if not normalize:
        return torch.ones(anchors.shape[0], dtype=torch.float64)
    norms = torch.linalg.vector_norm(anchors, dim=1, dtype=torch.float64).clamp_min(NORM_FLOOR)
    return float(np.median(norms.numpy())) / norms


def fallback_coefficients(
    anchors: Sequence[Anchor], ratios: torch.Tensor, server_lr: float = 1.0, staleness_scaled: bool = False
) -> torch.Tensor:
    """FedBuff's step in normalised coordinates: ``c'_m = η_g sw(τ_m) / |B| / r_m`` for new anchors, else 0.

    ``sw(τ) = 1``, or ``1/sqrt(1 + τ)`` with ``staleness_scaled`` (FedBuff's
    staleness scaling). Then ``Σ c'_m r_m a_m = η_g / |B| Σ_{m new} sw(τ_m) a_m``.
    """
    new = [i for i, anchor in enumerate(anchors) if anchor.new]
    coefficients = torch.zeros(len(anchors), dtype=torch.float64)
    for i in new:
        weight = 1.0 / math.sqrt(1.0 + anchors[i].staleness) if staleness_scaled else 1.0
        coefficients[i] = server_lr * weight / len(new) / float(ratios[i])
    return coefficients


def merged(base: torch.Tensor, anchors: torch.Tensor, ratios: torch.Tensor, coefficients: torch.Tensor) -> torch.Tensor:
    """``w' = w + Σ_m c_m r_m a_m`` (flattened; float32 like the model)."""
    scales = (coefficients * ratios).to(anchors.dtype)
    return base + scales @ anchors


def coefficient_gradient(
    weight_gradient: torch.Tensor,
    anchors: torch.Tensor,
    ratios: torch.Tensor,
    coefficients: torch.Tensor,
    fallback: torch.Tensor,
    regularization: float = 0.0,
) -> torch.Tensor:
    """``∂L/∂c_m = r_m <g, a_m> + λ (c_m − c'_m)``, g the loss gradient with respect to w' (Eq. 16)."""
    projected = (anchors @ weight_gradient.to(anchors.dtype)).double() * ratios  # float32 product: no d-sized copy
    return projected + regularization * (coefficients - fallback)
