"""What ``fedweigh-supernode`` (:mod:`fedweigh.flower.supernode`) changes in Flower 1.41, checked against Flower.

The first test pins what it relies on in Flower's SuperNode and fails on an
upgrade until the module is checked again. The others run Flower's own loop
(``start_client_internal``, with a scripted connection in place of the
SuperLink) with the change installed. Its effect on a deployed round is
measured by ``fedweigh benchmark deployment`` (docs/benchmarks.md, section 8);
``tests/test_deployment.py`` and ``tests/test_containers.py`` run it on real
federations.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import threading

import flwr
import pytest
from flwr.app import Message, MetricRecord, RecordDict
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree

from fedweigh.flower import supernode, supported

LOOP = importlib.import_module(supernode.MAIN_LOOP_MODULE)


def sleeps_in(module) -> list[tuple[str, float]]:
    """Every ``time.sleep(<constant>)`` of ``module``, with the top-level function it is in."""
    found = []
    for function in ast.parse(inspect.getsource(module)).body:
        if not isinstance(function, ast.FunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "time":
                assert node.attr == "sleep", f"{function.name} uses time.{node.attr}: the loop's clock would change"
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "time.sleep":
                found.append((function.name, ast.literal_eval(node.args[0])))
    return found


def test_it_changes_only_the_waits_of_flower_s_supernode_loop():
    """Checked against Flower 1.41: the loop's waits, where it finds its pull and the node's stores."""
    assert supported(), flwr.__version__
    # The loop: a pull that found nothing is followed by the 3 s sleep, a message by the push of its reply.
    assert "import time\n" in inspect.getsource(LOOP)
    assert sleeps_in(LOOP) == [("start_client_internal", 3), ("_push_messages", 0.5), ("_push_messages", 0.5)]
    loop = inspect.getsource(LOOP.start_client_internal)
    after_pull = loop.split("run_id = _pull_and_store_message(", 1)[1]
    assert after_pull.index("if run_id is None:") < after_pull.index("time.sleep(3)") < after_pull.index("continue")
    assert after_pull.index("continue") < after_pull.index("_push_messages(")
    push = inspect.getsource(LOOP._push_messages)
    assert "while not (reply_messages := state.get_messages_legacy(is_reply=True)):" in push
    assert 'while (content := object_store.get(tree.object_id)) == b"":' in push
    # flower-supernode runs that loop, on a state of the class whose stores are watched.
    cli = importlib.import_module("flwr.supernode.cli.flower_supernode")
    assert cli.start_client_internal.__globals__ is vars(LOOP)
    factory = importlib.import_module("flwr.supernode.nodestate.nodestate_factory")
    assert "InMemoryNodeState(" in inspect.getsource(factory.NodeStateFactory.state)
    # The ClientApp's reply and its objects reach the state through these two methods.
    handlers = importlib.import_module("flwr.supernode.servicer.runtime.runtime_handlers")
    assert "state.store_message_and_object_tree(" in inspect.getsource(handlers.push_messages)
    assert "state.store_object(" in inspect.getsource(handlers.push_object)
    state_class = importlib.import_module(supernode.NODE_STATE_MODULE).InMemoryNodeState
    assert "self.store_message(message)" in inspect.getsource(state_class.store_message_and_object_tree)
    # Flower's Fleet API cannot hold a pull until a message comes (no field of the request asks it to wait).
    from flwr.proto.fleet_pb2 import PullMessagesRequest

    assert [field.name for field in PullMessagesRequest.DESCRIPTOR.fields] == ["node", "message_ids"]  # no wait


def test_the_back_off_starts_short_and_grows_to_flower_s_wait():
    waits = [supernode.idle_wait(t / 10) for t in range(0, 1000)]
    assert waits[0] == supernode.POLL_INTERVAL and waits[-1] == supernode.FLOWER_IDLE_WAIT
    assert all(a <= b for a, b in zip(waits, waits[1:], strict=False))
    # Never more than a tenth of the time waited so far late (or the first wait), never above Flower's.
    assert all(w <= max(supernode.POLL_INTERVAL, t / 100) + 1e-12 for t, w in enumerate(waits))
    assert supernode.idle_wait(0.0, first=0.5) == 0.5


def test_the_first_wait_is_a_number_of_seconds_up_to_flower_s_and_everything_else_is_flower_s(capsys):
    flower = ["--superlink", "superlink:9093", "--isolation", "process"]
    assert supernode.split_arguments(flower) == (supernode.POLL_INTERVAL, flower)
    assert supernode.split_arguments([*flower, "--poll-interval", "0.2"]) == (0.2, flower)
    for bad in ("0", "-1", "4", "soon", "nan", "inf"):
        with pytest.raises(SystemExit):
            supernode.split_arguments(["--poll-interval", bad])
        message = "argument --poll-interval: expected a number of seconds above 0 and at most 3"
        assert message in capsys.readouterr().err


def test_a_pull_that_finds_nothing_is_asked_again_after_the_back_off():
    answers = iter([None, None, None, 7])
    now = [100.0]
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds + 4.0  # each pull takes 4 s here: the waits grow with the time found idle

    pull = supernode.asking_promptly(lambda **_: next(answers), 0.05, clock=lambda: now[0], sleep=sleep)
    assert pull(state=None) == 7
    assert waits == pytest.approx([0.05, 0.405, 0.1 * (4.05 + 4.0 + 0.405)])


def test_a_store_ends_the_loop_s_wait_before_its_time():
    events = supernode.NodeEvents(recheck=3600.0)
    outcome: list[bool] = []
    waiter = threading.Thread(target=lambda: outcome.append(events.sleep(3600.0)))
    waiter.start()
    assert events.waiting.wait(timeout=60)
    events.stored()
    waiter.join(timeout=60)
    assert outcome == [True] and events.woken == 1 and events.timed_out == 0
    assert events.sleep(0.0) is False and events.timed_out == 1  # nothing stored: the wait runs out


def test_installing_refuses_another_flower_version(monkeypatch):
    monkeypatch.setattr(flwr, "__version__", "1.42.0")
    expected = r"checked against flwr 1\.41\.x, this is flwr 1\.42\.0: use flower-supernode"
    with pytest.raises(RuntimeError, match=expected):
        supernode.install()


class Stop(Exception):
    """Ends Flower's endless loop in the test."""


