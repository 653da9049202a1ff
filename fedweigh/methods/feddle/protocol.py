"""Feddle's part of the protocol: its options ``[feddle]``, and ``[center]`` and ``[fedft]`` of its baselines."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedweigh.options import OptionsTable


class FeddleSettings(OptionsTable):
    """``[feddle]``: the model atlas and the coefficient search (see :mod:`fedweigh.methods.feddle.update`)."""

    atlas_size: int = Field(0, ge=0)  # M; 0: twice the clients sampled per round
    eviction: Literal["importance", "fifo"] = "importance"  # which anchor a full atlas drops
    normalize: bool = True  # rescale every anchor to the median anchor norm (Eq. 4)
    init: Literal["fallback", "zero"] = "fallback"  # where the coefficient search starts
    search: bool = True  # false: no search, the fallback step itself
    fallback_server_lr: float = Field(1.0, gt=0.0, allow_inf_nan=False)  # η_g of the fallback (spec §3.4)
    fallback_staleness_scaling: bool = False  # the fallback weighs a new anchor τ rounds old by 1/sqrt(1 + τ)
    regularization: float = Field(0.01, ge=0.0, allow_inf_nan=False)  # λ of (λ/2)||c - c'||²
    search_lr: float = Field(1e-3, gt=0.0, allow_inf_nan=False)  # the paper's grid: 1e-5, 1e-4, 1e-3
    search_epochs: int = Field(10, ge=1)  # passes over the server data (the paper's grid: 1, 10, 20)
    search_batch_size: int = Field(64, ge=1)
    search_optimizer: Literal["adam", "sgd"] = "adam"
    max_coefficient: float = Field(0.0, ge=0.0, allow_inf_nan=False)  # clip |c| to this; 0: no clipping
    head_lr: float = Field(1e-3, gt=0.0, allow_inf_nan=False)  # Adam on the OOD head θ


class CenterSettings(OptionsTable):
    """``[center]``: the model trained on the server's data alone (Adam), ``epochs`` spread over the rounds."""

    epochs: int = Field(50, ge=1)
    learning_rate: float = Field(1e-3, gt=0.0, allow_inf_nan=False)
    batch_size: int = Field(64, ge=1)


class FedFTSettings(OptionsTable):
    """``[fedft]``: FedAvg, then ``epochs`` of fine-tuning on the server's data (fresh Adam) every round."""

    epochs: int = Field(1, ge=1)
    learning_rate: float = Field(1e-4, gt=0.0, allow_inf_nan=False)
    batch_size: int = Field(64, ge=1)


OPTIONS = {"feddle": FeddleSettings, "center": CenterSettings, "fedft": FedFTSettings}
