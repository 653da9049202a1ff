"""Event-driven message hand-off in Flower 1.41's simulation engine: the one place fedweigh changes Flower.

In a simulation, the ServerApp and the engine share one in-memory link state,
and two loops of Flower 1.41 poll it: the engine's extractor
(``vce_api.add_messages_to_queue``) looks at every node for a new instruction,
then waits 0.1 s; the grid's ``send_and_receive`` looks for replies, then
sleeps its ``pull_interval``, 0.1 s. A message waits about 0.05 s at each of
the two hand-offs on average, and a round can never be shorter than 0.1 s:
on a GPU, where a round's work takes tens of milliseconds, most of the run
(``docs/benchmarks.md``).

:func:`prepare` (run when the app is imported into a simulation process,
before the engine starts: :func:`prepare_if_simulating` at the top of
``fedweigh/server_app.py`` and ``fedweigh/client_app.py``) changes these things,
for Flower :data:`SUPPORTED_FLOWER` only:

* the in-memory link state's ``store_message_ins`` and ``store_message_res``
  notify :data:`HUB` after storing a message;
* the engine's extractor is :func:`event_driven_extractor`: it hands on
  every waiting instruction, sweeps again at once while it finds any, and
  otherwise waits for the next stored instruction (at most
  :data:`MAX_IDLE_WAIT` s, which bounds the delay at shutdown); it looks
  only at the nodes that have an instruction waiting, where Flower's loop
  asks every node, ten times a second;
* :class:`fedweigh.strategies.wakeup.WakeupGrid` waits for the next stored
  reply instead of sleeping;
* the engine's ``run_api`` first publishes every virtual node's node config
  (:data:`NODES`), so that the ServerApp, a thread of the same process,
  knows each node's partition without asking it with a message
  (:func:`simulated_partitions`): that query cost 0.03-0.05 s per node at
  start-up (10,000 clients: 450 s);
* the engine's queues (``vce_api.Queue``) are :class:`StoppingQueue`: when
  the engine's stop event is set (the ServerApp returned), a worker or the
  reply injector waiting on one returns at once instead of at the end of
  Flower's 1 s ``get`` timeout, and the extractor's idle wait ends too, so
  the run ends up to 1 s sooner;
* with ``simulation-backend = "in-process"`` in the run config, ``run_api``
  builds :func:`in_process_backend` instead of Flower's Ray backend (Flower
  1.41 builds Ray's whatever backend its federation config names): the
  ClientApp runs in the simulation's own process, one message at a time,
  and the model reaches it as the object the ServerApp stored, not as a
  copy carried through Ray's object store and back (about 11 ms a 2 MB
  message on 2 CPU cores).

Only when and where a message is handled changes, never what: results are
the same. ``event-driven-simulation = false`` (``Hub.enabled``) brings
Flower's polling back for comparison. A deployment is never touched: its SuperLink and
SuperNodes run in their own processes, with their own state. Other Flower
versions keep their own behaviour (a log line says so), and
``tests/test_flower_engine.py`` fails on an upgrade until this module is checked
against it.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from queue import Empty, Queue
from typing import Any

from fedweigh.settings import IN_PROCESS_BACKEND, RAY_BACKEND, SettingsError, validate

from . import SUPPORTED_FLOWER, supported

MAX_IDLE_WAIT = 0.5
"""Longest wait of the extractor for an instruction before it looks again (s)."""
FLOWER_POLL = 0.1
"""Flower 1.41's polling interval, kept when the hand-off is switched off (s)."""
ENGINE_MODULE = "flwr.server.superlink.fleet.vce.vce_api"

logger = logging.getLogger("flwr.fedweigh")


