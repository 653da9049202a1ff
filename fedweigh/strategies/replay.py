"""The ``duplicate`` fault: a grid that delivers some replies twice.

A ClientApp cannot reply twice (Flower takes one reply per instruction), so a
duplicate can only come from the transport. :class:`ReplayGrid` wraps the
run's grid in a fault-injection run (:mod:`fedweigh.faults`) and delivers
every reply to an instruction marked ``fault = "duplicate"`` twice, so the
strategy's reply checks can be seen counting it once
(:func:`fedweigh.strategies.replies.valid_replies`).
"""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid

from fedweigh.protocol import CONFIG, FAULT
from fedweigh.strategies.grid_wrapper import GridWrapper

DUPLICATE = "duplicate"


class ReplayGrid(GridWrapper):
    """``grid``, except that replies to instructions marked ``duplicate`` arrive twice."""

    def __init__(self, grid: Grid) -> None:
        super().__init__(grid)
        self.marked: set[str] = set()  # ids of instructions whose reply is delivered twice

    def _mark(self, messages: list[Message]) -> None:
        for message in messages:
            content = message.content if not message.has_error() else None
            if content is not None and CONFIG in content and content[CONFIG].get(FAULT) == DUPLICATE:
                self.marked.add(message.metadata.message_id)

    def _replay(self, replies: Iterable[Message]) -> list[Message]:
        delivered = []
        for reply in replies:
            delivered.append(reply)
            if reply.metadata.reply_to_message_id in self.marked:
                self.marked.discard(reply.metadata.reply_to_message_id)
                delivered.append(reply)
        return delivered

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        pushed = list(self.grid.push_messages(messages))
        self._mark(messages)
        return pushed

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self._replay(self.grid.pull_messages(message_ids))

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        self._mark(messages)
        return self._replay(replies)
