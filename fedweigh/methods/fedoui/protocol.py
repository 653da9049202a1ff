"""FedOUI's part of the protocol: its options (``[fedoui]``, ``[oui]``), the ``oui`` signal and client step."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedweigh.options import OptionsTable
from fedweigh.protocol import Signal, StepSpec, in_unit_interval


class FedOUISettings(OptionsTable):
    """``[fedoui]``: FedOUI's aggregation rule (see :mod:`fedweigh.methods.fedoui.server`)."""

    epsilon: float = Field(1e-3, ge=0.0, lt=0.5)  # stability constant and Beta-fit clip
    size_exponent: float = Field(1.0, ge=0.0)  # rho in w ∝ n^rho (s + eps)^gamma
    score_exponent: float = Field(1.0, ge=0.0)  # gamma
    window: int = Field(1, ge=1)  # rounds of OUIs pooled into the Beta fit (1: this round only)


class OUIProbeSettings(OptionsTable):
    """``[oui]``: the client step measuring the OUI (see :mod:`fedweigh.methods.fedoui.client`)."""

    probe_size: int = Field(32, ge=2)  # B, probe samples per client
    probe_layer: str = ""  # module to hook; "" means the model's own probe_layer
    # eval: the fixed images through the evaluation transform (the paper's fixed probe); train: re-augmented
    # every round by the training transform, as the authors' code loads them (spec §3, A3)
    probe_transform: Literal["eval", "train"] = "eval"


OUI = "oui"
"""The OUI of the trained model on the client's probe batch (a reply metric)."""

OPTIONS = {"fedoui": FedOUISettings, "oui": OUIProbeSettings}
SIGNALS = (Signal(OUI, "oui", in_unit_interval, "OUI of the trained model on the client's probe batch"),)
STEPS = (StepSpec("oui", (OUI,), "oui", "after training: the OUI of the trained model on a fixed probe batch"),)
