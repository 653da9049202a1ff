"""MOON's part of the protocol: its options ``[moon]`` and its client step."""

from __future__ import annotations

from pydantic import Field

from fedweigh.options import OptionsTable
from fedweigh.protocol import StepSpec


class MOONSettings(OptionsTable):
    """``[moon]``: the contrastive term's weight μ and temperature τ (μ = 1, τ = 0.5: FLood's Table I)."""

    mu: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    temperature: float = Field(0.5, gt=0.0, allow_inf_nan=False)


OPTIONS = {"moon": MOONSettings}
STEPS = (
    StepSpec(
        "moon",
        (),
        "moon",
        "during training: μ times the contrastive loss pulling the features to the global model's, away from the "
        "client's previous model's",
        keeps_node_state=True,
    ),
)
