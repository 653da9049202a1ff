"""FedDisco's part of the protocol: its options ``[feddisco]``, the ``label-discrepancy`` signal and step."""

from __future__ import annotations

from pydantic import Field

from fedweigh.options import OptionsTable
from fedweigh.protocol import Signal, StepSpec, finite_non_negative


class FedDiscoSettings(OptionsTable):
    """``[feddisco]``: FedDisco's weights ``p_k ∝ ReLU(n_k/N − a d_k + b)`` (see :mod:`.server`).

    a = 0.5 and b = 1 are FLood's Table I settings for FedDisco (the FLood authors' code has b = 0.1, as
    the FedDisco paper's CIFAR-10 runs).
    """

    a: float = Field(0.5, ge=0.0, allow_inf_nan=False)  # how much a discrepancy costs
    b: float = Field(1.0, ge=0.0, allow_inf_nan=False)  # the offset every client gets


LABEL_DISCREPANCY = "label-discrepancy"
"""d_k: the L2 distance of the client's label distribution from the uniform one (a reply metric)."""

OPTIONS = {"feddisco": FedDiscoSettings}
SIGNALS = (
    Signal(LABEL_DISCREPANCY, "label-discrepancy", finite_non_negative, "d_k: L2 distance of the labels from uniform"),
)
STEPS = (
    StepSpec(
        "label-discrepancy",
        (LABEL_DISCREPANCY,),
        None,
        "after training: d_k, the distance of the client's label distribution from the uniform one",
    ),
)
