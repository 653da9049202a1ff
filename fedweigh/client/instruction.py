"""What a fedweigh strategy asks of your ClientApp, and the reply it reads.

:class:`Instruction` reads a train message of any strategy of
:mod:`fedweigh.strategies`: the round, the client steps it asks for (``oui``,
``ufl``, ``asw``, ``ood-score``), their options with the values the server
chose, and FLood's λ of the round. :func:`train_reply` builds the reply the
strategy checks: your model, ``num-examples``, ``train_loss``, the round the
model was trained from (``model-round``, for asynchronous runs) and the
signals; a reply without what the strategy needs is left out of the round
and logged on the server, never aggregated.

Example (a FedOUI client)::

    @app.train()
    def train(message, context):
        instruction = Instruction.of(message)
        model.load_state_dict(message.content["arrays"].to_torch_state_dict())
        loss = my_training_loop(model, trainloader)
        signals = oui_signal(model, probe[: instruction.oui.probe_size], layer="fc2")
        return train_reply(message, model, num_examples=len(trainset), train_loss=loss, signals=signals)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from torch import nn

from fedweigh.methods.catalog import OPTION_TABLES
from fedweigh.methods.flood.protocol import ASW_LAMBDA
from fedweigh.options import OptionsTable
from fedweigh.protocol import (
    ARRAYS,
    CLIENT_STEPS,
    CONFIG,
    METRICS,
    MODEL_ROUND,
    NUM_EXAMPLES,
    PARTITION_ID,
    SERVER_ROUND,
    TRAIN_LOSS,
    recipe_key,
    table_from_config,
)


@dataclass(frozen=True)
class Instruction:
    """A train message's instruction, as a strategy of :mod:`fedweigh.strategies` sends it.

    Attributes
    ----------
    server_round : int
        The round whose global model the message carries (0 if it does not say).
    steps : tuple of str
        The client steps asked for, in order.
    config : Mapping
        Every entry of the message's ConfigRecord.
    """

    server_round: int
    steps: tuple[str, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, message: Message) -> Instruction:
        """The instruction of a train ``message`` (any Flower message: what it lacks is empty)."""
        records = message.content.config_records
        config = dict(records[CONFIG] if CONFIG in records else next(iter(records.values()), {}))
        return cls(int(config.get(SERVER_ROUND, 0)), tuple(config.get(CLIENT_STEPS, [])), config)

    def asks(self, step: str) -> bool:
        """True if the strategy asks for client step ``step`` (``oui``, ``ufl``, ``asw``, ``ood-score``)."""
        return step in self.steps

    def options(self, table: str) -> OptionsTable:
        """A method's options table as the instruction carries it, the defaults where it has none.

        ``instruction.options("oui")``, or as an attribute: ``instruction.oui``,
        ``instruction.ufl``, ``instruction.flood`` (any table of
        :data:`fedweigh.methods.catalog.OPTION_TABLES`).
        """
        if table not in OPTION_TABLES:
            raise KeyError(f"no options table {table!r}; accepted: {', '.join(sorted(OPTION_TABLES))}")
        return table_from_config(table, OPTION_TABLES[table], self.config)

    def __getattr__(self, name: str) -> Any:
        table = name.replace("_", "-")
        if table in OPTION_TABLES:
            return self.options(table)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def asw_lambda(self) -> float:
        """FLood's λ(t) for this round's ASW; the instruction of a FLood strategy always carries it."""
        if ASW_LAMBDA not in self.config:
            raise ValueError(f"the instruction carries no {ASW_LAMBDA!r}: it was not sent by a FLood strategy")
        return float(self.config[ASW_LAMBDA])

    @property
    def proximal_mu(self) -> float:
        """FedProx's μ (0 when the strategy adds no proximal term)."""
        return float(self.config.get(recipe_key("proximal_mu"), 0.0))


def train_reply(
    message: Message,
    model: nn.Module | Mapping[str, torch.Tensor] | ArrayRecord,
    *,
    num_examples: int,
    train_loss: float,
    signals: Mapping[str, float] | None = None,
    partition_id: int | None = None,
    metrics: Mapping[str, float] | None = None,
) -> Message:
    """The reply to a train ``message`` that a strategy of :mod:`fedweigh.strategies` reads.

    Parameters
    ----------
    model : nn.Module, state dict or ArrayRecord
        The trained model (a module's ``state_dict()`` is sent).
    num_examples : int
        Training samples (the weight of sample-count rules).
    train_loss : float
        Mean training loss of the round (FedNolowe's signal).
    signals : Mapping, optional
        What :mod:`fedweigh.client.signals` measured (``oui``, ``uncertainty``, ``ood-score``, ...).
    partition_id : int, optional
        This client's partition, for strategies that sample by partition.
    metrics : Mapping, optional
        Anything else to report (kept in the round's record).
    """
    if isinstance(model, nn.Module):
        arrays = ArrayRecord(model.state_dict())
    elif isinstance(model, ArrayRecord):
        arrays = model
    else:
        arrays = ArrayRecord(dict(model))
    values: dict[str, Any] = {NUM_EXAMPLES: int(num_examples), TRAIN_LOSS: float(train_loss)}
    server_round = Instruction.of(message).server_round
    if server_round:
        values[MODEL_ROUND] = server_round
    if partition_id is not None:
        values[PARTITION_ID] = int(partition_id)
    values.update({key: float(value) for key, value in (metrics or {}).items()})
    values.update({key: float(value) for key, value in (signals or {}).items()})
    return Message(RecordDict({ARRAYS: arrays, METRICS: MetricRecord(values)}), reply_to=message)
