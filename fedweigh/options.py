"""Tables of options: their base (every method's tables live in its package's ``protocol.py``), and ``[faults]``.

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
>>> FaultSettings().fraction, FaultSettings(kinds="nan", fraction=0.2).kind_list
(0.0, ('nan',))
>>> comma_list("ufl, oui")
['ufl', 'oui']
"""

from __future__ import annotations

from typing import Any

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
