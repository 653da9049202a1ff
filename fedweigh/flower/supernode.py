"""A SuperNode that asks for its next message promptly: ``fedweigh-supernode``, Flower's SuperNode without its 3 s wait.

Flower 1.41's SuperNode (``flower-supernode``) runs one loop
(``flwr.supernode.start_client_internal``): it asks the SuperLink for a
message; when there is none it sleeps **3 s** and asks again; when there is
one it stores it for its SuperExec (the ClientApp pulls it through the node's
Runtime API), waits until the ClientApp's reply is in the node's state,
looking every 0.5 s, pushes the reply and its content to the SuperLink (a
content not stored yet: another look every 0.5 s), and only then asks for the
next message. So a node holds one message at a time, and in every round it
asks once right after pushing its reply, while the ServerApp is still waiting
for other replies or aggregating and evaluating, finds nothing, and sleeps:
the next round's message waits up to 3 s, 0.5 s more for the reply's pickup
(``docs/benchmarks.md``, section 8).

``fedweigh-supernode`` is ``flower-supernode`` (same arguments, same loop,
same messages, replies pushed at the same point) with two kinds of wait
changed, for Flower :data:`~fedweigh.flower.SUPPORTED_FLOWER` only:

* **asking the SuperLink again** after finding nothing: :func:`idle_wait`, a
  back-off that starts at :data:`POLL_INTERVAL` s and grows with the time the
  node has found nothing (a tenth of it, :data:`IDLE_FRACTION`) up to
  Flower's own 3 s (:data:`FLOWER_IDLE_WAIT`). A node idle between runs asks
  as rarely as Flower's; one inside a round asks again within a tenth of the
  time it has waited. Flower's Fleet API cannot tell a SuperNode that a
  message arrived (a node can only ask), so this is a back-off, not an event;
* **waiting for the reply and its content**: both reach this process's node
  state through its own Runtime API, so the loop's waits end when something
  is stored (:class:`NodeEvents`), not at Flower's 0.5 s looks; a wait still
  looks again after :data:`LOCAL_RECHECK` s at most.

:func:`install` makes these changes in this process, explicitly; ``main``
installs them and runs Flower's ``flower-supernode``. Only when the node asks
changes, never what it sends or receives. ``--poll-interval SECONDS``, its
one argument beyond Flower's, sets the back-off's first wait: a federation of
thousands of SuperNodes may want a longer one (every node asks about
1/POLL_INTERVAL times a second right after it replied). With another Flower
version it refuses to start and says to use ``flower-supernode``;
``tests/test_flower_supernode.py`` pins what it relies on in Flower.

Like :mod:`.resident` it imports only Flower, the standard library and this
package, so the container image holds the package alone (``/app/bin/fedweigh-supernode``).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from . import objects, supported, unsupported

MAIN_LOOP_MODULE = "flwr.supernode.start_client_internal"
NODE_STATE_MODULE = "flwr.supernode.nodestate.in_memory_nodestate"
POLL_INTERVAL_FLAG = "--poll-interval"
"""fedweigh-supernode's one argument beyond flower-supernode's: the back-off's first wait (s)."""
POLL_INTERVAL = 0.05
"""Its default: a message that arrives while the node waits is picked up 0.025 s later on average, not 1.5 s."""
IDLE_FRACTION = 0.1
"""The back-off's wait as a share of the time the node has found nothing."""
FLOWER_IDLE_WAIT = 3.0
"""Flower 1.41's fixed wait after finding no message (s), the back-off's longest."""
LOCAL_RECHECK = 0.05
"""Longest wait for something to be stored in the node's state before the loop looks again (s)."""

logger = logging.getLogger("flwr.fedweigh")


