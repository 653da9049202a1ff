"""A long-running ClientApp per SuperNode: ``fedweigh-superexec``, Flower's SuperExec without a process per message.

In a deployment, Flower 1.41 runs every message a SuperNode receives in a new
``flwr-clientapp`` process, started by the node's SuperExec: the interpreter,
Flower, PyTorch and the app are imported again and the client's data loaded
again, for every round (``docs/benchmarks.md`` measures it). Flower keeps no
process between messages.

``fedweigh-superexec`` is ``flower-superexec`` (same arguments, same loop:
it asks the SuperNode's Runtime API for tasks, authenticated and over TLS as
configured) with one change, for Flower :data:`~fedweigh.flower.SUPPORTED_FLOWER` only: a
ClientApp task runs in this process, in a worker thread, instead of a new
``flwr-clientapp`` process. What the task does is what ``flwr-clientapp``
does (Flower's own functions pull its message, context and FAB, push the
reply and the context, send the task's heartbeats); only the process stays.
So imports happen once, and what the app caches in its modules (fedweigh's
datasets and partitions) is loaded once per FAB.

Use it with ``flower-supernode --isolation process``, in place of the
SuperExec such a node expects (``docs/deployment.md``)::

    flower-supernode ... --isolation process --runtime-api-address 127.0.0.1:9094
    fedweigh-superexec --runtime-api-address 127.0.0.1:9094 --root-certificates ca.crt

It asks for a task every :data:`TASK_POLL_INTERVAL` s unless
``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` says otherwise (Flower's own setting;
its default, 1 s, makes every message wait 0.5 s on average).

The app's code is the FAB's, as with ``flwr-clientapp``: before the first
task of a FAB, the modules of the FAB's top-level packages are dropped from
``sys.modules``, so the FAB's files are imported (a new FAB, e.g. a new
version of the app, is imported afresh). One task at a time: while one runs,
the SuperExec asks for no other. Tasks that need runtime dependency
installation, and tasks of other types, go to Flower's own subprocess
executor. A task waits at most :data:`INPUT_PULL_MAX_TIME` s for its
message's content (``FEDWEIGH_INPUT_PULL_MAX_TIME`` says otherwise), and a task
the SuperNode ends is given up, not signalled to the whole process, so one lost
message cannot hold the node. A ClientApp that crashes the interpreter (not an exception: an
exception becomes the task's error reply, as in Flower) takes this process
with it; the SuperNode then reports the task as failed, as when a
``flwr-clientapp`` process dies.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from . import supported, unsupported
from .objects import INITIAL_BACKOFF

RUNNER_MODULE = "flwr.supercore.superexec.run_superexec"
TASK_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
"""Flower's setting of how often the SuperExec asks for a task (s; Flower's default 1.0)."""
TASK_POLL_INTERVAL = "0.1"
"""fedweigh-superexec's default for it: a task waits 0.05 s on average, not 0.5 s."""
INPUT_PULL_ENV = "FEDWEIGH_INPUT_PULL_MAX_TIME"
"""fedweigh-superexec's setting of how long a task waits for its message's content (s)."""
INPUT_PULL_MAX_TIME = 120.0
"""Its default. ``flwr-clientapp`` waits up to 500 tries 10 s apart (Flower's ``PULL_MAX_TRIES_PER_OBJECT``) for
content that may never come (a ServerApp killed while it sent the message); a process per message can afford
that, but the node's one resident ClientApp would take no other message meanwhile. Raise it where a message
takes longer than this to reach the SuperNode (a large model over a slow link)."""

logger = logging.getLogger("flwr.fedweigh")


def configured_input_pull_max_time() -> float:
    """:data:`INPUT_PULL_ENV` if set (a positive number of seconds), else :data:`INPUT_PULL_MAX_TIME`."""
    raw = os.environ.get(INPUT_PULL_ENV)
    if raw is None:
        return INPUT_PULL_MAX_TIME
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{INPUT_PULL_ENV}={raw!r}: expected a positive number of seconds")
    return value


