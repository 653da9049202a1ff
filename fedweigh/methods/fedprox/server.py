"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks"): FedAvg's weights and a proximal term.

The client adds ``μ/2 ‖w − w_global‖²`` to its loss (``proximal-mu`` in
every instruction; :mod:`fedweigh.client.training`); the server is FedAvg's.
"""

from __future__ import annotations

from typing import Any

from fedweigh.methods.costs import MethodCost, proximal_extra, sample_count_weighting
from fedweigh.methods.declaration import Declaration, Method
from fedweigh.methods.fedavg.server import SAMPLE_COUNT
from fedweigh.methods.fedprox.protocol import FedProxSettings
from fedweigh.strategies.library import MethodStrategy

_FEDPROX = FedProxSettings()

FEDPROX = Method("fedprox", SAMPLE_COUNT, proximal=True, meaning="FedProx: FedAvg with a proximal term")


class FedProx(MethodStrategy):
    """FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", arXiv 1812.06127).

    Sends ``proximal-mu`` with every instruction, as Flower's ``FedProx``
    does: the client adds ``μ/2 ‖w − w_global‖²`` to its loss. The plug-in
    partner of FLood's pieces: ``FedProx(aggregation=DAC())``.
    """

    method = FEDPROX

    def __init__(self, *, proximal_mu: float = _FEDPROX.proximal_mu, **kwargs: Any) -> None:
        super().__init__(options={"fedprox": {"proximal_mu": proximal_mu}}, **kwargs)


DECLARATION = Declaration(
    methods=(FEDPROX,),
    costs={"fedprox": MethodCost(sample_count_weighting, proximal_extra)},
    strategies=(FedProx,),
)
