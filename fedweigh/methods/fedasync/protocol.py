"""FedAsync's part of the protocol: its options table ``[fedasync]``."""

from __future__ import annotations

from pydantic import Field

from fedweigh.options import OptionsTable


class FedAsyncSettings(OptionsTable):
    """``[fedasync]``: FedAsync's staleness-discounted mixing, one arrival at a time (τ in rounds)."""

    alpha: float = Field(0.4, gt=0.0, le=1.0)  # w ← (1 - α_τ) w + α_τ w_client
    a: float = Field(0.5, ge=0.0, allow_inf_nan=False)  # α_τ = α (τ + 1)^(-a)


OPTIONS = {"fedasync": FedAsyncSettings}