def pull_task_input(client: Any, *, max_time: float, cancelled: threading.Event) -> tuple[Any, Any, Any, Any]:
    """Flower's ``pull_task_input`` (the first step of ``flwr-clientapp``), bounded: the message, context, run, FAB.

    The message's content is pulled for at most ``max_time`` s, and no longer
    once ``cancelled`` is set (the SuperNode ended the task); either way
    Flower's ``ObjectPullError`` is raised, and the task fails.
    """
    from flwr.app import Message
    from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
    from flwr.proto.node_pb2 import Node
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest, PullTaskInputRequest
    from flwr.supercore.inflatable.inflatable_protobuf_utils import (
        make_confirm_message_received_fn_protobuf,
        make_pull_object_fn_protobuf,
    )
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError, pull_and_inflate_object_from_tree
    from flwr.supercore.task_identity import TaskIdentity

    res = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = res.task_id, res.run.run_id, res.context.node_id
    context, run, fab = context_from_proto(res.context), run_from_proto(res.run), fab_from_proto(res.fab)
    messages = client.PullMessages(PullAppMessagesRequest())
    if not messages.messages_list:
        raise RuntimeError("No messages received from Runtime API")
    node = Node(node_id=context.node_id)
    pull = make_pull_object_fn_protobuf(client.PullObject, node, context.run_id)

    def pull_unless_cancelled(object_id: str) -> bytes:
        if cancelled.is_set():
            raise ObjectPullError(object_id, "the SuperNode ended the task")
        return pull(object_id)

    tree = messages.message_object_trees[0]
    message = pull_and_inflate_object_from_tree(
        tree,
        pull_unless_cancelled,
        make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node, context.run_id),
        return_type=Message,
        max_time=max_time,
        initial_backoff=INITIAL_BACKOFF,  # the SuperNode stores the message before its content (Flower's 1 s)
    )
    message.metadata.__dict__["_message_id"] = tree.object_id  # as Flower: the deflated message lacks its own id
    return message, context, run, fab


def refusal_ends_the_task(retry: Any) -> Any:
    """Flower's HTTP retry invoker for a task's Runtime API client, except that a refused task token (HTTP 401)
    ends the call with its error: Flower's raises SIGINT, which ends a ``flwr-clientapp`` process but would end this
    SuperExec (and, in a container, leave the site without one: it exits 0, which ``restart: on-failure`` ignores).
    Returns ``retry``."""
    import httpx

    flower_gives_up = retry.should_giveup

    def gives_up(exc: Exception) -> bool:
        if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == httpx.codes.UNAUTHORIZED:
            return True
        return flower_gives_up(exc)

    retry.should_giveup = gives_up
    return retry


def task_heartbeat(client: Any, cancelled: threading.Event) -> Any:
    """Flower's task heartbeat for ``HeartbeatSender``, except that a task the SuperNode no longer accepts is
    marked ``cancelled``: Flower's raises SIGINT, which ends a ``flwr-clientapp`` process but would end this
    SuperExec."""
    import httpx
    from flwr.proto.runtime_pb2 import SendTaskHeartbeatRequest

    def beat() -> bool:
        try:
            res = client.SendTaskHeartbeat(SendTaskHeartbeatRequest())
        except httpx.TransportError:
            return False
        except httpx.HTTPStatusError as err:
            if err.response.status_code in (httpx.codes.SERVICE_UNAVAILABLE, httpx.codes.GATEWAY_TIMEOUT):
                return False
            if err.response.status_code == httpx.codes.UNAUTHORIZED:  # the task's token is no longer accepted
                cancelled.set()
                return True
            raise
        if not res.success:
            cancelled.set()
        return True

    return beat


