"""A simulation's grid that picks replies up when they are stored, not every 0.1 s (see :mod:`fedweigh.engine`)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid

from fedweigh.engine import ENGINE_MODULE, HUB, applies_to, describe
from fedweigh.strategies.grid_wrapper import GridWrapper

logger = logging.getLogger("flwr.fedweigh")


class WakeupGrid(GridWrapper):
    """``send_and_receive`` waiting for the next stored reply instead of sleeping ``pull_interval``.

    The wrapped grid's ``pull_interval`` stays the longest wait between two
    looks, so a reply the hub did not announce is still found.
    """

    def __init__(self, grid: Grid) -> None:
        super().__init__(grid)
        self.pull_interval: float = getattr(grid, "pull_interval", 0.1)
        self.reported = False

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        waiting = set(self.grid.push_messages(messages))
        end = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while waiting:
            seen = HUB.replies
            arrived = list(self.grid.pull_messages(waiting))
            replies += arrived
            waiting -= {reply.metadata.reply_to_message_id for reply in arrived}
            left = None if end is None else end - time.monotonic()
            if not waiting or (left is not None and left <= 0):
                break
            HUB.wait_for_reply(seen, self.pull_interval if left is None else min(self.pull_interval, left))
        if replies and not self.reported:  # the engine answered, so its loop runs: say which one
            logger.info("[fedweigh] %s", describe(self.grid))
            self.reported = True
        return replies


def wakeup_grid(grid: Grid, enabled: bool = True) -> Grid:
    """``grid`` as a :class:`WakeupGrid` in a prepared simulation (and ``enabled``), else ``grid`` itself.

    ``enabled = False`` (``event-driven-simulation = false``) also returns
    the engine's extractor to Flower's 0.1 s polling.
    """
    HUB.enabled = enabled
    if not applies_to(grid):
        if ENGINE_MODULE in sys.modules:  # a simulation the hand-off does not apply to (another Flower version)
            logger.info("[fedweigh] %s", describe(grid))
        return grid
    if not enabled:
        logger.info("[fedweigh] simulation hand-off: Flower's 0.1 s polling (event-driven-simulation = false)")
        return grid
    return WakeupGrid(grid)
