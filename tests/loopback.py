"""A federation inside the test process: the real ServerApp and ClientApp, no SuperLink, no Ray.

:func:`run_in_process` calls the ServerApp's ``main`` with a :class:`LoopbackGrid`,
which hands every message straight to the ClientApp of its destination node,
each node with its own ``Context`` (node config, state) and a random node id,
as a SuperLink gives them. Every message, out and back, is serialised to
Flower's protobuf and read back, so a client sees a copy of what it would
receive over the network, and the server a copy of what it would get back. A
ClientApp that raises answers with an error reply, as Flower's runtime does.

What it leaves out is Flower's transport (the SuperLink, the simulation
engine, Ray, processes): the real ``flwr run`` tests (``test_simulation.py``,
``test_deployment.py``) cover that. What it keeps is everything of fedweigh,
end to end, at a second or two per run, so every strategy and every rule can
be run end to end on every change.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from fedweigh.launch.runconfig import load_app_config

REPO = Path(__file__).resolve().parents[1]


def over_the_wire(message: Message) -> Message:
    """A copy of ``message`` as the other side would receive it."""
    return message_from_proto(message_to_proto(message))


class LoopbackGrid(Grid):
    """Nodes in this process; ``send_and_receive`` runs each message through its node's ClientApp.

    Parameters
    ----------
    client_app : ClientApp
    run_config : Mapping
        The full run config (both apps get the same one).
    num_nodes : int
        Nodes ``partition-id = 0 .. num_nodes - 1`` of ``num-partitions = num_nodes``.
    seed : int
        Seeds the node ids (random 63-bit numbers, like a SuperLink's).
    """

    def __init__(self, client_app: ClientApp, run_config: Mapping[str, Any], num_nodes: int, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.client_app = client_app
        self.contexts: dict[int, Context] = {}
        for partition in range(num_nodes):
            node = rng.getrandbits(63)
            config = {"partition-id": partition, "num-partitions": num_nodes}
            self.contexts[node] = Context(
                run_id=1, node_id=node, node_config=config, state=RecordDict(), run_config=dict(run_config)
            )
        self.sent: list[Message] = []

    def set_run(self, run: Any) -> None:  # pragma: no cover - not used by a ServerApp
        pass

    @property
    def run(self) -> Any:  # pragma: no cover - not used by a ServerApp
        return None

    def create_message(self, *args: Any, **kwargs: Any) -> Message:  # pragma: no cover - deprecated in Flower
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:  # pragma: no cover
        raise NotImplementedError("the loopback grid answers in send_and_receive")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:  # pragma: no cover
        raise NotImplementedError("the loopback grid answers in send_and_receive")

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Each message through its node's ClientApp, one at a time; a reply later than ``timeout`` is lost.

        Clients run one after another here, but a round's clients run side by
        side in a federation, so the timeout applies to each client's own time:
        a ClientApp still busy after ``timeout`` seconds is left to finish in
        its thread, and its reply never arrives, as with Flower's grid.
        """
        replies = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            self.sent.append(message)
            received = over_the_wire(message)
            answer: list[Message] = []
            worker = threading.Thread(target=self._answer, args=(received, answer), daemon=True)
            worker.start()
            worker.join(timeout)
            if answer:
                replies.append(over_the_wire(answer[0]))
        return replies

    def _answer(self, received: Message, answer: list[Message]) -> None:
        try:
            reply = self.client_app(received, self.contexts[received.metadata.dst_node_id])
        except Exception as err:  # noqa: BLE001 - Flower's runtime turns this into an error reply
            reply = Message(
                Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, f"{type(err).__name__}: {err}"), reply_to=received
            )
        answer.append(reply)


def full_run_config(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The app's defaults with ``overrides``, as Flower hands them to both apps."""
    return {**load_app_config(REPO), **overrides}


def run_in_process(overrides: Mapping[str, Any], num_nodes: int = 4, node_seed: int = 0) -> Path:
    """Run the ServerApp and ClientApp in this process; returns the run folder (``output-dir``/``run-name``)."""
    from fedweigh.client_app import app as client_app
    from fedweigh.server_app import main

    # A ServerApp process has an identity; messages it creates take their sender from it.
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    run_config = full_run_config(overrides)
    grid = LoopbackGrid(client_app, run_config, num_nodes, seed=node_seed)
    main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    return Path(run_config["output-dir"]) / str(run_config["run-name"])
