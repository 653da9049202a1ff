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
from fedweigh.methods.catalog import STEPS, by_name, gather

STEP_CLASSES: dict[str, type[ClientStep]] = gather("client", "STEP_CLASSES", by_name)
"""Every client step's class, by name."""

_unbound = sorted(set(STEPS) ^ set(STEP_CLASSES))
if _unbound:  # a protocol names a step that no client.py gives code for, or the reverse
    raise ValueError(f"client steps without both a protocol.py entry and a class in a client.py: {_unbound}")


def build_steps(names: list[str]) -> list[ClientStep]:
    """Instantiate the steps an instruction names; an unknown name is an error naming the known ones."""
    unknown = [name for name in names if name not in STEP_CLASSES]
    if unknown:
        raise ValueError(f"unknown client step(s) {unknown}; known: {sorted(STEP_CLASSES)}")
    return [STEP_CLASSES[name]() for name in names]