class Hub:
    """What the hand-offs wait on, and counts of what ended the waits (for tests and benchmarks).

    Attributes
    ----------
    instructions, replies : int
        Messages stored so far, of each kind.
    woken_by_instruction, woken_by_reply : int
        Waits that a stored message ended (not their time limit).
    enabled : bool
        False brings back Flower's 0.1 s polling (``event-driven-simulation``).
    extractor_running, extractor_waiting : threading.Event
        Whether :func:`event_driven_extractor` is the engine's loop, and
        whether it is waiting for an instruction now.
    """

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.instructions = 0
        self.replies = 0
        self.woken_by_instruction = 0
        self.woken_by_reply = 0
        self.enabled = True
        self.max_idle_wait = MAX_IDLE_WAIT
        self.extractor_running = threading.Event()
        self.extractor_waiting = threading.Event()

    def stored(self, instruction: bool) -> None:
        """A message was stored: wake whoever waits for one."""
        with self.condition:
            if instruction:
                self.instructions += 1
            else:
                self.replies += 1
            self.condition.notify_all()

    def wait_for_instruction(self, seen: int, stop: threading.Event) -> None:
        """Until an instruction is stored after the count ``seen``, ``stop`` is set, or the idle limit."""
        with self.condition:
            self.extractor_waiting.set()
            try:
                if (
                    self.condition.wait_for(
                        lambda: self.instructions != seen or stop.is_set(), timeout=self.max_idle_wait
                    )
                    and not stop.is_set()
                ):
                    self.woken_by_instruction += 1
            finally:
                self.extractor_waiting.clear()

    def wait_for_reply(self, seen: int, timeout: float) -> None:
        """Until a reply is stored after the count ``seen``, or ``timeout`` seconds."""
        with self.condition:
            if timeout > 0 and self.condition.wait_for(lambda: self.replies != seen, timeout=timeout):
                self.woken_by_reply += 1


HUB = Hub()
"""The process's hub (a simulation process holds one link state)."""


def waiting_nodes(state: Any) -> set[int]:
    """The nodes with an instruction not handed on yet, from the in-memory link state's public store."""
    with state.lock:
        return {m.metadata.dst_node_id for m in state.message_ins_store.values() if m.metadata.delivered_at == ""}


def event_driven_extractor(
    state: Any, queue: Queue[Any], nodes_mapping: Mapping[int, int], f_stop: threading.Event
) -> None:
    """The engine's extractor (``vce_api.add_messages_to_queue``), waking on stored instructions."""
    HUB.extractor_running.set()
    try:
        while not f_stop.is_set():
            if not HUB.enabled:  # Flower's loop, as it is
                for node_id in nodes_mapping:
                    for message in state.get_message_ins(node_id=node_id, limit=1):
                        queue.put(message)
                f_stop.wait(FLOWER_POLL)
                continue
            seen = HUB.instructions
            waiting = waiting_nodes(state)
            handed = 0
            for node_id in nodes_mapping:
                if node_id in waiting:
                    for message in state.get_message_ins(node_id=node_id, limit=1):
                        queue.put(message)
                        handed += 1
            if not handed:
                HUB.wait_for_instruction(seen, f_stop)
    finally:
        HUB.extractor_running.clear()


def _notifying(store: Callable[..., Any], instruction: bool) -> Callable[..., Any]:
    @functools.wraps(store)
    def store_and_notify(self: Any, message: Any) -> Any:
        stored = store(self, message)
        HUB.stored(instruction)
        return stored

    return store_and_notify


NodeConfig = tuple[int, int]
"""A virtual node's ``(partition-id, num-partitions)``, as its node config holds them."""


class NodeRegistry:
    """The virtual nodes the engine of this process runs (usually one federation per run), with their node config.

    The engine (Flower 1.41's ``vce_api.run_api``) receives every node's
    node info store, whose ``node_config`` is what the node's ClientApp reads
    as ``context.node_config``; a node's answer to fedweigh's ``query``
    message is its ``partition-id`` and ``num-partitions`` from there, so
    the registry holds the answer every node would give.
    """

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.federations: list[dict[int, NodeConfig]] = []

    def publish(self, configs: Mapping[int, NodeConfig]) -> None:
        """The engine runs these nodes (node id to ``(partition-id, num-partitions)``)."""
        with self.condition:
            self.federations.append(dict(configs))
            self.condition.notify_all()

    def covering(self, node_ids: Iterable[int]) -> dict[int, NodeConfig] | None:
        """The published federation that holds every one of ``node_ids`` (node ids are random 64-bit), or None."""
        wanted = set(node_ids)
        with self.condition:
            for configs in reversed(self.federations):
                if wanted <= configs.keys():
                    return configs
        return None

    def wait_covering(self, node_ids: Iterable[int], timeout: float) -> dict[int, NodeConfig] | None:
        """:meth:`covering`, waiting up to ``timeout`` s for the engine to publish it."""
        wanted = list(node_ids)
        with self.condition:  # an RLock: covering() takes it again; wait_for returns the predicate's last value
            return self.condition.wait_for(lambda: self.covering(wanted), timeout=timeout)


