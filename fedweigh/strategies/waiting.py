"""Saying whom a round still waits for, once a minute.

A round that waits long is either slow or stuck: a node that stalls, left,
or never got its instruction. Flower's grids wait silently until their
timeout (an hour by default). The grids fedweigh waits with
(:class:`~fedweigh.strategies.wakeup.PullingGrid` and
:class:`~fedweigh.strategies.deadline.DeadlineGrid`) hand each look at the
replies to a :class:`WaitReport`, which logs, every :data:`WAIT_REPORT_EVERY`
seconds of one wait, which nodes have not answered yet (with their
partitions, where the strategy's node directory knows them).

Example
-------
>>> report = WaitReport({"m1": 11, "m2": 12}, started=0.0, label=lambda node: f"node {node}")
>>> report.due(30.0)
False
>>> report.message(61.0, {"m2"})
'still waiting after 61 s for 1 of 2 replies: node 12'
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping

logger = logging.getLogger("flwr.fedweigh")

WAIT_REPORT_EVERY = 60.0
"""Seconds of one wait between two reports of the replies still missing."""


def node_label(node: int) -> str:
    """How a wait report names a node when nothing more is known of it."""
    return f"node {node}"


class WaitReport:
    """The reports of one wait for replies: every ``every`` seconds, the nodes still missing.

    Parameters
    ----------
    destinations : Mapping
        Message id to the node it was sent to, for every message waited for.
    started : float
        When the wait began (the clock the caller passes to :meth:`check`).
    label : callable
        Names a node (``node 7 (partition 3)``).
    every : float
        Seconds between two reports.
    """

    def __init__(
        self,
        destinations: Mapping[str, int],
        started: float,
        label: Callable[[int], str] = node_label,
        every: float = WAIT_REPORT_EVERY,
    ) -> None:
        self.destinations = dict(destinations)
        self.started = started
        self.label = label
        self.every = every
        self.reports = 0

    def due(self, now: float) -> bool:
        """True once the next report's time has come."""
        return now - self.started >= self.every * (self.reports + 1)

    def message(self, now: float, waiting: Collection[str]) -> str:
        """The report: how long, how many of how many, and who (by node, in the order they were sent)."""
        missing = [self.label(node) for message_id, node in self.destinations.items() if message_id in waiting]
        return (
            f"still waiting after {now - self.started:.0f} s for {len(missing)} of {len(self.destinations)} "
            f"replies: {', '.join(missing)}"
        )

    def check(self, now: float, waiting: Collection[str]) -> None:
        """Log a report when one is due and replies are still missing."""
        if waiting and self.due(now):
            self.reports = int((now - self.started) // self.every)
            logger.warning("[fedweigh] %s", self.message(now, waiting))
