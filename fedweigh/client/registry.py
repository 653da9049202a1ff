"""Client steps by name: the code behind :data:`fedweigh.methods.catalog.STEPS`, gathered from the methods.

Each method package's ``client.py`` lists its step classes in
``STEP_CLASSES``; this table binds every step name to its class. It reads
only the packages' client modules, so that a ClientApp imports no server code.

Example
-------
>>> from fedweigh.methods.catalog import STEPS
>>> sorted(STEP_CLASSES) == sorted(STEPS)
True
>>> [type(step).__name__ for step in build_steps(["oui", "ufl"])]
['OUIProbe', 'UFLStep']
"""

from __future__ import annotations

from fedweigh.client.steps import ClientStep
from fedweigh.methods.catalog import STEPS, DeclarationError, by_name, gather, where

STEP_CLASSES: dict[str, type[ClientStep]] = gather("client", "STEP_CLASSES", by_name, "client step class")
"""Every client step's class, by name."""

_unbound = [
    f"{name!r} ({where('client step', name)}/protocol.py has no class for it in a client.py)"
    for name in STEPS
    if name not in STEP_CLASSES
] + [
    f"{name!r} ({where('client step class', name)}/client.py: no protocol.py declares it; a class without its own "
    "name attribute is called 'step')"
    for name in STEP_CLASSES
    if name not in STEPS
]
if _unbound:
    raise DeclarationError(f"client steps without both a protocol.py entry and a class: {', '.join(_unbound)}")


def build_steps(names: list[str]) -> list[ClientStep]:
    """Instantiate the steps an instruction names; an unknown name is an error naming the known ones."""
    unknown = [name for name in names if name not in STEP_CLASSES]
    if unknown:
        raise ValueError(f"unknown client step(s) {unknown}; known: {sorted(STEP_CLASSES)}")
    return [STEP_CLASSES[name]() for name in names]