SimulatedNodes = tuple[dict[int, int], int | None]
"""Partition id of each node asked about, and the federation's ``num-partitions``."""

NODES = NodeRegistry()
"""What the engine of this process runs; read through :func:`simulated_partitions`."""
ENGINE_START_TIMEOUT = 600.0
"""Longest wait of the ServerApp for the engine to start its nodes (s): as long as a query would wait."""


def simulated_partitions(
    grid: Any, node_ids: Iterable[int], timeout: float = ENGINE_START_TIMEOUT
) -> SimulatedNodes | None:
    """``(partition id of each of node_ids, num-partitions)`` when ``grid`` is this process's simulation.

    None for any other grid, and when the engine has not published nodes
    holding all of ``node_ids`` within ``timeout`` s (the caller then asks
    the nodes, as in a deployment). The ServerApp's thread starts before the
    engine's, so this waits for the engine (it publishes when its loop
    starts, after loading the ClientApp).
    """
    if not applies_to(grid):
        return None
    wanted = list(node_ids)
    configs = NODES.wait_covering(wanted, timeout)
    if configs is None:
        return None
    partitions = {node: configs[node][0] for node in wanted}
    return partitions, max((count for _, count in configs.values()), default=None)


def node_config_of(store: Any) -> NodeConfig:
    """``(partition-id, num-partitions)`` of a node info store's node config (-1 and 0 where absent)."""
    config = store.node_config
    return int(config.get("partition-id", -1)), int(config.get("num-partitions", 0))


def requested_backend(node_info_stores: Mapping[int, Any]) -> str:
    """The ``simulation-backend`` the run config of the engine's nodes asks for; Ray's where it is not valid.

    Every node of a simulation holds the same run config (the app's with the run's overrides). A run config
    that does not validate is the ServerApp's to refuse, with its message; the engine then starts Flower's own.
    """
    for store in node_info_stores.values():
        for info in store.run_infos.values():
            try:
                return validate(info.initial_run_config).simulation_backend
            except SettingsError:
                return RAY_BACKEND
    return RAY_BACKEND


@functools.cache
def _in_process_backend_class() -> type:
    # Built on first use: importing Flower's backend package imports its engine (``ENGINE_MODULE``), which must
    # stay unloaded outside a simulation (prepare_if_simulating tells a simulation process by it).
    from flwr.clientapp.client_app import ClientAppException, LoadClientAppError
    from flwr.server.superlink.fleet.vce.backend import Backend

    class InProcessBackend(Backend):
        """Flower's simulation backend interface, running the ClientApp in this process, one message at a time.

        What Flower's Ray actor does with a message (``ClientAppActor.run``), without the actor: the ClientApp
        handles the message and its context, and an exception it raises becomes a
        ``ClientAppException``, which the engine turns into an error reply as it does for Ray.
        """

        def __init__(self, backend_config: Any = None) -> None:
            super().__init__(backend_config or {})
            self.app_fn: Callable[[], Any] | None = None

        def build(self, app_fn: Callable[[], Any]) -> None:
            self.app_fn = app_fn

        @property
        def num_workers(self) -> int:
            return 1  # one worker: one message at a time, as a single Ray actor runs them

        def is_worker_idle(self) -> bool:
            return self.app_fn is not None

        def terminate(self) -> None:
            self.app_fn = None

        def process_message(self, message: Any, context: Any) -> tuple[Any, Any]:
            if self.app_fn is None:
                raise ValueError("the in-process backend runs messages only after build()")
            try:
                reply = self.app_fn()(message=message, context=context)
            except LoadClientAppError:
                raise
            except Exception as error:  # noqa: BLE001 - reported to the ServerApp as the Ray backend reports it
                raise ClientAppException(str(error)) from error
            return reply, context

    return InProcessBackend


def in_process_backend(backend_config: Any = None) -> Any:
    """A simulation backend (Flower 1.41's ``Backend``) that runs the ClientApp in this process."""
    return _in_process_backend_class()(backend_config)


class EngineRecord:
    """Which backend the engine of this process built for its latest federation (for logs, tests, benchmarks)."""

    def __init__(self) -> None:
        self.backend = ""


ENGINE = EngineRecord()


