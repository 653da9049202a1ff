"""FedProx's part of the protocol: its options table ``[fedprox]``."""

from __future__ import annotations

from pydantic import Field

from fedweigh.options import OptionsTable


class FedProxSettings(OptionsTable):
    """``[fedprox]``: the proximal term of FedProx."""

    proximal_mu: float = Field(0.01, ge=0.0)


OPTIONS = {"fedprox": FedProxSettings}
