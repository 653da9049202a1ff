"""What ``fedweigh-superexec`` (:mod:`fedweigh.flower.resident`) changes in Flower 1.41, checked against Flower.

The resident ClientApp at work on a real deployment (two of the three sites of
``tests/test_deployment.py`` run it): every message of a site answered by one
process that imported the app once, and results equal to the same run in one
process, bit for bit, as those of the site that runs Flower's default
isolation.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
import types

import flwr
import pytest
from flwr.supercore.constant import ExecutorType

from fedweigh.flower import resident, supported


def test_it_replaces_only_flower_s_executor_and_keeps_flower_s_loop(monkeypatch):
    """Checked against Flower 1.41: the loop looks up get_executor when it starts, and reads the poll setting."""
    runner = importlib.import_module(resident.RUNNER_MODULE)
    assert supported(), flwr.__version__
    assert "executor = get_executor(" in inspect.getsource(runner.run_superexec)
    assert runner._TASK_POLL_INTERVAL_ENV == resident.TASK_POLL_ENV
    source = inspect.getsource(importlib.import_module("flwr.supernode.runtime.run_clientapp").run_clientapp)
    for step in ("pull_task_input(client)", "push_message(client, reply_message, context)", "HeartbeatSender("):
        assert step in source  # what run_task does, as flwr-clientapp does it
    run_clientapp = importlib.import_module("flwr.supernode.runtime.run_clientapp")
    for step in ("client.PullTaskInput(", "client.PullMessages(", "pull_and_inflate_object_from_tree(", "_message_id"):
        assert step in inspect.getsource(run_clientapp.pull_task_input)  # what resident.pull_task_input repeats
    heartbeat = inspect.getsource(importlib.import_module("flwr.supercore.heartbeat").make_task_heartbeat_fn_http)
    assert "client.SendTaskHeartbeat(" in heartbeat and "raise_signal" in heartbeat  # what task_heartbeat avoids
    monkeypatch.setattr(runner, "get_executor", runner.get_executor)  # put back after the test
    executor = resident.install()
    assert runner.get_executor(ExecutorType.SUBPROCESS, None) is executor
    with pytest.raises(ValueError, match="--executor subprocess only"):
        runner.get_executor(ExecutorType.KUBERNETES, {"namespace": "n"})


def test_the_fab_s_packages_are_imported_afresh(tmp_path, monkeypatch):
    (tmp_path / "siteapp").mkdir()
    (tmp_path / "siteapp" / "__init__.py").write_text("")
    (tmp_path / "helper.py").write_text("")
    (tmp_path / "data").mkdir()  # not a package
    assert resident.app_packages(tmp_path) == {"siteapp", "helper"}
    for name in ("siteapp", "siteapp.client", "helper", "siteapplication"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    assert sorted(resident.forget_modules({"siteapp", "helper"})) == ["helper", "siteapp", "siteapp.client"]
    assert "siteapplication" in sys.modules  # a name that only starts like one stays


class Runtime:
    """The SuperNode's Runtime API as a ClientApp task sees it, serving one message; its content can be withheld."""

    def __init__(self, message, context, *, available=True, task_alive=True):
        from flwr.app.message import remove_content_from_message
        from flwr.common.serde import context_to_proto, fab_to_proto, message_to_proto, run_to_proto
        from flwr.proto.runtime_pb2 import PullAppMessagesResponse, PullTaskInputResponse
        from flwr.supercore.fab import Fab
        from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree
        from flwr.supercore.run import Run

        self.contents = {oid: obj.deflate() for oid, obj in get_all_nested_objects(message).items()}
        self.available, self.task_alive = available, task_alive
        self.pulled, self.confirmed = [], []
        self.task_input = PullTaskInputResponse(
            task_id=3,
            context=context_to_proto(context),
            run=run_to_proto(Run.create_empty(context.run_id)),
            fab=fab_to_proto(Fab("f" * 64, b"", {})),
        )
        self.messages = PullAppMessagesResponse(
            messages_list=[message_to_proto(remove_content_from_message(message))],
            message_object_trees=[get_object_tree(message)],
        )

    def PullTaskInput(self, request):  # noqa: N802 - the Runtime API's names
        return self.task_input

    def PullMessages(self, request):  # noqa: N802
        return self.messages

    def PullObject(self, request):  # noqa: N802
        from flwr.proto.message_pb2 import PullObjectResponse

        self.pulled.append(request.object_id)
        if not self.available:
            return PullObjectResponse(object_found=True, object_available=False)
        return PullObjectResponse(
            object_found=True, object_available=True, object_content=self.contents[request.object_id]
        )

    def ConfirmMessageReceived(self, request):  # noqa: N802
        from flwr.proto.message_pb2 import ConfirmMessageReceivedResponse

        self.confirmed.append(request.message_object_id)
        return ConfirmMessageReceivedResponse()

    def SendTaskHeartbeat(self, request):  # noqa: N802
        from flwr.proto.runtime_pb2 import SendTaskHeartbeatResponse

        return SendTaskHeartbeatResponse(success=self.task_alive)

    # -- what a task sends back ------------------------------------------------------
    pushed_message = output = None
    closed = False

    def PushMessages(self, request):  # noqa: N802
        from flwr.proto.runtime_pb2 import PushAppMessagesResponse
        from flwr.supercore.inflatable.inflatable_object import iterate_object_tree

        self.pushed_message, self.pushed_objects = request.messages_list[0], {}
        wanted = [tree.object_id for tree in iterate_object_tree(request.message_object_trees[0])]
        return PushAppMessagesResponse(objects_to_push=wanted)

    def PushObject(self, request):  # noqa: N802
        from flwr.proto.message_pb2 import PushObjectResponse

        self.pushed_objects[request.object_id] = request.object_content
        return PushObjectResponse(stored=True)

    def PushTaskOutput(self, request):  # noqa: N802
        from flwr.proto.runtime_pb2 import PushTaskOutputResponse

        self.output = request
        return PushTaskOutputResponse()

    def close(self):
        self.closed = True