@pytest.fixture
def installed(monkeypatch):
    """:func:`fedweigh.flower.supernode.install` in this process, undone after the test; Flower's pull scripted."""
    state_class = importlib.import_module(supernode.NODE_STATE_MODULE).InMemoryNodeState
    for name in ("store_message", "store_object"):
        monkeypatch.setattr(state_class, name, getattr(state_class, name))  # put back after the test
    monkeypatch.setattr(LOOP, "time", LOOP.time)
    monkeypatch.setattr(LOOP, "register_signal_handlers", lambda **_: None)  # not pytest's signals
    script: list = []

    def flower_pull(*, state, object_store, **_):
        step = script.pop(0)
        return step(state, object_store) if callable(step) else step

    monkeypatch.setattr(LOOP, "_pull_and_store_message", flower_pull)
    events = supernode.install(0.01)
    events.recheck = 3600.0  # a wait here ends on a store or at the loop's own limit, never at the recheck
    slept: list[float] = []
    sleep = events.sleep
    monkeypatch.setattr(events, "sleep", lambda seconds: slept.append(seconds) or sleep(seconds))
    return events, script, slept


def run_flower_loop(monkeypatch, send, push_object) -> None:
    """Flower's ``start_client_internal``, connected to a scripted SuperLink, until :class:`Stop`."""
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supernode.nodestate import NodeStateFactory

    @contextlib.contextmanager
    def connection(**_):
        yield 5, None, send, None, None, None, push_object, None

    monkeypatch.setattr(LOOP, "_init_connection", connection)
    with pytest.raises(Stop):
        LOOP.start_client_internal(
            state_factory=NodeStateFactory(ObjectStoreFactory()),
            server_address="127.0.0.1:9",
            node_config={},
            insecure=True,
            isolation="process",
        )


def messages() -> tuple[Message, Message]:
    """An instruction and the ClientApp's reply to it, each with its id."""
    instruction = Message(RecordDict({"config": MetricRecord({"round": 1})}), dst_node_id=5, message_type="train")
    instruction.metadata.__dict__["_message_id"] = instruction.object_id
    reply = Message(RecordDict({"metrics": MetricRecord({"loss": 0.5})}), reply_to=instruction)
    reply.metadata.__dict__["_message_id"] = reply.object_id
    return instruction, reply


def test_flower_s_loop_asks_again_without_its_3s_sleep_and_pushes_the_reply_when_it_is_stored(installed, monkeypatch):
    """Two empty pulls, a message, its reply stored by the 'ClientApp' while the loop waits, then the end.

    The loop never sleeps its 3 s; its wait for the reply and for the reply's
    content ends when they are stored, as the Runtime API stores them.
    """
    events, script, slept = installed
    instruction, reply = messages()
    tree = get_object_tree(reply)
    contents = {object_id: obj.deflate() for object_id, obj in get_all_nested_objects(reply).items()}

    def client_app(state) -> None:
        """The node's ClientApp, through the Runtime API's handlers' state calls: the reply, then its objects."""
        assert events.waiting.wait(timeout=60)  # the loop waits for the reply
        session = state.start_session(reply.metadata.run_id)
        stored, missing = state.store_message_and_object_tree(reply, tree, session)
        assert stored and set(missing) == set(contents)
        for object_id in missing:
            assert state.store_object(reply.metadata.run_id, session, object_id, contents[object_id])

    def a_message(state, object_store):
        threading.Thread(target=client_app, args=(state,), daemon=True).start()
        return instruction.metadata.run_id

    def the_end(state, object_store):
        raise Stop

    script += [None, None, a_message, the_end]
    sent, pushed = [], {}

    def send(message, object_tree, runtime):
        sent.append(message.metadata.message_id)
        return set(contents), "session"

    def push_object(run_id, session_id, object_id, content):
        pushed[object_id] = content

    run_flower_loop(monkeypatch, send, push_object)
    assert script == [] and sent == [reply.metadata.message_id] and pushed == contents
    assert 3 not in slept  # Flower's idle sleep never ran
    assert events.woken >= 1  # the reply's wait ended on its store
