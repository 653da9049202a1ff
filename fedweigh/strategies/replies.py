"""Checking client replies before they reach the global model.

A reply enters aggregation only if it carries exactly one ArrayRecord whose
tensors match the global model (names, shapes, dtypes) and are finite, and one
MetricRecord with ``num-examples`` >= 1, a valid ``train_loss`` and every
signal the rule needs, each passing its check
(:data:`fedweigh.methods.catalog.SIGNALS`). A reply says which round's global model
it trained (``model-round``; a reply without it, such as a plain Flower
client's, is taken as trained on this round's model); one from a later round,
or older than the strategy accepts, is left out too, and so is a second reply
to the same instruction (only the first counts). A reply that fails is
left out of the round with a logged warning naming the node and the reason; it
never touches the global model.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Message
from flwr.common.constant import ErrorCode

from fedweigh.arrays import decode
from fedweigh.methods.catalog import SIGNALS
from fedweigh.protocol import MODEL_ROUND, NUM_EXAMPLES, PARTITION_ID, TRAIN_LOSS, SignalCheck
from fedweigh.strategies.averaging import all_finite

logger = logging.getLogger("flwr.fedweigh")  # propagates to Flower's log handlers


@dataclass
class ClientReply:
    """One valid training reply, decoded.

    ``model_round`` is the round whose global model the client trained;
    it is older than the current round for a stale reply.
    """

    node_id: int
    partition_id: int
    num_examples: int
    train_loss: float
    signals: dict[str, float]
    arrays: dict[str, np.ndarray] = field(repr=False)
    reported: dict[str, float] = field(default_factory=dict)  # other scalar metrics, kept for the record
    model_round: int = 0


def _readable(reason: str) -> str:
    """An error reply's reason on one line, without terminal colour codes (Ray wraps a ClientApp's error in both)."""
    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", reason).split())


class InvalidReply(ValueError):
    """Why a reply was left out."""


def _metric(metrics: Mapping, key: str, check: SignalCheck) -> float:
    if key not in metrics:
        raise InvalidReply(f"metric '{key}' is missing")
    value = metrics[key]
    if isinstance(value, list | bool):
        raise InvalidReply(f"metric '{key}' = {value!r} must be one number")
    value = float(value)
    if not check(value):
        raise InvalidReply(f"metric '{key}' = {value!r} fails the {check.__name__} check")
    return value


def _model_round(metrics: Mapping, server_round: int, oldest_round: int) -> int:
    value = metrics.get(MODEL_ROUND, server_round)
    if isinstance(value, list | bool) or float(value) != int(value):
        raise InvalidReply(f"metric '{MODEL_ROUND}' = {value!r} must be a round number")
    model_round = int(value)
    if model_round > server_round:
        raise InvalidReply(f"it trained the model of round {model_round}, which round {server_round} never sent")
    if model_round < oldest_round:
        raise InvalidReply(
            f"it trained the model of round {model_round}, {server_round - model_round} round(s) old; "
            f"accepted: models at most {server_round - oldest_round} round(s) old (setting max-staleness)"
        )
    return model_round


def check_reply(
    message: Message,
    reference: Mapping[str, np.ndarray],
    signals: Iterable[str],
    server_round: int = 0,
    oldest_round: int | None = None,
) -> ClientReply:
    """Decode and check one reply against the global model ``reference``.

    Parameters
    ----------
    signals : iterable of str
        The signals the rule needs (checks from :data:`fedweigh.methods.catalog.SIGNALS`).
    server_round, oldest_round : int
        The current round, and the oldest round whose model a reply may have
        trained (default: the current round only).

    Raises
    ------
    InvalidReply
        Saying what is wrong.
    """
    if message.has_error():
        if message.error.code == ErrorCode.NODE_UNAVAILABLE:
            raise InvalidReply(f"the node left the federation during the round ({message.error.reason})")
        raise InvalidReply(f"the ClientApp failed: {_readable(message.error.reason)}")
    content = message.content
    if len(content.array_records) != 1 or len(content.metric_records) != 1:
        raise InvalidReply(
            f"expected one ArrayRecord and one MetricRecord, got {len(content.array_records)} "
            f"and {len(content.metric_records)}"
        )
    metrics = next(iter(content.metric_records.values()))
    num_examples = _metric(metrics, NUM_EXAMPLES, SIGNALS[TRAIN_LOSS].check)
    if num_examples < 1:
        raise InvalidReply(f"metric '{NUM_EXAMPLES}' = {num_examples} must be >= 1")
    train_loss = _metric(metrics, TRAIN_LOSS, SIGNALS[TRAIN_LOSS].check)
    values = {key: _metric(metrics, key, SIGNALS[key].check) for key in signals}
    model_round = _model_round(metrics, server_round, server_round if oldest_round is None else oldest_round)

    arrays = decode(next(iter(content.array_records.values())))
    if list(arrays) != list(reference):
        missing = sorted(set(reference) - set(arrays))
        extra = sorted(set(arrays) - set(reference))
        raise InvalidReply(f"model tensors differ from the global model (missing {missing}, unexpected {extra})")
    for name, value in arrays.items():
        if value.shape != reference[name].shape:
            raise InvalidReply(f"tensor '{name}' has shape {value.shape}, expected {reference[name].shape}")
        if value.dtype != reference[name].dtype:
            raise InvalidReply(f"tensor '{name}' has dtype {value.dtype}, expected {reference[name].dtype}")
    if not all_finite(arrays):
        raise InvalidReply("model tensors contain NaN or infinite values")
    return ClientReply(
        node_id=message.metadata.src_node_id,
        partition_id=int(metrics.get(PARTITION_ID, -1)),
        num_examples=int(num_examples),
        train_loss=train_loss,
        signals=values,
        arrays=arrays,
        reported={
            key: float(value)
            for key, value in metrics.items()
            if key not in values
            and key not in (NUM_EXAMPLES, TRAIN_LOSS, PARTITION_ID, MODEL_ROUND)
            and isinstance(value, int | float)
            and not isinstance(value, bool)
        },
        model_round=model_round,
    )


def reply_origin(message: Message, origin: Mapping[str, int]) -> int:
    """The node a reply stands for.

    Usually its sender. When a node stops sending heartbeats (it crashed or
    lost its network), the SuperLink answers in its place with an error reply
    whose sender is the SuperLink itself; ``origin`` (instruction message id
    to destination node) then names the node that went away.
    """
    return origin.get(message.metadata.reply_to_message_id, message.metadata.src_node_id)


def valid_replies(
    server_round: int,
    messages: Iterable[Message],
    reference: Mapping[str, np.ndarray],
    signals: Iterable[str],
    origin: Mapping[str, int] | None = None,
    oldest_round: int | None = None,
) -> tuple[list[ClientReply], dict[int, str]]:
    """Split replies into valid ones and ``{node_id: reason}`` for the rest.

    ``origin`` maps the id of each instruction sent this round to its
    destination node (see :func:`reply_origin`); ``oldest_round`` is the
    oldest round whose model a reply may have trained.
    """
    signals = tuple(signals)
    accepted: list[ClientReply] = []
    rejected: dict[int, str] = {}
    answered: set[str] = set()
    for message in messages:
        instruction = message.metadata.reply_to_message_id
        if instruction and instruction in answered:
            node = reply_origin(message, origin or {})
            rejected[node] = "a second reply to the same instruction; only the first counts"
            logger.warning("round %d: left out a reply of node %d: %s", server_round, node, rejected[node])
            continue
        answered.add(instruction)
        try:
            accepted.append(check_reply(message, reference, signals, server_round, oldest_round))
        except InvalidReply as reason:
            node = reply_origin(message, origin or {})
            rejected[node] = str(reason)
            logger.warning("round %d: left out node %d: %s", server_round, node, reason)
    return accepted, rejected
