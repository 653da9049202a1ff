"""FLood's part of the protocol: its options (``[flood]``, ``[dac]``), φ (``ood-score``), λ(t) and client steps."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedweigh.options import OptionsTable
from fedweigh.protocol import Signal, StepSpec, finite


class FLoodSettings(OptionsTable):
    """``[flood]``: FLood's client steps ASW and ``ood-score`` and its λ(t) (:mod:`.client`)."""

    q: float = Field(0.7, ge=0.0, le=1.0)  # the lower q-quantile of a batch's scores is the threshold
    score: Literal["energy", "msp", "max-logit", "gen"] = "energy"
    temperature: float = Field(1.0, gt=0.0, allow_inf_nan=False)  # T of the energy score
    a: float = Field(200.0, ge=0.0, allow_inf_nan=False)  # λ rises from 0 to 2a
    halt_round: int = Field(1000, ge=1)  # T: λ stops growing at round T + 1
    schedule: Literal["cosine", "linear", "quadratic", "exponential", "logistic"] = "cosine"
    lag: bool = False  # the authors' code: λ = 1 in round 1, then one round behind
    mask: Literal["scores", "uniform"] = "scores"  # uniform: every sample gets the batch's mean weight (a control)
    phi_augment: bool = False  # φ on augmented inputs (the authors' code) instead of the data as it is (Eq. 10)


class DACSettings(OptionsTable):
    """``[dac]``: FLood's aggregation rule (see :mod:`fedweigh.methods.flood.server`)."""

    alpha: float = Field(0.5, ge=0.0, allow_inf_nan=False)  # p = (u + alpha v) / (1 + alpha)
    mapping: Literal["sum", "shift", "softmax"] = "sum"  # how OOD scores become shares
    temperature: float = Field(1.0, gt=0.0, allow_inf_nan=False)  # of the softmax mapping


OOD_SCORE = "ood-score"
"""φ: the trained model's mean OOD score on the client's own data (a reply metric)."""
ASW_LAMBDA = "asw-lambda"
"""Round value for the ``asw`` step: FLood's λ(t), which the server computes each round."""

OPTIONS = {"flood": FLoodSettings, "dac": DACSettings}
SIGNALS = (Signal(OOD_SCORE, "ood-score", finite, "φ: mean OOD score of the trained model on the client's own data"),)
STEPS = (
    StepSpec(
        "asw",
        (),
        "flood",
        "during training: the pseudo-OOD samples of each batch (lowest OOD scores) weigh λ(t) in the loss",
    ),
    StepSpec("ood-score", (OOD_SCORE,), "flood", "after training: φ, the trained model's mean OOD score"),
)
