"""FedBuff's part of the protocol: its options table ``[fedbuff]``."""

from __future__ import annotations

from pydantic import Field

from fedweigh.options import OptionsTable


class FedBuffSettings(OptionsTable):
    """``[fedbuff]``: FedBuff's buffered server step (see :mod:`fedweigh.methods.fedbuff.server`).

    K = 10 (their published example's buffer) and the staleness weight on are Nguyen et al.'s; η_g = 1 is the
    Feddle spec's choice (§3.4), one of the Feddle paper's grid {0.01, 0.1, 1}.
    """

    buffer_size: int = Field(10, ge=0)  # K: a step when K are buffered; 0: every round on what arrived (pre-#51)
    server_lr: float = Field(1.0, gt=0.0, allow_inf_nan=False)  # η_g: w += η_g · (1/K) Σ s(τ) Δ
    staleness_scaling: bool = True  # s(τ) = 1/sqrt(1 + τ), τ the server steps since the update's model; off: 1


OPTIONS = {"fedbuff": FedBuffSettings}
