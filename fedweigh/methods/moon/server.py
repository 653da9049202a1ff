"""MOON's method and strategy: FedAvg's server, the model-contrastive term on the clients (:mod:`.client`)."""

from __future__ import annotations

from typing import Any

from fedweigh.methods.declaration import Declaration, Method
from fedweigh.methods.fedavg.server import SAMPLE_COUNT
from fedweigh.methods.moon.protocol import MOONSettings
from fedweigh.strategies.library import MethodStrategy

MOON_METHOD = Method("moon", SAMPLE_COUNT, steps=("moon",), meaning="MOON: FedAvg with a model-contrastive term")
_MOON = MOONSettings()


class MOON(MethodStrategy):
    """MOON (Li, He and Song, arXiv 2103.16257): ``μ · CE([cos(r, r_glob)/τ, cos(r, r_prev)/τ], 0)`` in the loss.

    Your ClientApp adds :class:`fedweigh.client.Contrast` (frozen copies of the received global model and of its
    last local model, ``mu`` and ``temperature`` from ``instruction.moon``) to each batch's loss. Options as
    ``[moon]``.
    """

    method = MOON_METHOD

    def __init__(self, *, mu: float = _MOON.mu, temperature: float = _MOON.temperature, **kwargs: Any) -> None:
        super().__init__(options={"moon": {"mu": mu, "temperature": temperature}}, **kwargs)


DECLARATION = Declaration(methods=(MOON_METHOD,), strategies=(MOON,))
