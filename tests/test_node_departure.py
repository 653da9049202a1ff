"""A node that leaves mid-round is left out under its own partition, and the round goes on.

On a real federation the grid gives every instruction a message id. When a
SuperNode stops sending heartbeats, the SuperLink answers in its place with a
``NODE_UNAVAILABLE`` error whose sender is the SuperLink itself; a node that
never answers before the round's timeout sends nothing at all. Both must be
recorded against the node that was sampled, not against the SuperLink.
"""

from __future__ import annotations

import time

import numpy as np
from conftest import FakeGrid
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, Metadata, MetricRecord, RecordDict
from flwr.app.message.message import make_message
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

from fedweigh.rules.base import SampleCountRule
from fedweigh.strategies.base import WeightedFedAvg

PARTITIONS = {1000 + i: i for i in range(4)}


def weights(seed: int) -> dict[str, np.ndarray]:
    return {"fc.weight": np.random.default_rng(seed).normal(size=(3, 2)).astype(np.float32)}


def answer(instruction: Message, sender: int, *, error: Error | None = None, size: int = 10) -> Message:
    """A reply to ``instruction`` as the grid hands it to the strategy."""
    metadata = Metadata(
        run_id=1,
        message_id=f"reply-{instruction.metadata.message_id}",
        src_node_id=sender,
        dst_node_id=0,
        reply_to_message_id=instruction.metadata.message_id,
        group_id="1",
        created_at=time.time(),
        ttl=3600,
        message_type="train",
    )
    if error is not None:
        return make_message(metadata=metadata, error=error)
    node = instruction.metadata.dst_node_id
    content = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(v) for k, v in weights(node).items()}),
            "metrics": MetricRecord({"num-examples": size, "train_loss": 0.5, "partition-id": PARTITIONS[node]}),
        }
    )
    return make_message(metadata=metadata, content=content)


def sent_round(strategy: WeightedFedAvg) -> dict[int, Message]:
    """Configure round 1 on all four nodes; give each instruction an id, as a real grid does."""
    initial = ArrayRecord({k: Array(v) for k, v in weights(0).items()})
    instructions = list(strategy.configure_train(1, initial, ConfigRecord(), FakeGrid(PARTITIONS)))
    for message in instructions:
        message.metadata.__dict__["_message_id"] = f"instruction-{message.metadata.dst_node_id}"
    return {message.metadata.dst_node_id: message for message in instructions}


def test_departed_and_silent_nodes_are_left_out_under_their_partitions(caplog):
    strategy = WeightedFedAvg(SampleCountRule(), fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    sent = sent_round(strategy)
    unavailable = Error(code=ErrorCode.NODE_UNAVAILABLE, reason="Error: Node Unavailable")
    replies = [
        answer(sent[1000], 1000),
        answer(sent[1001], 1001, size=30),
        answer(sent[1002], SUPERLINK_NODE_ID, error=unavailable),  # node 1002 crashed
        # node 1003: nothing came back before the timeout
    ]
    with caplog.at_level("WARNING", logger="flwr.fedweigh"):
        arrays, metrics = strategy.aggregate_train(1, replies)

    record = strategy.records[1]
    assert arrays is not None and metrics["num-clients"] == 2 and metrics["num-left-out"] == 2
    assert [client["partition"] for client in record.clients] == [0, 1]
    assert [client["weight"] for client in record.clients] == [0.25, 0.75]
    assert set(record.left_out) == {"2", "3"}  # not "1", the SuperLink's own node id
    assert "left the federation" in record.left_out["2"]
    assert "no reply" in record.left_out["3"]
    assert "left out node 1002: the node left the federation" in caplog.text
    assert "left out node 1003: no reply" in caplog.text


def test_a_complete_round_leaves_nobody_out():
    strategy = WeightedFedAvg(SampleCountRule(), fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    sent = sent_round(strategy)
    _, metrics = strategy.aggregate_train(1, [answer(message, node) for node, message in sent.items()])
    assert metrics["num-clients"] == 4 and metrics["num-left-out"] == 0
    assert strategy.records[1].left_out == {}