@pytest.fixture
def train_message():
    """A train message for node 5 of run 1, with its node's context (a task's identity set, as in a task)."""
    import numpy as np
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 5, 3
    content = RecordDict({"arrays": ArrayRecord([np.arange(6, dtype=np.float32)]), "config": ConfigRecord({"lr": 0.1})})
    message = Message(content, dst_node_id=5, message_type="train")
    yield message, Context(run_id=1, node_id=5, node_config={"partition-id": 2}, state=RecordDict(), run_config={})
    TaskIdentity.run_id = TaskIdentity.node_id = TaskIdentity.task_id = None


def pulled_within(runtime, seconds, **limits):
    """pull_task_input in a thread: its result or its exception; fails if the pull still runs after ``seconds``."""
    outcome = {}

    def pull():
        try:
            outcome["input"] = resident.pull_task_input(runtime, **limits)
        except Exception as err:  # noqa: BLE001 - the outcome under test
            outcome["error"] = err

    worker = threading.Thread(target=pull, daemon=True)
    worker.start()
    worker.join(timeout=seconds)
    assert not worker.is_alive(), f"the input pull was still waiting after {seconds} s ({len(runtime.pulled)} pulls)"
    return outcome


def test_the_task_input_is_the_message_flwr_clientapp_would_pull(train_message):
    message, context = train_message
    runtime = Runtime(message, context)
    outcome = pulled_within(runtime, 60, max_time=60.0, cancelled=threading.Event())
    pulled, pulled_context, run, _ = outcome["input"]
    assert pulled.metadata.message_id == message.object_id and runtime.confirmed == [message.object_id]
    assert pulled.content["arrays"].to_numpy_ndarrays()[0].tolist() == [0, 1, 2, 3, 4, 5]
    assert dict(pulled.content["config"]) == {"lr": 0.1} and pulled.metadata.message_type == "train"
    assert pulled_context.node_config == {"partition-id": 2} and run.run_id == 1


def test_content_that_never_comes_fails_the_task_after_the_limit_instead_of_holding_the_node(train_message):
    """The deployment flake: a ServerApp killed mid-send left a message whose content never arrived; Flower's pull
    waits up to 500 tries 10 s apart, and the node's one resident ClientApp took no other message meanwhile."""
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError

    runtime = Runtime(*train_message, available=False)
    outcome = pulled_within(runtime, 60, max_time=0.5, cancelled=threading.Event())
    assert isinstance(outcome.get("error"), ObjectPullError), outcome
    assert 0 < len(runtime.pulled) < 10 and runtime.confirmed == []


def test_a_task_the_supernode_ended_is_given_up_without_signalling_the_superexec(train_message):
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError

    runtime = Runtime(*train_message, available=False, task_alive=False)
    cancelled = threading.Event()
    beat = resident.task_heartbeat(runtime, cancelled)
    assert beat() is True and cancelled.is_set()  # Flower's raises SIGINT here: pytest would be interrupted
    outcome = pulled_within(runtime, 60, max_time=3600.0, cancelled=cancelled)
    assert isinstance(outcome.get("error"), ObjectPullError) and runtime.pulled == []


def refused(request_path: str = "/v1/runtime/send-task-heartbeat"):
    """The HTTP 401 a SuperNode's Runtime API answers for a task token it no longer accepts."""
    import httpx

    request = httpx.Request("POST", f"https://supernode:9094{request_path}")
    return httpx.HTTPStatusError("401", request=request, response=httpx.Response(401, request=request))


