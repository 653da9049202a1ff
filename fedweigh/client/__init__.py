"""The client halves of the methods: for your own ClientApp, and for fedweigh's.

For your ClientApp (with your model, data and training loop; the strategies
are :mod:`fedweigh.strategies`):

* :class:`Instruction`: what a train message asks for (client steps, options, FLood's λ);
* each method's functions, by name: :func:`oui_signal` and :func:`oui_mod` (FedOUI),
  :func:`ufl_weights` and :func:`mc_uncertainty` (UFL), :func:`asw_sample_weights`,
  :func:`energy_scores`, :func:`ood_score_signal` and :func:`ood_score_mod` (FLood); they live in
  their packages (``fedweigh/methods/<method>/client.py``, listed in its ``__all__``) and are looked
  up when first used, so that importing this package imports no method;
* :func:`weighted_loss` (:mod:`~fedweigh.client.signals`) and :func:`train_reply`: the reply the
  strategy reads (FedNolowe's signal is its ``train_loss``); :func:`signal_mod`, any after-training
  signal as a Flower mod.

Inside (fedweigh's own ClientApp, :mod:`fedweigh.client_app`):

* :mod:`~fedweigh.client.training`: local training and evaluation (per-sample loss weights, SGD or Adam);
* :mod:`~fedweigh.client.steps`: the step protocol; the steps are the methods' (``client.py``),
  by name in :data:`fedweigh.client.registry.STEP_CLASSES`.

>>> from fedweigh.client import oui_signal
>>> oui_signal.__module__
'fedweigh.methods.fedoui.client'
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

from fedweigh.client.instruction import Instruction, train_reply
from fedweigh.client.mods import signal_mod
from fedweigh.client.signals import weighted_loss


@functools.cache
def _offered() -> dict[str, Any]:
    """Every name a method's ``client.py`` lists in ``__all__``; one listed by two packages is refused."""
    from fedweigh.methods.catalog import DeclarationError, package_modules

    offered: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for package, module in package_modules("client"):
        for name in getattr(module, "__all__", ()):
            if name in offered:
                raise DeclarationError(
                    f"fedweigh.client.{name} is offered by both fedweigh/methods/{origin[name]}/client.py and "
                    f"fedweigh/methods/{package}/client.py; accepted: one per name"
                )
            offered[name], origin[name] = getattr(module, name), package
    return offered


def __getattr__(name: str) -> Any:
    """``fedweigh.client.oui_signal``: a method's client function, from its package.

    A name that is a submodule of this package, or a dunder, is left to Python's import.
    """
    if name.startswith("__") or importlib.util.find_spec(f"{__name__}.{name}") is not None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    offered = _offered()
    if name not in offered:
        raise AttributeError(f"module 'fedweigh.client' has no attribute {name!r}; offered: {sorted(offered)}")
    return offered[name]


def __dir__() -> list[str]:
    return sorted([*globals(), *_offered()])


__all__ = ["Instruction", "signal_mod", "train_reply", "weighted_loss"]