class StoppingQueue(Queue):  # type: ignore[type-arg]
    """A ``queue.Queue`` whose waiting ``get`` also ends, with ``queue.Empty``, once :meth:`stop` is called.

    Flower 1.41's engine threads take messages with ``get(timeout=1.0)`` and
    look at the engine's stop event in between, so stopping the engine waited
    up to 1 s for them. After :meth:`stop` a ``get`` never waits: it returns
    an item if one is there, else raises ``queue.Empty``, and the thread sees
    the stop event. Otherwise ``get`` is ``queue.Queue``'s.
    """

    def __init__(self, maxsize: int = 0) -> None:
        super().__init__(maxsize)
        self.stopped = False
        _ENGINE_QUEUES.append(self)

    def stop(self) -> None:
        with self.not_empty:
            self.stopped = True
            self.not_empty.notify_all()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return super().get(block=False)
            except Empty:
                left = None if deadline is None else deadline - time.monotonic()
                if not block or self.stopped or (left is not None and left <= 0):
                    raise
            with self.not_empty:  # put() notifies under this lock: no wake-up is lost between the check and the wait
                if not self.stopped and not self.queue:
                    self.not_empty.wait(left)


_ENGINE_QUEUES: list[StoppingQueue] = []
"""The queues of the engine running in this process (one federation per simulation process)."""


def stop_when_set(f_stop: threading.Event) -> None:
    """Wait for the engine's stop event, then end every wait on the engine's queues and the extractor's."""
    f_stop.wait()
    while _ENGINE_QUEUES:
        _ENGINE_QUEUES.pop().stop()
    with HUB.condition:  # the extractor's wait looks at the stop event when woken
        HUB.condition.notify_all()


def _publishing(run_api: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(run_api)
    def publish_and_run(*args: Any) -> Any:  # Flower 1.41 calls it with positional arguments only
        node_info_stores, f_stop = args[4], args[5]
        ENGINE.backend = requested_backend(node_info_stores)
        if ENGINE.backend == IN_PROCESS_BACKEND:
            args = (args[0], in_process_backend, *args[2:])
        NODES.publish({node: node_config_of(store) for node, store in node_info_stores.items()})
        _ENGINE_QUEUES.clear()  # a finished engine's, if any
        threading.Thread(target=stop_when_set, args=(f_stop,), name="fedweigh-engine-stop", daemon=True).start()
        return run_api(*args)

    return publish_and_run


_prepared = threading.Lock()
_state_class: type | None = None


def prepare() -> bool:
    """Install the event-driven hand-off in this process (once); whether it is installed.

    Call it before the simulation engine starts its extractor (the app's
    import does). Returns False, and changes nothing, for a Flower version
    other than :data:`SUPPORTED_FLOWER`.
    """
    global _state_class
    if not supported():
        return False
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    with _prepared:
        if _state_class is None:
            InMemoryLinkState.store_message_ins = _notifying(InMemoryLinkState.store_message_ins, True)
            InMemoryLinkState.store_message_res = _notifying(InMemoryLinkState.store_message_res, False)
            vce_api.add_messages_to_queue = event_driven_extractor
            vce_api.run_api = _publishing(vce_api.run_api)
            vce_api.Queue = StoppingQueue
            _state_class = InMemoryLinkState
    return True


def prepare_if_simulating() -> None:
    """:func:`prepare` in a process that has loaded Flower's simulation engine (and nowhere else)."""
    if ENGINE_MODULE in sys.modules:
        prepare()


def applies_to(grid: Any) -> bool:
    """Whether ``grid`` (or the grid it wraps: its ``grid``) is a simulation's grid over the link state
    :func:`prepare` made notify."""
    while not hasattr(grid, "state") and hasattr(grid, "grid"):  # fedweigh's grid wrappers
        grid = grid.grid
    return _state_class is not None and isinstance(getattr(grid, "state", None), _state_class)


def describe(grid: Any) -> str:
    """One log line on how this run's messages are handed on."""
    import flwr

    if not supported():
        checked = f"the event-driven hand-off and the in-process backend are checked on {SUPPORTED_FLOWER}x"
        return f"flwr {flwr.__version__}: Flower's own polling and Ray actors ({checked})"
    if not applies_to(grid):
        return "not a simulation: Flower's own message handling"
    engine = "event-driven" if HUB.extractor_running.is_set() else "Flower's 0.1 s polling (it started before the app)"
    where = "the ClientApp runs in this process" if ENGINE.backend == IN_PROCESS_BACKEND else "ClientApps in Ray actors"
    return f"simulation hand-off: replies event-driven; the engine's loop {engine}; {where}"
