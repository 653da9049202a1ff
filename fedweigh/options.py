"""The tables of options: one per method and feature of the run config (``[fedoui]``, ``[faults]``, ...).

Each table is a pydantic model whose fields are the options with their
defaults (the papers' where a paper sets one), written once: the app config
in ``pyproject.toml`` holds the same (a test checks every key), and the
library's strategies (:mod:`fedweigh.strategies.library`) take them as
keyword arguments. :class:`OptionsTable` is their base (and that of
:class:`~fedweigh.settings.Settings`): run-config keys are dashed, unknown
keys are refused, values must be of the exact type (a boolean is no number)
and representable (64-bit integers, float32 magnitudes).

Example
-------
>>> FedOUISettings().window, FedOUISettings(window=3).window
(1, 3)
>>> comma_list("ufl, oui")
['ufl', 'oui']
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from fedweigh.protocol import dashed


def comma_list(value: str) -> list[str]:
    """``"ufl, oui"`` to ``["ufl", "oui"]``."""
    return [name.strip() for name in value.split(",") if name.strip()]


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


INT64_ACCEPTED = f"out of range; accepted: integers from {INT64_MIN} to {INT64_MAX} (64 bits, as in TOML)"


FLOAT32_MAX = 3.4028234663852886e38


FLOAT32_ACCEPTED = f"out of range; accepted: numbers of magnitude at most {FLOAT32_MAX:.4g} (torch's float32)"


class OptionsTable(BaseModel):
    """Base of every table of options (and of :class:`~fedweigh.settings.Settings`): dashed keys, unknown keys
    rejected, values of the exact type, representable."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=dashed,
        populate_by_name=True,
        frozen=True,
        allow_inf_nan=False,  # NaN or infinity is never a usable setting (it ran and trained garbage)
    )

    @field_validator("*", mode="before")
    @classmethod
    def _exact_type(cls, value: Any, info: ValidationInfo) -> Any:
        """A boolean is no number, and a string no number or boolean, as in TOML (pydantic would convert them:
        ``local-epochs = true`` ran with 1 epoch)."""
        annotation = cls.model_fields[str(info.field_name)].annotation
        if annotation in (int, float) and isinstance(value, bool | str):
            kind = "a boolean" if isinstance(value, bool) else "a string"
            number = "an integer" if annotation is int else "a number"
            raise ValueError(f"{kind} where a number is expected; accepted: {number}, unquoted")
        if annotation is bool and not isinstance(value, bool):
            raise ValueError("not a boolean; accepted: true or false")
        return value

    @field_validator("*")
    @classmethod
    def _representable(cls, value: Any) -> Any:
        """Integers fit TOML's (and Flower's) 64 bits, numbers torch's float32: larger ones overflowed in torch."""
        if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
            raise ValueError(INT64_ACCEPTED)
        if isinstance(value, float) and abs(value) > FLOAT32_MAX:  # e.g. an optimizer's learning rate
            raise ValueError(FLOAT32_ACCEPTED)
        return value


class FedProxSettings(OptionsTable):
    """``[fedprox]``: the proximal term of FedProx."""

    proximal_mu: float = Field(0.01, ge=0.0)


class FedAslSettings(OptionsTable):
    """``[fedasl]``: FedAsl's loss-deviation rule (FedNolowe's baseline).

    ``alpha``: half-width of the good region around the median loss, in
    standard deviations; ``beta``: the distance given to clients inside it.
    Defaults are those of the FedNolowe paper's code.
    """

    alpha: float = Field(0.5, ge=0.0, allow_inf_nan=False)
    beta: float = Field(0.2, gt=0.0, allow_inf_nan=False)


class FedMASimplifiedSettings(OptionsTable):
    """``[fedma-simplified]``: the FedNolowe authors' simplified matching (see :mod:`fedweigh.strategies.fedma`)."""

    skip_layers: str = ""  # comma-separated layers averaged without matching; "fc3": lenet5's output, as the authors


class FedOUISettings(OptionsTable):
    """``[fedoui]``: FedOUI's aggregation rule (see :mod:`fedweigh.rules.fedoui`)."""

    epsilon: float = Field(1e-3, ge=0.0, lt=0.5)  # stability constant and Beta-fit clip
    size_exponent: float = Field(1.0, ge=0.0)  # rho in w ∝ n^rho (s + eps)^gamma
    score_exponent: float = Field(1.0, ge=0.0)  # gamma
    window: int = Field(1, ge=1)  # rounds of OUIs pooled into the Beta fit (1: this round only)


class OUIProbeSettings(OptionsTable):
    """``[oui]``: the client step measuring the OUI (see :mod:`fedweigh.client.oui`)."""

    probe_size: int = Field(32, ge=2)  # B, probe samples per client
    probe_layer: str = ""  # module to hook; "" means the model's own probe_layer
    # eval: the fixed images through the evaluation transform (the paper's fixed probe); train: re-augmented
    # every round by the training transform, as the authors' code loads them (spec §3, A3)
    probe_transform: Literal["eval", "train"] = "eval"