def app_packages(app_dir: Path) -> set[str]:
    """Top-level module names a FAB's folder provides (packages and single-file modules)."""
    names = {p.name for p in app_dir.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    names |= {p.stem for p in app_dir.glob("*.py")}
    return names


def forget_modules(packages: set[str]) -> list[str]:
    """Drop ``packages`` and their submodules from ``sys.modules``; returns what was dropped."""
    dropped = [name for name in sys.modules if name.split(".", 1)[0] in packages]
    for name in dropped:
        del sys.modules[name]
    return dropped


class ResidentExecutor:
    """A SuperExec executor (Flower 1.41's ``Executor`` protocol) that runs ClientApp tasks in this process."""

    def __init__(self, input_pull_max_time: float = INPUT_PULL_MAX_TIME) -> None:
        from flwr.supercore.superexec.executor import SubprocessExecutor

        self.input_pull_max_time = input_pull_max_time
        self.fallback = SubprocessExecutor()
        self.loaded: tuple[str, Any] | None = None  # (FAB hash, its ClientApp): one FAB's modules at a time
        self.busy = threading.Event()
        self.worker: threading.Thread | None = None

    # -- the Executor protocol ---------------------------------------------------------
    def get_eligible_capacity(
        self, supported_task_types: set[Any], *, insecure: bool = False, root_certificates_path: str | None = None
    ) -> tuple[set[Any], set[str]]:
        """Everything while idle; nothing while a task runs (so no task is claimed and left waiting)."""
        return (set() if self.busy.is_set() else set(supported_task_types)), set()

    def wait_for_capacity(self, task_type: Any = None, **_: Any) -> None:
        """Until the running task, if any, is done."""
        while self.busy.is_set() and self.worker is not None:
            self.worker.join(timeout=1.0)

    def launch(self, spec: Any) -> Any:
        """Run a ClientApp task in a worker thread of this process; anything else as Flower does."""
        from flwr.supercore.constant import TaskType
        from flwr.supercore.superexec.executor import LaunchResult

        if spec.task_type != TaskType.CLIENT_APP or spec.runtime_dependency_install:
            return self.fallback.launch(spec)
        if self.busy.is_set():
            return LaunchResult.capacity_rejected("a ClientApp task is running in the resident process")
        self.busy.set()
        self.worker = threading.Thread(
            target=self._run, args=(spec,), name=f"clientapp-task-{spec.task_id}", daemon=True
        )
        self.worker.start()
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        """Nothing to maintain: one process, one worker thread at a time."""

    def close(self) -> None:
        """Wait briefly for a running task (its reply may still go out)."""
        if self.worker is not None:
            self.worker.join(timeout=5.0)

    # -- one task, as flwr-clientapp runs it -------------------------------------------
    def _run(self, spec: Any) -> None:
        try:
            self.run_task(spec)
        except Exception:  # noqa: BLE001 - a task's failure must not end the SuperExec's loop
            logger.exception("[fedweigh] resident ClientApp task %d could not be run", spec.task_id)
        finally:
            self.busy.clear()

    def connect(self, spec: Any) -> tuple[Any, Any]:
        """The task's Runtime API client, as ``flwr-clientapp`` makes it, and the client's retry invoker."""
        from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
        from flwr.supercore.retry import make_simple_http_retry_invoker
        from flwr.supercore.runtime import RuntimeHttpClient
        from flwr.supercore.runtime.tracing import RuntimeTracingInterceptor
        from flwr.supercore.tls import validate_and_resolve_root_certificates

        retry = refusal_ends_the_task(make_simple_http_retry_invoker())
        client = RuntimeHttpClient.from_server_address(
            server_address=spec.runtime_api_address,
            insecure=spec.insecure,
            root_certificates=validate_and_resolve_root_certificates(spec.root_certificates_path, spec.insecure),
            interceptors=[
                RuntimeTracingInterceptor(),
                RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                RuntimeTokenHttpInterceptor(spec.token),
            ],
            retry_invoker=retry,
        )
        return client, retry

    def run_task(self, spec: Any) -> None:
        """Pull the task's input, run the app, push the reply and the context (Flower's functions)."""
        from flwr.app import Message
        from flwr.app.error import Error
        from flwr.clientapp.client_app import LoadClientAppError
        from flwr.common.constant import ErrorCode, SubStatus
        from flwr.supercore.heartbeat import HeartbeatSender
        from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

        client, retry = self.connect(spec)
        cancelled = threading.Event()
        heartbeat = HeartbeatSender(task_heartbeat(client, cancelled))
        started = time.monotonic()
        message = context = reply = None
        sub_status, details = SubStatus.FAILED, "ClientApp task failed due to unknown reason"
        try:
            heartbeat.start()
            message, context, run, fab = pull_task_input(client, max_time=self.input_pull_max_time, cancelled=cancelled)
            app = self._client_app(run, fab)
            reply = app(message=message, context=context)
            sub_status, details = SubStatus.COMPLETED, ""
            logger.info(
                "[fedweigh] resident ClientApp task %d (%s) done in %.2fs in process %d",
                spec.task_id,
                message.metadata.message_type,
                time.monotonic() - started,
                os.getpid(),
            )
        except Exception as err:  # noqa: BLE001 - as flwr-clientapp: the error goes back as the reply
            code = ErrorCode.CLIENT_APP_RAISED_EXCEPTION
            reason = f"{type(err)}:<'{err}'>"
            if isinstance(err, LoadClientAppError):
                code, reason = ErrorCode.LOAD_CLIENT_APP_EXCEPTION, "An exception was raised when loading `ClientApp`"
            logger.exception("[fedweigh] the ClientApp raised an exception")
            details = reason
            if message is not None:
                reply = Message(Error(code=code, reason=reason), reply_to=message)
        finally:
            try:
                if reply is not None and context is not None and not cancelled.is_set():
                    push_message(client, reply, context)
            finally:
                if heartbeat.is_running:  # before the task's end: a beat after it would be refused (HTTP 401)
                    heartbeat.stop()
                retry.max_tries = 1  # as flwr-clientapp on exit: the task's end is reported once, not retried forever
                try:
                    push_task_output(client=client, context=context, sub_status=sub_status, details=details)
                finally:
                    client.close()

    def _client_app(self, run: Any, fab: Any) -> Any:
        """The FAB's ClientApp, installed and imported on its first task, then kept."""
        if self.loaded is not None and self.loaded[0] == fab.hash_str:
            return self.loaded[1]
        from flwr.cli.install import install_from_fab
        from flwr.clientapp.utils import get_load_client_app_fn
        from flwr.common.config import get_project_dir

        install_from_fab(fab.content, skip_prompt=True)
        app_dir = Path(get_project_dir(run.fab_id, run.fab_version, fab.hash_str))
        dropped = forget_modules(app_packages(app_dir))  # import the FAB's code, not what is loaded already
        app = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)(
            run.fab_id, run.fab_version, fab.hash_str
        )
        logger.info(
            "[fedweigh] resident ClientApp of FAB %s loaded from %s (%d modules imported afresh)",
            fab.hash_str[:12],
            app_dir,
            len(dropped),
        )
        self.loaded = (fab.hash_str, app)  # an older FAB's app goes: its modules are gone from sys.modules
        return app


