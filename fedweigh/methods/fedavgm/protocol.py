"""FedAvgM's part of the protocol: its options table ``[fedavgm]`` (server momentum; nothing reaches the client)."""

from __future__ import annotations

from pydantic import Field

from fedweigh.options import OptionsTable


class FedAvgMSettings(OptionsTable):
    """``[fedavgm]``: the server's momentum step (see :mod:`.server`).

    ρ = 0.1 is FLood's Table I setting for FedAvgM; η = 1 is Hsu et al.'s
    server learning rate with which ρ = 0 is FedAvg.
    """

    server_momentum: float = Field(0.1, ge=0.0, lt=1.0)  # ρ: v ← ρ v + Δ
    server_lr: float = Field(1.0, gt=0.0, allow_inf_nan=False)  # η: w ← w + η v


OPTIONS = {"fedavgm": FedAvgMSettings}
