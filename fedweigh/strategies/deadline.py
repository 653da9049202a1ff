"""Real asynchrony: a training round closes at its deadline; late replies join a later round.

Flower's ``Grid.send_and_receive`` waits until every reply is in (or its
timeout passes, after which the missing replies are lost). With slow clients
that makes every round as slow as its slowest client. :class:`DeadlineGrid`
wraps the run's grid and uses its non-blocking ``push_messages`` and
``pull_messages`` instead:

* a training round's instructions are pushed with a time-to-live of
  ``round-deadline × (max-staleness + 2)`` seconds, and at least
  ``round-timeout`` (the longest the server waits for a round), so that an
  instruction nobody answers, or its reply, is dropped by the SuperLink
  rather than kept, but one that waits for its ClientApp to start (Ray
  starting its workers, a ClientApp process importing PyTorch) is not;
* the round pulls replies until all its own are in, or the deadline has
  passed and at least ``min-round-replies`` replies (late ones included) are
  in, or the strategy's timeout has passed;
* instructions of earlier rounds stay *in flight*: they are pulled in every
  later training round and their replies join that round, where the strategy
  applies them as stale updates (each reply says which round's model it
  trained); the strategy does not sample a node while it is in flight;
* an instruction older than ``max-staleness`` rounds is given up (logged);
  its node is free again.

Other messages (the partition queries, evaluation) pass through unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from flwr.app import Message, MessageType
from flwr.serverapp import Grid

from fedweigh.strategies.grid_wrapper import GridWrapper
from fedweigh.strategies.waiting import WaitReport

logger = logging.getLogger("flwr.fedweigh")


@dataclass(frozen=True)
class Deadline:
    """When a training round closes.

    Attributes
    ----------
    seconds : float
        The round's deadline, from pushing its instructions.
    min_replies : int
        Replies (of any round) needed before the round may close at the deadline.
    max_staleness : int
        Rounds an instruction stays in flight before it is given up.
    poll : float
        Seconds between two pulls.
    timeout : float
        The longest the server waits for a round's replies (``round-timeout``).
    """

    seconds: float
    min_replies: int = 1
    max_staleness: int = 0
    poll: float = 0.2
    timeout: float = 0.0

    @property
    def ttl(self) -> float:
        """Time-to-live of a training instruction: as long as a reply to it may still be used, plus a round,
        and never shorter than the server's own wait (a deadline of seconds must not expire instructions that
        wait for their ClientApp to start: Ray's workers took longer than 10 s on 2 cores)."""
        return max(self.seconds * (self.max_staleness + 2), self.timeout)


@dataclass
class InFlight:
    """An instruction without a reply yet."""

    node: int
    round: int


class DeadlineGrid(GridWrapper):
    """A :class:`~flwr.serverapp.Grid` whose training rounds close at a deadline (see the module docstring)."""

    def __init__(
        self,
        grid: Grid,
        deadline: Deadline,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(grid)
        self.deadline = deadline
        self.clock, self.sleep = clock, sleep
        self.in_flight: dict[str, InFlight] = {}  # message id -> who and when
        self.round = 0
        self.given_up = 0

    # -- what the strategy asks ------------------------------------------------

    def busy_nodes(self) -> set[int]:
        """Nodes still working on an earlier instruction."""
        return {entry.node for entry in self.in_flight.values()}

    def origins(self) -> dict[str, int]:
        """Message id to node, for every instruction in flight."""
        return {message_id: entry.node for message_id, entry in self.in_flight.items()}

    # -- Grid (the rest passes through, GridWrapper) ---------------------------------

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        if not messages or any(m.metadata.message_type != MessageType.TRAIN for m in messages):
            return self.grid.send_and_receive(messages, timeout=timeout)
        self.round += 1
        self._give_up_old()
        for message in messages:
            message.metadata.ttl = self.deadline.ttl
        pushed = list(self.grid.push_messages(messages))
        own = set()
        for message_id, message in zip(pushed, messages, strict=True):
            if message_id:
                self.in_flight[message_id] = InFlight(message.metadata.dst_node_id, self.round)
                own.add(message_id)
        started = self.clock()
        report = WaitReport({mid: self.in_flight[mid].node for mid in pushed if mid in own}, started, self.node_label)
        replies: list[Message] = []
        while True:
            for reply in self.grid.pull_messages(list(self.in_flight)):
                self.in_flight.pop(reply.metadata.reply_to_message_id, None)
                replies.append(reply)
            waiting = own & self.in_flight.keys()
            elapsed = self.clock() - started
            if not waiting:
                break
            report.check(started + elapsed, waiting)
            if elapsed >= self.deadline.seconds and len(replies) >= min(self.deadline.min_replies, len(own)):
                logger.info(
                    "round closed at its %.1fs deadline with %d replies; %d node(s) still training",
                    self.deadline.seconds,
                    len(replies),
                    len(waiting),
                )
                break
            if timeout is not None and elapsed >= timeout:
                break
            self.sleep(self.deadline.poll)
        return replies

    def _give_up_old(self) -> None:
        oldest = self.round - self.deadline.max_staleness
        for message_id, entry in list(self.in_flight.items()):
            if entry.round < oldest:
                del self.in_flight[message_id]
                self.given_up += 1
                logger.warning(
                    "node %d sent no reply to the instruction of round %d within max-staleness = %d rounds; given up",
                    entry.node,
                    entry.round,
                    self.deadline.max_staleness,
                )
