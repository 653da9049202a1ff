"""The event-driven hand-off of the simulation engine (fedweigh/flower/engine.py, fedweigh/strategies/wakeup.py).

The link state, the grid and the engine's thread are Flower 1.41's, set up as ``flwr.simulation`` sets them
up; only the loop and what wakes it are fedweigh's. No test measures a time: each one shows what ended a wait
(a stored message, never a time limit, which the tests set far beyond the test's own length).
"""

from __future__ import annotations

import inspect
import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from queue import Empty, Queue
from types import SimpleNamespace
from typing import Any

import flwr
import pytest
from conftest import REPO
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.client_app import ClientAppException
from flwr.common import Context
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.compat.client.run_info_store import DeprecatedRunInfoStore
from flwr.proto.task_pb2 import Task
from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.superlink.fleet.vce.backend import Backend
from flwr.server.superlink.linkstate import InMemoryLinkState, LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
from flwr.simulation.ray_transport.ray_actor import ClientAppActor
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import HttpGrid, InMemoryGrid

from fedweigh.flower import engine, supported
from fedweigh.flower.engine import (
    ENGINE,
    HUB,
    NODES,
    StoppingQueue,
    applies_to,
    event_driven_extractor,
    in_process_backend,
    prepare,
    requested_backend,
    simulated_partitions,
)
from fedweigh.settings import SettingsError, validate
from fedweigh.strategies.grid_wrapper import GridWrapper
from fedweigh.strategies.sampling import NodeDirectory
from fedweigh.strategies.wakeup import DEPLOYMENT_PULL_INTERVAL, PromptGrid, WakeupGrid, wakeup_grid

LONG = 60.0  # a time limit no wait in these tests may reach


def test_flower_is_the_version_the_hand_off_was_checked_against():
    """A Flower upgrade fails here first: check fedweigh/flower/engine.py against the new engine, then update."""
    assert supported(), flwr.__version__
    source = inspect.getsource(vce_api)
    assert "def add_messages_to_queue(" in source  # the loop replaced, as Flower 1.41 writes it:
    assert "get_message_ins(node_id=node_id, limit=1)" in source and "f_stop.wait(0.1)" in source
    assert "target=add_messages_to_queue," in inspect.getsource(vce_api.run_api)  # looked up when the engine starts
    assert "time.sleep(self.pull_interval)" in inspect.getsource(InMemoryGrid.send_and_receive)
    assert set(inspect.signature(InMemoryLinkState.store_message_ins).parameters) == {"self", "message"}
    assert set(inspect.signature(InMemoryLinkState.store_message_res).parameters) == {"self", "message"}
    assert prepare() and vce_api.add_messages_to_queue is event_driven_extractor
    # the nodes' configs, published as the engine's loop starts: run_api gets the stores the ClientApps read
    assert "node_info_stores,\n" in inspect.getsource(vce_api.start_vce).split("run_api(")[1][:300]
    assert inspect.unwrap(vce_api.run_api) is not vce_api.run_api  # wrapped by prepare()
    parameters = list(inspect.signature(inspect.unwrap(vce_api.run_api)).parameters)
    assert parameters[:5] == ["app_fn", "backend_fn", "nodes_mapping", "state_factory", "node_info_stores"]
    assert "PARTITION_ID_KEY: partition_id" in inspect.getsource(vce_api._register_node_info_stores)
    assert {"message_ins_store", "lock"} <= set(vars(Federation(nodes=1).state))
    # the backend run_api builds and uses as Flower 1.41 defines it (the in-process backend replaces it)
    assert "backend = backend_fn()" in inspect.getsource(inspect.unwrap(vce_api.run_api))
    assert "backend_fn,\n" in inspect.getsource(vce_api.start_vce).split("run_api(")[1][:300]
    assert Backend.__abstractmethods__ == {"build", "is_worker_idle", "terminate", "process_message"}
    actor_run = inspect.getsource(ClientAppActor.run)  # what the in-process backend does without the actor
    assert "app(message=message, context=context)" in actor_run and "raise ClientAppException(str(ex))" in actor_run
    assert "initial_run_config=initial_run_config" in inspect.getsource(DeprecatedRunInfoStore.register_context)
    # the engine's queues, as run_api makes them and its threads take from them (StoppingQueue)
    run_api_source = inspect.getsource(inspect.unwrap(vce_api.run_api))
    assert "messageins_queue: Queue[Message] = Queue()" in run_api_source and "f_stop,\n" in run_api_source
    assert "messageins_queue.get(timeout=1.0)" in inspect.getsource(vce_api.worker)
    assert "queue.get(timeout=1.0)" in inspect.getsource(vce_api.put_message_into_state)
    assert list(inspect.signature(inspect.unwrap(vce_api.run_api)).parameters)[5] == "f_stop"
    assert vce_api.Queue is StoppingQueue