class FedAlignSettings(OptionsTable):
    """``[fedalign]``: the cosine-alignment rule of the FedOUI paper's baseline."""

    epsilon: float = Field(1e-3, ge=0.0)
    size_exponent: float = Field(1.0, ge=0.0)  # rho in w ∝ n^rho (max(0, cos) + eps)^eta
    alignment_exponent: float = Field(1.0, ge=0.0)  # eta


class UFLSettings(OptionsTable):
    """``[ufl]``: UFL's client step (see :mod:`fedweigh.client.ufl`)."""

    mc_passes: int = Field(10, ge=1)  # N, MC-dropout forward passes
    ratio: float = Field(0.3, gt=0.0, le=1.0)  # r, fraction of samples up-weighted
    alpha: float = Field(0.2, ge=0.0, allow_inf_nan=False)  # lambda = 1 + alpha * u for the selected
    dropout: float = Field(0.5, ge=0.0, lt=1.0)  # p of the dropout inserted before the classifier
    normalize: bool = False  # batch loss / sum(lambda) instead of / B (the paper)
    cheap_path: bool = True  # run only the layers after the first dropout N times


class UAggSettings(OptionsTable):
    """``[uagg]``: UFL's aggregation rule (see :mod:`fedweigh.rules.uagg`)."""

    signal: Literal["sum", "mean"] = "sum"  # U_k (paper) or U_k / m_k
    size_aware: bool = False  # weights times n_k


class FLoodSettings(OptionsTable):
    """``[flood]``: FLood's client steps ASW and ``ood-score`` and its λ(t) (see :mod:`fedweigh.client.flood`)."""

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
    """``[dac]``: FLood's aggregation rule (see :mod:`fedweigh.rules.dac`)."""

    alpha: float = Field(0.5, ge=0.0, allow_inf_nan=False)  # p = (u + alpha v) / (1 + alpha)
    mapping: Literal["sum", "shift", "softmax"] = "sum"  # how OOD scores become shares
    temperature: float = Field(1.0, gt=0.0, allow_inf_nan=False)  # of the softmax mapping


class FedBuffSettings(OptionsTable):
    """``[fedbuff]``: FedBuff's buffered server step (see :mod:`fedweigh.strategies.fedbuff`).

    K = 10 (their published example's buffer) and the staleness weight on are Nguyen et al.'s; η_g = 1 is the
    Feddle spec's choice (§3.4), one of the Feddle paper's grid {0.01, 0.1, 1}.
    """

    buffer_size: int = Field(10, ge=0)  # K: a step when K are buffered; 0: every round on what arrived (pre-#51)
    server_lr: float = Field(1.0, gt=0.0, allow_inf_nan=False)  # η_g: w += η_g · (1/K) Σ s(τ) Δ
    staleness_scaling: bool = True  # s(τ) = 1/sqrt(1 + τ), τ the server steps since the update's model; off: 1


class FeddleSettings(OptionsTable):
    """``[feddle]``: the model atlas and the coefficient search (see :mod:`fedweigh.strategies.feddle`)."""

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


class FedAsyncSettings(OptionsTable):
    """``[fedasync]``: FedAsync's staleness-discounted mixing, one arrival at a time (τ in rounds)."""

    alpha: float = Field(0.4, gt=0.0, le=1.0)  # w ← (1 - α_τ) w + α_τ w_client
    a: float = Field(0.5, ge=0.0, allow_inf_nan=False)  # α_τ = α (τ + 1)^(-a)


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


FAULT_KINDS = (
    "exception",
    "stall",
    "nan",
    "inf",
    "wrong-shape",
    "wrong-dtype",
    "missing-tensor",
    "extra-tensor",
    "scaled",
    "signal-missing",
    "signal-nan",
    "signal-negative",
    "signal-range",
    "duplicate",
    "old-round",
)
"""What a faulty client can do (``faults.kinds``); :mod:`fedweigh.faults` says what each one is."""


class FaultSettings(OptionsTable):
    """``[faults]``: fault injection, for testing: a seeded share of each round's sampled clients misbehaves."""

    kinds: str = ""  # comma-separated FAULT_KINDS, or "all"; "": no faults
    fraction: float = Field(0.0, ge=0.0, le=1.0)  # share of each round's sampled clients that misbehave
    scale: float = Field(1e6, allow_inf_nan=False)  # the factor of the "scaled" fault

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, value: str) -> str:
        unknown = [name for name in comma_list(value) if name not in (*FAULT_KINDS, "all")]
        if unknown:
            raise ValueError(f"unknown fault {', '.join(unknown)}; accepted: all, {', '.join(FAULT_KINDS)}")
        return value

    @model_validator(mode="after")
    def _kinds_with_fraction(self) -> FaultSettings:
        if bool(comma_list(self.kinds)) != (self.fraction > 0):
            raise ValueError(
                f"faults.kinds = {self.kinds!r} with faults.fraction = {self.fraction!r} injects nothing; "
                "accepted: both set (kinds and a fraction above 0) or neither"
            )
        return self

    @property
    def kind_list(self) -> tuple[str, ...]:
        """The kinds to inject, in :data:`FAULT_KINDS` order ("all": every one)."""
        names = comma_list(self.kinds)
        return FAULT_KINDS if "all" in names else tuple(kind for kind in FAULT_KINDS if kind in names)
