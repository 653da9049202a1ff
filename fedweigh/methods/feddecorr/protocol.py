"""FedDecorr's part of the protocol: its options ``[feddecorr]`` and its client step."""

from __future__ import annotations

from pydantic import Field

from fedweigh.options import OptionsTable
from fedweigh.protocol import StepSpec


class FedDecorrSettings(OptionsTable):
    """``[feddecorr]``: the weight of the decorrelation term (β = 0.1, FLood's Table I; see :mod:`.client`)."""

    beta: float = Field(0.1, ge=0.0, allow_inf_nan=False)


OPTIONS = {"feddecorr": FedDecorrSettings}
STEPS = (
    StepSpec(
        "feddecorr",
        (),
        "feddecorr",
        "during training: β times the mean squared off-diagonal correlation of the batch's features, in the loss",
    ),
)