@pytest.mark.sim
def test_importing_the_app_outside_a_simulation_changes_nothing_in_flower():
    code = (
        "import sys, fedweigh, fedweigh.client_app, fedweigh.server_app; "
        "print(any(m.startswith('flwr.server.superlink.fleet.vce') for m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


class Federation:
    """Flower's in-memory link state with a run and nodes, its grid, and the engine's extractor loop."""

    def __init__(self, nodes: int) -> None:
        factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
        self.state = factory.state()
        run = Run.create_empty(run_id=7)
        run.primary_task_id = 11
        run.federation_id = NOOP_FEDERATION_ID
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, SUPERLINK_NODE_ID
        self.state.run_ids[run.run_id] = RunRecord(run=run)
        self.state.task_store[11] = Task(task_id=11, run_id=7)
        self.nodes = []
        for i in range(nodes):  # as the engine registers its virtual nodes
            node = self.state.create_node("aid", "account", bytes([i]) * 32, heartbeat_interval=1e9)
            self.state.acknowledge_node_heartbeat(node_id=node, heartbeat_interval=1e9)
            self.nodes.append(node)
        self.grid = InMemoryGrid(state_factory=factory)
        self.grid.set_run(run)
        self.queue: Queue[Message] = Queue()
        self.stop = threading.Event()
        mapping = {node: i for i, node in enumerate(self.nodes)}
        self.extractor = threading.Thread(  # the engine's loop, as run_api starts it
            target=vce_api.add_messages_to_queue, args=(self.state, self.queue, mapping, self.stop), daemon=True
        )

    def message(self, node: int) -> Message:
        return Message(RecordDict(), dst_node_id=node, message_type="query", ttl=LONG)

    def reply(self, instruction: Message) -> Message:
        """A client's reply, with its id set as the engine's worker sets it (``vce_api.worker``)."""
        reply = Message(RecordDict(), reply_to=instruction)
        reply.metadata.__dict__["_message_id"] = str(uuid.uuid4())
        return reply


@pytest.fixture(autouse=True)
def task_identity() -> Iterator[None]:
    """Flower's simulation names the task it runs as (``Federation`` does as run_simulation does); put it back."""
    names = ("task_id", "run_id", "node_id")
    kept = {name: _identity(name) for name in names}
    yield
    for name in names:
        setattr(TaskIdentity, name, kept[name])  # None again where this process had none yet


def _identity(name: str) -> int | None:
    """``TaskIdentity``'s ``name``, None where this process has not set it (its getter raises then)."""
    try:
        return getattr(TaskIdentity, name)
    except RuntimeError:
        return None


@pytest.fixture
def federation() -> Iterator[Federation]:
    assert prepare()
    fed = Federation(nodes=5)
    HUB.max_idle_wait = LONG
    HUB.enabled = True
    try:
        yield fed
    finally:
        fed.stop.set()
        HUB.max_idle_wait = engine.MAX_IDLE_WAIT
        HUB.enabled = True
        HUB.stored(instruction=True)  # wake the extractor so that it sees the stop
        if fed.extractor.is_alive():
            fed.extractor.join(timeout=LONG)
            assert not fed.extractor.is_alive()


def test_the_grid_is_wrapped_in_a_simulation_only(federation):
    assert applies_to(federation.grid)
    assert isinstance(wakeup_grid(federation.grid), WakeupGrid)
    assert wakeup_grid(federation.grid, enabled=False) is federation.grid and not HUB.enabled

    class DeploymentGrid(InMemoryGrid):  # a grid without the in-memory link state
        def __init__(self) -> None:
            self.state = object()

    plain = DeploymentGrid()
    assert not applies_to(plain) and wakeup_grid(plain) is plain


def test_the_extractor_waits_for_an_instruction_and_an_instruction_wakes_it(federation):
    federation.extractor.start()
    assert HUB.extractor_waiting.wait(LONG)  # nothing to hand on: it waits on the condition, not on a clock
    woken = HUB.woken_by_instruction
    [message] = [federation.message(federation.nodes[2])]
    federation.grid.push_messages([message])
    delivered = federation.queue.get(timeout=LONG)
    assert delivered.metadata.dst_node_id == federation.nodes[2]
    assert HUB.woken_by_instruction == woken + 1  # woken by the stored instruction, long before its LONG limit


def test_nothing_waiting_is_ever_held_back(federation):
    """Instructions stored before the loop starts, two for one node, are all handed on without a wait."""
    first = federation.nodes[0]
    federation.grid.push_messages([federation.message(node) for node in federation.nodes])
    federation.grid.push_messages([federation.message(first)])
    woken = HUB.woken_by_instruction
    federation.extractor.start()
    got = [federation.queue.get(timeout=LONG).metadata.dst_node_id for _ in range(len(federation.nodes) + 1)]
    assert sorted(got) == sorted([*federation.nodes, first])
    assert HUB.woken_by_instruction == woken


def test_switched_off_the_loop_is_flower_s_polling(federation):
    HUB.enabled = False
    woken = HUB.woken_by_instruction
    federation.extractor.start()
    federation.grid.push_messages([federation.message(federation.nodes[1])])
    assert federation.queue.get(timeout=LONG).metadata.dst_node_id == federation.nodes[1]
    assert HUB.woken_by_instruction == woken and not HUB.extractor_waiting.is_set()


def test_the_grid_wakes_when_a_reply_is_stored(federation):
    federation.extractor.start()
    grid = WakeupGrid(federation.grid)
    grid.pull_interval = LONG  # a poll could not explain an answer before the test's end
    instructions = [federation.message(node) for node in federation.nodes[:3]]
    answered: list[Message] = []

    def clients() -> None:
        for _ in instructions:
            federation.state.store_message_res(federation.reply(federation.queue.get(timeout=LONG)))

    worker = threading.Thread(target=clients)
    worker.start()
    woken = HUB.woken_by_reply
    answered = list(grid.send_and_receive(instructions, timeout=3 * LONG))
    worker.join(timeout=LONG)
    assert sorted(r.metadata.src_node_id for r in answered) == sorted(federation.nodes[:3])
    assert HUB.woken_by_reply > woken


def test_the_grid_returns_what_arrived_by_its_timeout(federation):
    grid = WakeupGrid(federation.grid)
    assert list(grid.send_and_receive([federation.message(federation.nodes[0])], timeout=0.0)) == []


def register_like_the_engine(federation: Federation, partitions: list[int]) -> dict[int, Any]:
    """Flower's node info stores for ``federation``'s nodes, handed to the engine's loop as ``start_vce`` does.

    The loop itself is a stand-in (no Ray here); fedweigh's wrapper around it is the one :func:`prepare` installs.
    """
    mapping = dict(zip(federation.nodes, partitions, strict=True))
    stores = vce_api._register_node_info_stores(nodes_mapping=mapping, run=Run.create_empty(run_id=7), app_dir=None)
    engine._publishing(lambda *args: None)(None, None, mapping, None, stores, federation.stop, None)
    return stores


def test_the_server_reads_each_node_s_partition_as_the_node_would_say_it(federation):
    stores = register_like_the_engine(federation, [3, 0, 4, 1, 2])
    partitions, num_partitions = simulated_partitions(federation.grid, federation.nodes, timeout=0.0)
    for node, store in stores.items():  # what the node's own query handler reads (client_app.describe)
        assert partitions[node] == store.node_config["partition-id"]
        assert num_partitions == store.node_config["num-partitions"] == 5


def test_in_a_simulation_the_directory_learns_the_nodes_without_a_message(federation):
    register_like_the_engine(federation, [3, 0, 4, 1, 2])
    stored = HUB.instructions
    directory = NodeDirectory(query_timeout=0.0)  # a query could not be answered: no engine loop runs
    grid = wakeup_grid(federation.grid)  # as the ServerApp hands it on
    assert isinstance(grid, WakeupGrid)
    assert sorted(directory.await_federation(grid, min_nodes=5)) == sorted(federation.nodes)
    assert [directory.partition_of[node] for node in federation.nodes] == [3, 0, 4, 1, 2]
    assert directory.num_partitions == 5 and HUB.instructions == stored  # no instruction was stored


def test_the_server_waits_for_the_engine_to_register_its_nodes(federation):
    """The ServerApp's thread starts before the engine's; it waits for the mapping, not a clock."""
    registered = threading.Thread(target=register_like_the_engine, args=(federation, [0, 1, 2, 3, 4]))
    answer: list[Any] = []

    def ask() -> None:
        answer.append(simulated_partitions(federation.grid, federation.nodes, LONG))

    asking = threading.Thread(target=ask)
    asking.start()
    registered.start()
    registered.join(timeout=LONG)
    asking.join(timeout=LONG)
    assert answer[0] == (dict(zip(federation.nodes, range(5), strict=True)), 5)


def test_nodes_the_engine_did_not_register_are_asked():
    """Another grid (a deployment), or nodes no mapping holds: None, so the directory sends its query."""
    fed = Federation(nodes=2)
    assert simulated_partitions(fed.grid, fed.nodes, timeout=0.0) is None  # never published
    assert NODES.covering(fed.nodes) is None

    class DeploymentGrid(InMemoryGrid):
        def __init__(self) -> None:
            self.state = object()

    assert simulated_partitions(DeploymentGrid(), fed.nodes, timeout=0.0) is None


class ScriptedHttpGrid(HttpGrid):
    """Flower's deployment grid with the SuperLink replaced by a script: reply ``i`` arrives at pull ``i + 2``."""

    def __init__(self, ids: list[str]) -> None:  # no connection: push and pull are the script's
        self.ids = ids
        self.pulls = 0

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return list(self.ids)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self.pulls += 1
        due = {self.ids[i] for i in range(len(self.ids)) if self.pulls == i + 2}
        return [
            SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in sorted(due & set(message_ids))
        ]


def test_a_deployment_grid_looks_for_replies_every_tenth_of_a_second(monkeypatch):
    """Flower 1.41's HttpGrid sleeps 3 s between looks; the ServerApp's grid looks every 0.1 s, nothing else changed."""
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    scripted = ScriptedHttpGrid(["a", "b"])
    grid = wakeup_grid(scripted)
    assert isinstance(grid, PromptGrid) and grid.grid is scripted
    replies = list(grid.send_and_receive([], timeout=None))
    assert [r.metadata.reply_to_message_id for r in replies] == ["a", "b"]
    assert scripted.pulls == 3 and slept == [DEPLOYMENT_PULL_INTERVAL] * 2
    assert "time.sleep(3)" in inspect.getsource(HttpGrid.send_and_receive)  # what it replaces (Flower 1.41)


def test_a_deployment_grid_returns_what_arrived_by_its_timeout(monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    scripted = ScriptedHttpGrid(["a", "b"])
    assert list(PromptGrid(scripted).send_and_receive([], timeout=0.0)) == [] and scripted.pulls == 1


# -- the in-process backend ------------------------------------------------------------------------------


def node_stores(override_config: dict[str, Any], nodes: int = 2) -> dict[int, DeprecatedRunInfoStore]:
    """The engine's node info stores for a run of this app with ``override_config``, as ``start_vce`` registers
    them (``_register_node_info_stores``: the app's run config fused with the run's overrides)."""
    run = Run.create_empty(run_id=7)
    run.override_config = override_config
    stores = {}
    for node in range(nodes):
        stores[100 + node] = DeprecatedRunInfoStore(node_id=100 + node, node_config={"partition-id": node})
        stores[100 + node].register_context(run_id=7, run=run, app_dir=str(REPO))
    return stores


def test_the_run_config_chooses_the_backend_and_ray_stays_the_default():
    assert requested_backend(node_stores({"simulation-backend": "in-process"})) == "in-process"
    assert requested_backend(node_stores({})) == "ray"
    # a run config that does not validate is the ServerApp's to refuse, with its message: the engine starts Ray's
    assert requested_backend(node_stores({"simulation-backend": "threads"})) == "ray"
    with pytest.raises(SettingsError, match="simulation-backend = 'threads': Input should be 'ray' or 'in-process'"):
        validate({"simulation-backend": "threads"})
    assert requested_backend({}) == "ray"


@pytest.mark.parametrize("backend", ["in-process", "ray"])
def test_the_engine_builds_the_backend_the_run_config_names(backend):
    calls = []

    def run_api(*args: Any) -> None:  # Flower's run_api, as far as the wrapper can tell
        calls.append(args)

    ray_backend, stop = object(), threading.Event()
    stores = node_stores({"simulation-backend": backend})
    engine._publishing(run_api)("app_fn", ray_backend, {}, "state", stores, stop, "metrics")
    stop.set()
    ((app_fn, backend_fn, *rest),) = calls
    assert app_fn == "app_fn" and rest == [{}, "state", stores, stop, "metrics"]
    assert ENGINE.backend == backend
    assert (backend_fn is in_process_backend) == (backend == "in-process")
    assert (backend_fn is ray_backend) == (backend == "ray")


def test_a_wait_on_an_engine_queue_ends_when_the_engine_stops():
    """Flower's engine threads wait 1 s on their queues between looks at the stop event; setting it ends the wait.

    The waits' time limit (60 s) is far beyond the test's join (10 s): only the stop can end them in time.
    """
    stop = threading.Event()
    instructions, replies = StoppingQueue(), StoppingQueue()
    ended: list[str] = []

    def take(queue: StoppingQueue, name: str) -> None:
        with pytest.raises(Empty):
            queue.get(timeout=60.0)
        ended.append(name)

    takers = [threading.Thread(target=take, args=(q, n)) for q, n in ((instructions, "worker"), (replies, "injector"))]
    for taker in takers:
        taker.start()
    watcher = threading.Thread(target=engine.stop_when_set, args=(stop,))
    watcher.start()
    stop.set()
    for thread in (*takers, watcher):
        thread.join(timeout=10)
    assert sorted(ended) == ["injector", "worker"] and not any(t.is_alive() for t in (*takers, watcher))
    # once stopped, a get never waits: an item is still returned, an empty queue raises at once
    instructions.put("late")
    assert instructions.get(timeout=60.0) == "late"
    with pytest.raises(Empty):
        instructions.get()


def test_an_engine_queue_before_its_stop_is_a_plain_queue():
    queue = StoppingQueue()
    with pytest.raises(Empty):
        queue.get(timeout=0.0)
    with pytest.raises(Empty):
        queue.get(block=False)
    got: list[Any] = []
    taker = threading.Thread(target=lambda: got.append(queue.get()))  # no timeout: waits for the item
    taker.start()
    queue.put("instruction")
    taker.join(timeout=10)
    assert got == ["instruction"] and queue.empty()


def test_the_in_process_backend_runs_the_client_app_on_the_message_in_this_process():
    app = ClientApp()
    handled: list[tuple[Message, Context, int]] = []

    @app.query()
    def answer(message: Message, context: Context) -> Message:
        handled.append((message, context, threading.get_ident()))
        context.state["seen"] = ConfigRecord({"messages": 1})
        return Message(RecordDict({"answer": ConfigRecord({"node": context.node_id})}), reply_to=message)

    backend = in_process_backend()
    assert isinstance(backend, Backend) and backend.num_workers == 1 and not backend.is_worker_idle()
    backend.build(lambda: app)
    assert backend.is_worker_idle()
    instruction = Message(RecordDict(), dst_node_id=5, message_type="query", ttl=LONG)
    instruction.metadata.__dict__["_message_id"] = "m1"
    context = Context(run_id=7, node_id=5, node_config={}, state=RecordDict(), run_config={})
    reply, updated = backend.process_message(instruction, context)
    # the stored instruction itself reached the ClientApp, in this thread: nothing was copied or sent
    assert handled == [(instruction, context, threading.get_ident())]
    assert reply.content["answer"]["node"] == 5 and reply.metadata.reply_to_message_id == "m1"
    assert updated is context and context.state["seen"]["messages"] == 1
    backend.terminate()
    assert not backend.is_worker_idle()


def test_a_client_app_that_raises_is_an_error_the_engine_reports_as_for_ray():
    app = ClientApp()

    @app.query()
    def fail(message: Message, context: Context) -> Message:
        raise RuntimeError("partition 3 cannot load its data")

    backend = in_process_backend()
    backend.build(lambda: app)
    context = Context(run_id=7, node_id=5, node_config={}, state=RecordDict(), run_config={})
    message = Message(RecordDict(), dst_node_id=5, message_type="query", ttl=LONG)
    with pytest.raises(ClientAppException, match="partition 3 cannot load its data"):
        backend.process_message(message, context)
    with pytest.raises(ValueError, match="only after build"):
        in_process_backend().process_message(message, context)


def test_a_deployment_round_still_waiting_after_a_minute_says_whom_it_waits_for(monkeypatch, caplog):
    """Reply "a" comes at the second look, "b" never: every minute of the wait names node 8, nothing else."""
    now = [0.0]
    monkeypatch.setattr(time, "sleep", lambda seconds: now.__setitem__(0, now[0] + seconds))
    scripted = ScriptedHttpGrid(["a", "b"])
    grid = PromptGrid(ForgetfulGrid(scripted, never={"b"}))
    grid.clock = lambda: now[0]
    messages = [Message(RecordDict(), dst_node_id=node, message_type="train", ttl=LONG) for node in (7, 8)]
    with caplog.at_level(logging.WARNING, logger="flwr.fedweigh"):
        replies = list(grid.send_and_receive(messages, timeout=150.0))
    assert [r.metadata.reply_to_message_id for r in replies] == ["a"]
    assert [r.getMessage() for r in caplog.records if "still waiting" in r.getMessage()] == [
        "[fedweigh] still waiting after 60 s for 1 of 2 replies: node 8",
        "[fedweigh] still waiting after 120 s for 1 of 2 replies: node 8",
    ]


class ForgetfulGrid(GridWrapper):
    """A grid whose replies to ``never`` never arrive."""

    def __init__(self, grid, never: set[str]) -> None:
        super().__init__(grid)
        self.never = never

    def pull_messages(self, message_ids):
        return [
            reply
            for reply in self.grid.pull_messages(message_ids)
            if reply.metadata.reply_to_message_id not in self.never
        ]


def test_importing_fedweigh_changes_nothing_in_flower():
    """The library (strategies, client signals) imported into a process that has Flower's simulation engine loaded
    leaves the engine as Flower made it; the ServerApp module installs the hand-off explicitly."""
    script = (
        "import importlib, flwr.server.superlink.fleet.vce.vce_api as vce, flwr.simulation.app as sim\n"
        "before = (vce.add_messages_to_queue, vce.run_api, sim.flush_logs)\n"
        "import fedweigh, fedweigh.strategies.library, fedweigh.client, fedweigh.launch.flwr_cli\n"
        "assert (vce.add_messages_to_queue, vce.run_api, sim.flush_logs) == before, 'changed by import fedweigh'\n"
        "importlib.import_module('fedweigh.server_app')\n"
        "assert vce.add_messages_to_queue is not before[0], 'not installed by the ServerApp module'\n"
        "assert sim.flush_logs is not before[2], 'the log flush not installed by the ServerApp module'\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]
