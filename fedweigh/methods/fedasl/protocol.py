"""FedAsl's part of the protocol (the FedNolowe paper's baseline): its options table ``[fedasl]``."""

from __future__ import annotations

from pydantic import Field

from fedweigh.options import OptionsTable


class FedAslSettings(OptionsTable):
    """``[fedasl]``: FedAsl's loss-deviation rule (FedNolowe's baseline).

    ``alpha``: half-width of the good region around the median loss, in
    standard deviations; ``beta``: the distance given to clients inside it.
    Defaults are those of the FedNolowe paper's code.
    """

    alpha: float = Field(0.5, ge=0.0, allow_inf_nan=False)
    beta: float = Field(0.2, gt=0.0, allow_inf_nan=False)


OPTIONS = {"fedasl": FedAslSettings}