def poll_interval(text: str) -> float:
    """``--poll-interval``'s value: seconds above 0 and at most Flower's 3."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= FLOWER_IDLE_WAIT:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0 and at most {FLOWER_IDLE_WAIT:g}")
    return value


def split_arguments(argv: list[str]) -> tuple[float, list[str]]:
    """fedweigh-supernode's own ``--poll-interval`` (the back-off's first wait), and the rest for Flower's CLI.

    >>> split_arguments(["--superlink", "superlink:9093", "--poll-interval", "0.2"])
    (0.2, ['--superlink', 'superlink:9093'])
    """
    parser = argparse.ArgumentParser(prog="fedweigh-supernode", add_help=False)
    parser.add_argument(POLL_INTERVAL_FLAG, type=poll_interval, default=POLL_INTERVAL)
    ours, flowers = parser.parse_known_args(argv)
    return ours.poll_interval, flowers


def idle_wait(idle_for: float, first: float = POLL_INTERVAL) -> float:
    """The wait before asking the SuperLink again, after ``idle_for`` s of finding nothing.

    >>> idle_wait(0.0), idle_wait(2.0), idle_wait(10.0), idle_wait(600.0)
    (0.05, 0.2, 1.0, 3.0)
    """
    return min(FLOWER_IDLE_WAIT, max(first, IDLE_FRACTION * idle_for))


def asking_promptly(
    pull: Callable[..., int | None],
    first: float = POLL_INTERVAL,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Callable[..., int | None]:
    """Flower's ``_pull_and_store_message``, asked again after :func:`idle_wait` until it returns a run.

    The loop's own 3 s sleep follows only a pull that returned nothing, so
    with this in its place the loop never reaches it.
    """

    @functools.wraps(pull)
    def pull_until_a_message(*args: Any, **kwargs: Any) -> int | None:
        idle_since = clock()
        while (run_id := pull(*args, **kwargs)) is None:
            sleep(idle_wait(clock() - idle_since, first))
        return run_id

    pull_until_a_message.__fedweigh_prompt__ = True  # type: ignore[attr-defined]
    return pull_until_a_message


class NodeEvents:
    """Messages and objects stored in this process's node state, and the waits they end.

    Attributes
    ----------
    stores : int
        Messages and objects stored so far.
    woken, timed_out : int
        Waits that a store ended, and waits that ran to their limit.
    waiting : threading.Event
        Set while a wait is under way (for tests).
    """

    def __init__(self, recheck: float = LOCAL_RECHECK) -> None:
        self.condition = threading.Condition()
        self.recheck = recheck
        self.stores = 0
        self.woken = 0
        self.timed_out = 0
        self.waiting = threading.Event()

    def stored(self) -> None:
        """Something was stored: end the waits."""
        with self.condition:
            self.stores += 1
            self.condition.notify_all()

    def sleep(self, seconds: float) -> bool:
        """In place of the loop's ``time.sleep(seconds)``: until the next store, at most ``seconds`` and
        :attr:`recheck` s; True when a store ended it."""
        with self.condition:
            seen = self.stores
            self.waiting.set()
            try:
                woken = self.condition.wait_for(lambda: self.stores != seen, timeout=min(seconds, self.recheck))
            finally:
                self.waiting.clear()
            if woken:
                self.woken += 1
            else:
                self.timed_out += 1
            return woken


class WakingClock:
    """The ``time`` module as Flower's SuperNode loop sees it: :meth:`NodeEvents.sleep` for ``sleep``."""

    def __init__(self, events: NodeEvents) -> None:
        self.events = events

    def sleep(self, seconds: float) -> None:
        self.events.sleep(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def _notifying(store: Callable[..., Any], events: NodeEvents) -> Callable[..., Any]:
    @functools.wraps(store)
    def store_and_notify(*args: Any, **kwargs: Any) -> Any:
        result = store(*args, **kwargs)
        events.stored()
        return result

    return store_and_notify


def install(first: float = POLL_INTERVAL) -> NodeEvents:
    """Make Flower's SuperNode loop in this process ask promptly and wait on events; returns the events.

    ``first`` is the back-off's first wait (s). Installing again changes
    nothing and returns the events of the first installation.
    """
    if not supported():
        raise RuntimeError(unsupported("fedweigh-supernode", "flower-supernode (it asks every 3 s)"))
    objects.install()  # a message's content not stored yet: asked for again after 0.05 s, not Flower's 1 s
    loop = importlib.import_module(MAIN_LOOP_MODULE)
    if isinstance(loop.time, WakingClock):
        return loop.time.events
    state_class = importlib.import_module(NODE_STATE_MODULE).InMemoryNodeState
    events = NodeEvents()
    for method in ("store_message", "store_object"):
        setattr(state_class, method, _notifying(getattr(state_class, method), events))
    loop._pull_and_store_message = asking_promptly(loop._pull_and_store_message, first)
    loop.time = WakingClock(events)
    return events


def main() -> None:
    """``fedweigh-supernode``: ``flower-supernode``'s command line (and ``--poll-interval``), asking promptly."""
    first, sys.argv[1:] = split_arguments(sys.argv[1:])
    sys.argv[0] = "fedweigh-supernode"  # Flower's CLI names itself after it (python -m in the image)
    try:
        install(first)
    except RuntimeError as err:
        print(f"fedweigh-supernode: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    from flwr.supernode.cli.flower_supernode import flower_supernode

    logger.setLevel(logging.INFO)
    logger.info(
        "[fedweigh] SuperNode asks again after %.3gs, growing to %.3gs when idle; local waits end on stores",
        first,
        FLOWER_IDLE_WAIT,
    )
    flower_supernode()


if __name__ == "__main__":  # python -m fedweigh_flower.supernode (the container image's copy imports only Flower)
    main()
