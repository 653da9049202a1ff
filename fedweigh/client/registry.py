"""Client steps by name: the code behind :data:`fedweigh.protocol.STEPS`.

A plain table. The protocol names each step, the signals it produces and its
options table; this table binds the name to the class that runs it.

Example
-------
>>> from fedweigh.protocol import STEPS
>>> sorted(STEP_CLASSES) == sorted(STEPS)
True
>>> [type(step).__name__ for step in build_steps(["oui", "ufl"])]
['OUIProbe', 'UFLStep']
"""

from __future__ import annotations

from fedweigh.client.flood import ASWStep, OODScoreStep
from fedweigh.client.oui import OUIProbe
from fedweigh.client.steps import ClientStep
from fedweigh.client.ufl import UFLDropoutStep, UFLStep

STEP_CLASSES: dict[str, type[ClientStep]] = {
    step.name: step for step in (OUIProbe, UFLStep, UFLDropoutStep, ASWStep, OODScoreStep)
}
"""Every client step's class, by name."""


def build_steps(names: list[str]) -> list[ClientStep]:
    """Instantiate the steps an instruction names; an unknown name is an error naming the known ones."""
    unknown = [name for name in names if name not in STEP_CLASSES]
    if unknown:
        raise ValueError(f"unknown client step(s) {unknown}; known: {sorted(STEP_CLASSES)}")
    return [STEP_CLASSES[name]() for name in names]
