"""FedAsync (Xie et al., "Asynchronous Federated Optimization"): each arrival mixed in, discounted by staleness.

>>> import numpy as np
>>> AsyncMixing(alpha=0.5, a=1.0).mixing(1)  # α (τ + 1)^(−a)
0.25
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedweigh.methods.declaration import Declaration, Method
from fedweigh.methods.fedasync.protocol import FedAsyncSettings
from fedweigh.methods.fedavg.server import SAMPLE_COUNT
from fedweigh.settings import Settings
from fedweigh.strategies.averaging import weighted_average
from fedweigh.strategies.library import MethodStrategy
from fedweigh.strategies.updates import RoundUpdate, ServerUpdate


class AsyncMixing(ServerUpdate):
    """FedAsync: each arrival in turn, ``w ← (1 − α_τ) w + α_τ w_client``, ``α_τ = α (τ + 1)^(−a)``.

    Xie et al., "Asynchronous Federated Optimization" (arXiv 1903.03934), with
    their polynomial staleness function. The client's own model is mixed in
    (not rebased: FedAsync's rule), each arrival of a round in turn, in
    partition order. Its staleness τ counts *rounds*, from the round whose
    model it trained to the round it arrives in (Xie et al. count server
    updates, one per arrival: with 10 arrivals a round theirs would be about
    ten times larger, so α_τ discounts less here); every arrival of a round
    has its round's staleness, however many were mixed in before it. Every
    exchanged tensor is mixed, batch-norm statistics included; integer buffers
    in float64, rounded. A round where nothing arrives keeps the model.
    Defaults α = 0.4, a = 0.5: in the Feddle paper's grid (α ∈ {0.2, 0.4, 0.8},
    a ∈ {0.1, 0.5, 0.9}).
    """

    name = "fedasync"
    uses_weights = False

    def __init__(self, alpha: float = 0.4, a: float = 0.5) -> None:
        self.alpha, self.a = alpha, a

    @classmethod
    def build(cls, settings: Settings, server_data: object | None = None) -> AsyncMixing:
        return cls(settings.fedasync.alpha, settings.fedasync.a)

    def mixing(self, staleness: int) -> float:
        """``α (τ + 1)^(−a)``."""
        return self.alpha * (staleness + 1.0) ** (-self.a)

    def __call__(self, update: RoundUpdate) -> dict[str, np.ndarray]:
        model = {name: np.asarray(value) for name, value in update.global_model.items()}
        mixes = []
        for index, client in enumerate(update.models):
            alpha = self.mixing(update.staleness(index))
            mixes.append(alpha)
            model = weighted_average([model, client], np.array([1.0 - alpha, alpha]))
        update.diagnostics["mixing"] = [round(alpha, 6) for alpha in mixes]
        return model


FEDASYNC = Method("fedasync", SAMPLE_COUNT, update=AsyncMixing, meaning="FedAsync: staleness-discounted mixing")
_FEDASYNC = FedAsyncSettings()


class FedAsync(MethodStrategy):
    """FedAsync (Xie et al., "Asynchronous Federated Optimization", arXiv 1903.03934).

    Each arrival in turn: ``w ← (1 − α_τ) w + α_τ w_k``, ``α_τ = alpha (τ + 1)^(−a)``,
    τ in rounds. Made for asynchrony, as :class:`~fedweigh.methods.fedbuff.server.FedBuff`.
    Options as ``[fedasync]``.
    """

    method = FEDASYNC

    def __init__(self, *, alpha: float = _FEDASYNC.alpha, a: float = _FEDASYNC.a, **kwargs: Any) -> None:
        super().__init__(options={"fedasync": {"alpha": alpha, "a": a}}, **kwargs)


DECLARATION = Declaration(methods=(FEDASYNC,), updates=(AsyncMixing,), strategies=(FedAsync,))