def install(
    executor: ResidentExecutor | None = None, *, input_pull_max_time: float = INPUT_PULL_MAX_TIME
) -> ResidentExecutor:
    """Make Flower's SuperExec loop in this process use a :class:`ResidentExecutor` (``executor``, or a new one
    that waits ``input_pull_max_time`` s at most for a message's content); returns it."""
    import importlib

    if not supported():
        raise RuntimeError(unsupported("fedweigh-superexec", "flower-superexec (a ClientApp process per message)"))
    runner = importlib.import_module(RUNNER_MODULE)
    resident = executor or ResidentExecutor(input_pull_max_time)

    def get_executor(executor_type: Any, executor_config: Any = None, **_: Any) -> ResidentExecutor:
        from flwr.supercore.constant import ExecutorType

        if executor_type != ExecutorType.SUBPROCESS or executor_config:
            raise ValueError("fedweigh-superexec runs ClientApps in its own process: --executor subprocess only")
        return resident

    runner.get_executor = get_executor
    return resident


def main() -> None:
    """``fedweigh-superexec``: ``flower-superexec``'s command line, with ClientApp tasks run in this process."""
    from flwr.supercore.cli.flower_superexec import flower_superexec

    os.environ.setdefault(TASK_POLL_ENV, TASK_POLL_INTERVAL)  # set it to choose another
    sys.argv[0] = "fedweigh-superexec"  # Flower's CLI names itself after it (python -m in the image)
    try:
        install(input_pull_max_time=configured_input_pull_max_time())
    except (RuntimeError, ValueError) as err:
        print(f"fedweigh-superexec: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    logging.getLogger("flwr.fedweigh").setLevel(logging.INFO)
    flower_superexec()


if __name__ == "__main__":  # python -m fedweigh_flower.resident (the container image's copy imports only Flower)
    main()
