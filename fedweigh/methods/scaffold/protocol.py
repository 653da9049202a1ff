"""SCAFFOLD's part of the protocol: its options ``[scaffold]``, the correction it sends, the step size it reads."""

from __future__ import annotations

import math

from pydantic import Field

from fedweigh.options import OptionsTable
from fedweigh.protocol import Signal, StepSpec


class ScaffoldSettings(OptionsTable):
    """``[scaffold]``: the server's global step size η_g (1: the paper's experiments; FLood's Table I gives none)."""

    server_lr: float = Field(1.0, gt=0.0, allow_inf_nan=False)  # η_g: x ← x + η_g Σ_k w_k (y_k − x)


CORRECTION = "scaffold-correction"
"""The instruction's ArrayRecord holding this client's ``c − c_i``, by the model's tensor names."""

STEP_SIZE = "scaffold-step-size"
"""``K · η_l``: the local steps the correction followed times their learning rate (a reply metric)."""


def finite_positive(value: float) -> bool:
    """A finite value > 0."""
    return bool(math.isfinite(value) and value > 0)


OPTIONS = {"scaffold": ScaffoldSettings}
SIGNALS = (Signal(STEP_SIZE, "scaffold", finite_positive, "K · η_l: local steps times their learning rate"),)
STEPS = (
    StepSpec(
        "scaffold",
        (STEP_SIZE,),
        None,
        "after every optimizer step: the parameters moved by −η_l (c − c_i), the correction the server sent",
    ),
)