def test_a_refused_task_token_ends_the_call_not_the_superexec(monkeypatch):
    """Flower's HTTP retry invoker sends SIGINT to its own process on a 401 (right for a flwr-clientapp process,
    fatal for a resident SuperExec: a beat that raced the task's end once stopped a container's site); the task's
    client gives up on the call instead, and the heartbeat marks the task ended."""
    from flwr.supercore.retry import http_retry

    source = inspect.getsource(http_retry.make_simple_http_retry_invoker)
    assert "status_code == httpx.codes.UNAUTHORIZED" in source and "os.kill(os.getpid(), signal.SIGINT)" in source
    signals = []
    monkeypatch.setattr(http_retry.os, "kill", lambda pid, sig: signals.append(sig))
    monkeypatch.setattr(http_retry.time, "sleep", lambda seconds: None)  # Flower's wait for the signal to land
    retry = resident.refusal_ends_the_task(http_retry.make_simple_http_retry_invoker())
    assert retry.should_giveup(refused()) is True and signals == []
    assert http_retry.make_simple_http_retry_invoker().should_giveup(refused()) is False and signals != []  # Flower's
    import httpx

    calls = []

    def refused_call():
        calls.append(1)
        raise refused()

    with pytest.raises(httpx.HTTPStatusError):  # the call fails with its error, without retrying
        retry.invoke(refused_call)
    assert calls == [1]

    class Refusing:
        def SendTaskHeartbeat(self, request):  # noqa: N802 - the Runtime API's name
            raise refused()

    cancelled = threading.Event()
    assert resident.task_heartbeat(Refusing(), cancelled)() is True and cancelled.is_set()


def test_the_input_pull_limit_is_a_positive_number_of_seconds(monkeypatch):
    monkeypatch.delenv(resident.INPUT_PULL_ENV, raising=False)
    assert resident.configured_input_pull_max_time() == resident.INPUT_PULL_MAX_TIME
    monkeypatch.setenv(resident.INPUT_PULL_ENV, "600")
    assert resident.configured_input_pull_max_time() == 600.0
    for bad in ("0", "-5", "soon", "inf", "nan"):
        monkeypatch.setenv(resident.INPUT_PULL_ENV, bad)
        with pytest.raises(ValueError, match=f"{resident.INPUT_PULL_ENV}='{bad}': expected a positive number"):
            resident.configured_input_pull_max_time()


class Retry:
    max_tries = None


class OfflineResident(resident.ResidentExecutor):
    """The resident executor against a :class:`Runtime`, with an app that replies with its input's arrays doubled."""

    def __init__(self, runtime, **kwargs):
        super().__init__(**kwargs)
        self.runtime, self.retry = runtime, Retry()

    def connect(self, spec):
        return self.runtime, self.retry

    def _client_app(self, run, fab):
        from flwr.app import ArrayRecord, Message, RecordDict

        def app(message, context):
            doubled = [2 * a for a in message.content["arrays"].to_numpy_ndarrays()]
            return Message(RecordDict({"arrays": ArrayRecord(doubled)}), reply_to=message)

        return app


def ran(executor, seconds=60):
    """One task through the executor's worker thread, as the SuperExec launches it; fails if it is still running."""
    spec = types.SimpleNamespace(task_id=3, task_type=None)
    worker = threading.Thread(target=executor._run, args=(spec,), daemon=True)
    executor.busy.set()
    worker.start()
    worker.join(timeout=seconds)
    assert not worker.is_alive(), f"the task still ran after {seconds} s"
    return executor.runtime


def test_a_task_replies_and_reports_completed(train_message):
    from flwr.common.constant import SubStatus

    runtime = ran(OfflineResident(Runtime(*train_message)))
    assert runtime.output.sub_status == SubStatus.COMPLETED and runtime.closed
    assert runtime.pushed_message.metadata.reply_to_message_id == train_message[0].object_id
    assert len(runtime.pushed_objects) > 0


def test_a_task_whose_content_never_comes_reports_failed_and_frees_the_node(train_message):
    from flwr.common.constant import SubStatus

    executor = OfflineResident(Runtime(*train_message, available=False), input_pull_max_time=0.5)
    runtime = ran(executor)
    assert runtime.output.sub_status == SubStatus.FAILED and "ObjectPullError" in runtime.output.details
    assert runtime.pushed_message is None and runtime.closed and not executor.busy.is_set()
    assert executor.retry.max_tries == 1  # the failure is reported once, as flwr-clientapp does on exit
    assert executor.get_eligible_capacity({"clientapp"}) == ({"clientapp"}, set())  # the node takes the next task


def test_a_task_the_supernode_ended_sends_no_reply(train_message):
    from flwr.common.constant import SubStatus

    runtime = ran(OfflineResident(Runtime(*train_message, available=False, task_alive=False)))
    assert runtime.output.sub_status == SubStatus.FAILED and runtime.pushed_message is None and runtime.closed
