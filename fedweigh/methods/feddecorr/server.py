"""FedDecorr's method and strategy: FedAvg's server, the decorrelation term on the clients (:mod:`.client`)."""

from __future__ import annotations

from typing import Any

from fedweigh.methods.declaration import Declaration, Method
from fedweigh.methods.fedavg.server import SAMPLE_COUNT
from fedweigh.methods.feddecorr.protocol import FedDecorrSettings
from fedweigh.strategies.library import MethodStrategy

FEDDECORR = Method(
    "feddecorr", SAMPLE_COUNT, steps=("feddecorr",), meaning="FedDecorr: FedAvg with a feature decorrelation term"
)
_FEDDECORR = FedDecorrSettings()


class FedDecorr(MethodStrategy):
    """FedDecorr (Shi et al., arXiv 2210.00226): clients add ``β · mean_{j≠k}(C_jk²) / B`` of their features.

    Your ClientApp adds :class:`fedweigh.client.Decorrelation` (``beta`` from ``instruction.feddecorr``) to each
    batch's loss, on the features its classifier takes. Options as ``[feddecorr]``.
    """

    method = FEDDECORR

    def __init__(self, *, beta: float = _FEDDECORR.beta, **kwargs: Any) -> None:
        super().__init__(options={"feddecorr": {"beta": beta}}, **kwargs)


DECLARATION = Declaration(
    methods=(FEDDECORR,),
    strategies=(FedDecorr,),
)
