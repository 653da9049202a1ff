"""What server and client both know of the methods, gathered from their packages: options, signals, steps.

Each method package may hold a ``protocol`` module declaring, at module level,

* ``OPTIONS``: its run-config tables by name (``{"fedoui": FedOUISettings}``),
  each an :class:`~fedweigh.options.OptionsTable` of options with their
  defaults, which :class:`~fedweigh.settings.Settings` takes as its fields;
* ``SIGNALS``: the :class:`~fedweigh.protocol.Signal` s its clients report;
* ``STEPS``: its client steps (:class:`~fedweigh.protocol.StepSpec`: name,
  signals produced, options table).

This module finds every package under ``fedweigh/methods/`` and gathers
them into the tables below; a name declared twice is an error naming both
packages. It is at the bottom of the package (it imports only the
protocol modules, which import only :mod:`fedweigh.options` and
:mod:`fedweigh.protocol`): the settings, the client and the server all read it.
The code behind the names (rules, steps, server updates, strategies) is
gathered one layer up, by :mod:`fedweigh.methods.registry`.

Example
-------
>>> SIGNALS["oui"].producer, STEPS["ufl"].produces
('oui', ('uncertainty', 'uncertainty-mean'))
>>> OPTION_TABLES["fedoui"]().window
1
>>> producers(["train_loss", "oui", "uncertainty", "uncertainty-mean"])
['oui', 'ufl']
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import fedweigh.methods
from fedweigh.options import OptionsTable
from fedweigh.protocol import TRAIN_LOSS_SIGNAL, Signal, StepSpec


def method_packages() -> tuple[str, ...]:
    """Every method package's name (``fedoui``, ``ufl``, ...), sorted: each folder of ``fedweigh/methods/``.

    A folder needs no ``__init__.py`` (Python imports it as a namespace package).
    """
    folders = {path.name for root in fedweigh.methods.__path__ for path in Path(root).iterdir() if path.is_dir()}
    return tuple(sorted(name for name in folders if name.isidentifier() and not name.startswith("_")))


def package_modules(part: str) -> list[tuple[str, ModuleType]]:
    """``(package, module)`` for every method package that has the module ``part`` (``protocol``, ``server``)."""
    found = []
    for package in method_packages():
        name = f"fedweigh.methods.{package}.{part}"
        if importlib.util.find_spec(name) is not None:
            found.append((package, importlib.import_module(name)))
    return found


def gather(part: str, attribute: str, entries: Any, key: Any = None) -> dict[str, Any]:
    """One table from every package's ``part.attribute``; a name declared twice raises ``ValueError``.

    ``entries(value)`` lists a declaration's ``(name, entry)`` pairs (a
    mapping's items, or a sequence's entries keyed by their ``name``).
    """
    table: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for package, module in package_modules(part):
        for name, entry in entries(getattr(module, attribute, ())):
            if name in table:
                raise ValueError(
                    f"{attribute} {name!r} is declared by both fedweigh/methods/{origin[name]} and "
                    f"fedweigh/methods/{package}; accepted: one declaration per name"
                )
            table[name], origin[name] = entry, package
    return table


def by_name(values: Iterable[Any]) -> list[tuple[str, Any]]:
    """A sequence of declarations keyed by their ``name``."""
    return [(value.name, value) for value in values]


def items(values: Any) -> list[tuple[str, Any]]:
    """A mapping's items."""
    return list(dict(values).items())


OPTION_TABLES: dict[str, type[OptionsTable]] = gather("protocol", "OPTIONS", items)
"""Every method's options table, by its run-config name (``fedoui``, ``fedma-simplified``)."""

SIGNALS: dict[str, Signal] = {TRAIN_LOSS_SIGNAL.name: TRAIN_LOSS_SIGNAL, **gather("protocol", "SIGNALS", by_name)}
"""Every client signal, by name (``train_loss`` is every reply's; the others are the methods')."""

STEPS: dict[str, StepSpec] = gather("protocol", "STEPS", by_name)
"""Every client step, by name; :data:`fedweigh.methods.registry.STEP_CLASSES` holds their code."""


def producers(signals: tuple[str, ...] | list[str]) -> list[str]:
    """The client steps that produce ``signals``, in order, without repeats.

    >>> producers(["ood-score", "train_loss"])
    ['ood-score']
    """
    steps: list[str] = []
    for name in signals:
        producer = SIGNALS[name].producer
        if producer is not None and producer not in steps:
            steps.append(producer)
    return steps
