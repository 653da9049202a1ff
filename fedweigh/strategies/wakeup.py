"""Grids that pick replies up soon after they arrive, not at Flower 1.41's fixed intervals.

Flower 1.41's grids wait between looks for replies: 0.1 s in a simulation
(``InMemoryGrid.pull_interval``), 3 s in a deployment (``HttpGrid``, fixed).
A round's replies therefore wait for the next look: in a deployment up to
3 s per round (``docs/benchmarks.md``, section 8). Both grids here are
Flower's own ``push_messages`` and ``pull_messages`` with a shorter wait in
between; what arrives, and in which order it is returned, is unchanged.

:class:`WakeupGrid` (a simulation, see :mod:`fedweigh.flower.engine`)
    waits for the next stored reply.
:class:`PromptGrid` (a deployment)
    looks again every :data:`DEPLOYMENT_PULL_INTERVAL` s (one HTTP request to
    the SuperLink per look).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable

from flwr.app import Message
from flwr.serverapp import Grid

from fedweigh.flower.engine import ENGINE_MODULE, HUB, applies_to, describe
from fedweigh.strategies.grid_wrapper import GridWrapper
from fedweigh.strategies.waiting import WaitReport

logger = logging.getLogger("flwr.fedweigh")

DEPLOYMENT_PULL_INTERVAL = 0.1
"""Seconds between two looks for replies in a deployment (Flower 1.41's ``HttpGrid``: 3 s)."""


class PullingGrid(GridWrapper):
    """``send_and_receive`` as Flower's grids do it (push, then pull until all replies or the timeout),
    with the wait between two pulls left to :meth:`wait`."""

    clock: Callable[[], float] = staticmethod(time.monotonic)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        pushed = list(self.grid.push_messages(messages))
        waiting = set(pushed)
        started = self.clock()
        end = None if timeout is None else started + timeout
        destinations = {mid: m.metadata.dst_node_id for mid, m in zip(pushed, messages, strict=False) if mid}
        report = WaitReport(destinations, started, self.node_label)
        replies: list[Message] = []
        while waiting:
            mark = self.mark()
            arrived = list(self.grid.pull_messages(waiting))
            replies += arrived
            waiting -= {reply.metadata.reply_to_message_id for reply in arrived}
            now = self.clock()
            left = None if end is None else end - now
            if not waiting or (left is not None and left <= 0):
                break
            report.check(now, waiting)
            self.wait(mark, left)
        return replies

    def mark(self) -> int:
        """What :meth:`wait` compares against to tell that something arrived since the pull."""
        return 0

    def wait(self, mark: int, left: float | None) -> None:
        """Wait before the next pull (at most ``left`` s, the time left until the timeout, if any)."""
        raise NotImplementedError


class WakeupGrid(PullingGrid):
    """A simulation's grid: waits for the next stored reply instead of sleeping ``pull_interval``.

    The wrapped grid's ``pull_interval`` stays the longest wait between two
    looks, so a reply the hub did not announce is still found.
    """

    def __init__(self, grid: Grid) -> None:
        super().__init__(grid)
        self.pull_interval: float = getattr(grid, "pull_interval", 0.1)
        self.reported = False

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        replies = super().send_and_receive(messages, timeout=timeout)
        if replies and not self.reported:  # the engine answered, so its loop runs: say which one
            logger.info("[fedweigh] %s", describe(self.grid))
            self.reported = True
        return replies

    def mark(self) -> int:
        return HUB.replies

    def wait(self, mark: int, left: float | None) -> None:
        HUB.wait_for_reply(mark, self.pull_interval if left is None else min(self.pull_interval, left))


class PromptGrid(PullingGrid):
    """A deployment's grid: looks for replies every ``interval`` s, where Flower 1.41's ``HttpGrid`` sleeps 3 s."""

    def __init__(self, grid: Grid, interval: float = DEPLOYMENT_PULL_INTERVAL) -> None:
        super().__init__(grid)
        self.interval = interval

    def wait(self, mark: int, left: float | None) -> None:
        time.sleep(self.interval if left is None else min(self.interval, left))


def wakeup_grid(grid: Grid, enabled: bool = True) -> Grid:
    """The run's grid as the ServerApp uses it.

    A prepared simulation's grid becomes a :class:`WakeupGrid` (with
    ``enabled``; ``enabled = False``, ``event-driven-simulation = false``,
    also returns the engine's extractor to Flower's 0.1 s polling); a
    deployment's (Flower's ``HttpGrid``) a :class:`PromptGrid`; any other
    grid (tests' in-process grids) is returned as it is.
    """
    from flwr.superlink.grid import HttpGrid

    HUB.enabled = enabled
    if isinstance(grid, HttpGrid):
        logger.info("[fedweigh] deployment: replies looked for every %.1fs", DEPLOYMENT_PULL_INTERVAL)
        return PromptGrid(grid)
    if not applies_to(grid):
        if ENGINE_MODULE in sys.modules:  # a simulation the hand-off does not apply to (another Flower version)
            logger.info("[fedweigh] %s", describe(grid))
        return grid
    if not enabled:
        logger.info("[fedweigh] simulation hand-off: Flower's 0.1 s polling (event-driven-simulation = false)")
        return grid
    return WakeupGrid(grid)
