"""UFL's part of the protocol: its options (``[ufl]``, ``[uagg]``), the uncertainty signals and client steps."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedweigh.options import OptionsTable
from fedweigh.protocol import Signal, StepSpec, finite_non_negative


class UFLSettings(OptionsTable):
    """``[ufl]``: UFL's client step (see :mod:`fedweigh.methods.ufl.client`)."""

    mc_passes: int = Field(10, ge=1)  # N, MC-dropout forward passes
    ratio: float = Field(0.3, gt=0.0, le=1.0)  # r, fraction of samples up-weighted
    alpha: float = Field(0.2, ge=0.0, allow_inf_nan=False)  # lambda = 1 + alpha * u for the selected
    dropout: float = Field(0.5, ge=0.0, lt=1.0)  # p of the dropout inserted before the classifier
    normalize: bool = False  # batch loss / sum(lambda) instead of / B (the paper)
    cheap_path: bool = True  # run only the layers after the first dropout N times


class UAggSettings(OptionsTable):
    """``[uagg]``: UFL's aggregation rule (see :mod:`fedweigh.methods.ufl.server`)."""

    signal: Literal["sum", "mean"] = "sum"  # U_k (paper) or U_k / m_k
    size_aware: bool = False  # weights times n_k


UNCERTAINTY = "uncertainty"
"""U_k: the summed MC-dropout uncertainty of the selected samples (a reply metric)."""
UNCERTAINTY_MEAN = "uncertainty-mean"
"""U_k / m_k: their mean (a reply metric)."""

OPTIONS = {"ufl": UFLSettings, "uagg": UAggSettings}
SIGNALS = (
    Signal(UNCERTAINTY, "ufl", finite_non_negative, "U_k: summed MC-dropout uncertainty of the selected samples"),
    Signal(UNCERTAINTY_MEAN, "ufl", finite_non_negative, "U_k / m_k: mean uncertainty of the selected samples"),
)
STEPS = (
    StepSpec(
        "ufl",
        (UNCERTAINTY, UNCERTAINTY_MEAN),
        "ufl",
        "before training: MC-dropout uncertainty; the most uncertain samples weigh more in the loss",
    ),
    StepSpec("ufl-dropout", (), "ufl", "only the dropout UFL trains with, for baselines of the same architecture"),
)
