"""FedAlign's part of the protocol (the FedOUI paper's baseline): its options table ``[fedalign]``."""

from __future__ import annotations

from pydantic import Field

from fedweigh.options import OptionsTable


class FedAlignSettings(OptionsTable):
    """``[fedalign]``: the cosine-alignment rule of the FedOUI paper's baseline."""

    epsilon: float = Field(1e-3, ge=0.0)
    size_exponent: float = Field(1.0, ge=0.0)  # rho in w ∝ n^rho (max(0, cos) + eps)^eta
    alignment_exponent: float = Field(1.0, ge=0.0)  # eta


OPTIONS = {"fedalign": FedAlignSettings}
