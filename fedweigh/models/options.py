"""Checks of model options (``model-width``, ``model-hidden``, ``model-dropout``), shared by the models.

Each model validates its own options with these, so that a bad value names the
model, the option and what is accepted.

>>> width("resnet8", 16)
16
>>> width("resnet8", 0)
Traceback (most recent call last):
...
ValueError: resnet8 option 'width' must be a positive int, got 0
"""

from __future__ import annotations

from collections.abc import Sequence


def width(model: str, value: object) -> int:
    """A positive int channel count."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{model} option 'width' must be a positive int, got {value!r}")
    return value


def hidden_sizes(model: str, value: object) -> tuple[int, ...]:
    """One positive int, or a non-empty sequence of them."""
    sizes = (value,) if isinstance(value, int) and not isinstance(value, bool) else value
    if (
        not isinstance(sizes, Sequence)
        or isinstance(sizes, str)
        or not sizes
        or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes)
    ):
        raise ValueError(f"{model} option 'hidden' must be a positive int or a list of them, got {value!r}")
    return tuple(sizes)


def dropout(model: str, value: object) -> float:
    """A probability in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{model} option 'dropout' must be a number in [0, 1), got {value!r}")
    return float(value)


def positive_int(model: str, option: str, value: object) -> int:
    """A positive int, for an option named ``option``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{model} option {option!r} must be a positive int, got {value!r}")
    return value
