"""A grid around the run's grid: every call passes through unless a subclass changes it.

:class:`~fedweigh.strategies.deadline.DeadlineGrid` (rounds that close at a
deadline) and :class:`~fedweigh.strategies.replay.ReplayGrid` (the
``duplicate`` fault) each change one or two calls of Flower's ``Grid``; the
rest is this delegation, written once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.run import Run

from fedweigh.strategies.waiting import node_label


class GridWrapper(Grid):
    """Delegates every ``Grid`` call to ``grid``.

    ``node_label`` names a node in what the grid logs (a wait that goes on:
    :mod:`fedweigh.strategies.waiting`); :meth:`set_node_label` sets it here
    and on every wrapper below.
    """

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.node_label: Callable[[int], str] = node_label

    def set_node_label(self, label: Callable[[int], str]) -> None:
        """Name nodes with ``label`` (the strategy's node directory knows their partitions)."""
        self.node_label = label
        if isinstance(self.grid, GridWrapper):
            self.grid.set_node_label(label)

    @property
    def run(self) -> Run:
        return self.grid.run

    def set_run(self, run: Run) -> None:
        self.grid.set_run(run)

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.grid.send_and_receive(messages, timeout=timeout)
