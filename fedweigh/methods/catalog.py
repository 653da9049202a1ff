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


ORIGINS: dict[tuple[str, str], str] = {}
"""``(kind, name)`` to the package that declared it (``("option table", "fedoui")`` -> ``"fedoui"``)."""


class DeclarationError(ValueError):
    """Method packages that declare what cannot be gathered (a name twice, a step without its table, ...)."""


def gather(part: str, attribute: str, entries: Any, kind: str) -> dict[str, Any]:
    """One table from every package's ``part.attribute``; a ``kind`` of name declared twice is refused.

    ``entries(value)`` lists a declaration's ``(name, entry)`` pairs (a
    mapping's items, or a sequence's entries keyed by their ``name``); a
    module without ``attribute`` declares none. :data:`ORIGINS` records
    which package declared each name.

    Raises
    ------
    DeclarationError
        Naming the kind, the name and both packages.
    """
    table: dict[str, Any] = {}
    for package, module in package_modules(part):
        value = getattr(module, attribute, None)
        if value is None:
            continue
        for name, entry in entries(value):
            if name in table:
                raise DeclarationError(
                    f"the {kind} {name!r} is declared by both fedweigh/methods/{ORIGINS[kind, name]}/{part}.py and "
                    f"fedweigh/methods/{package}/{part}.py; accepted: one declaration per name"
                )
            table[name], ORIGINS[kind, name] = entry, package
    return table


def where(kind: str, name: str) -> str:
    """``fedweigh/methods/<package>``, the package that declared ``name`` (for messages)."""
    return f"fedweigh/methods/{ORIGINS.get((kind, name), '?')}"


def by_name(values: Iterable[Any]) -> list[tuple[str, Any]]:
    """A sequence of declarations keyed by their ``name``."""
    return [(value.name, value) for value in values]


def items(values: Any) -> list[tuple[str, Any]]:
    """A mapping's items."""
    return list(dict(values).items())


OPTION_TABLES: dict[str, type[OptionsTable]] = gather("protocol", "OPTIONS", items, "option table")
"""Every method's options table, by its run-config name (``fedoui``, ``fedma-simplified``)."""

SIGNALS: dict[str, Signal] = {
    TRAIN_LOSS_SIGNAL.name: TRAIN_LOSS_SIGNAL,
    **gather("protocol", "SIGNALS", by_name, "signal"),
}
"""Every client signal, by name (``train_loss`` is every reply's; the others are the methods')."""

STEPS: dict[str, StepSpec] = gather("protocol", "STEPS", by_name, "client step")
"""Every client step, by name; :data:`fedweigh.client.registry.STEP_CLASSES` holds their code."""


def _consistency_problems() -> list[str]:
    """What the protocols declare that does not fit together: each names the package to fix."""
    problems = []
    python_names: dict[str, str] = {}
    for table in OPTION_TABLES:
        other = python_names.setdefault(table.replace("-", "_"), table)
        if other != table:
            problems.append(f"option tables {other!r} and {table!r} ({where('option table', table)}) are one setting")
    for signal in SIGNALS.values():
        if signal.producer is not None and signal.name not in getattr(STEPS.get(signal.producer), "produces", ()):
            problems.append(
                f"signal {signal.name!r} ({where('signal', signal.name)}) names the producer {signal.producer!r}, "
                "which is no client step producing it; accepted: a step of STEPS listing it in produces"
            )
    for step in STEPS.values():
        unknown = [name for name in step.produces if name not in SIGNALS]
        if unknown:
            problems.append(
                f"client step {step.name!r} ({where('client step', step.name)}) produces {unknown}, no signal"
            )
        if step.options is not None and step.options not in OPTION_TABLES:
            problems.append(
                f"client step {step.name!r} ({where('client step', step.name)}) reads the options table "
                f"{step.options!r}, which no protocol.py declares"
            )
    return problems


def refuse(problems: list[str]) -> None:
    """Raise one :class:`DeclarationError` listing every problem (none: return)."""
    if problems:
        raise DeclarationError("method packages that do not fit together:\n" + "\n".join(f"  - {p}" for p in problems))


refuse(_consistency_problems())


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
