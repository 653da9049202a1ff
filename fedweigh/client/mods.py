"""Flower mods that add a method's signal to every train reply, measured on the model the reply carries.

FedOUI's OUI and FLood's φ are measured after training, on the trained
model: nothing in them depends on how the model was trained. As a mod they
need no change to the train handler::

    app = ClientApp(mods=[oui_mod(Net, probe=probe_images, layer="fc2")])  # fedweigh.client.oui_mod

The mod runs only for train messages whose instruction asks for its step
(``client-steps`` of a :mod:`fedweigh.strategies` strategy), and only on a
successful reply; it loads the reply's arrays into a model of its own
(``model_fn()``, built once) and adds the signal to the reply's metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flwr.app import Context, Message, MessageType
from flwr.clientapp.typing import ClientAppCallable, Mod
from torch import nn

from fedweigh.client.instruction import Instruction
from fedweigh.client.signals import Signals
from fedweigh.protocol import ARRAYS, METRICS


def signal_mod(
    step: str, model_fn: Callable[[], nn.Module], measure: Callable[[nn.Module, Instruction], Signals]
) -> Mod:
    """A mod adding ``measure(trained model, instruction)`` to each train reply whose instruction asks for ``step``."""
    built: list[nn.Module] = []

    def mod(message: Message, context: Context, call_next: ClientAppCallable) -> Message:
        reply = call_next(message, context)
        instruction = Instruction.of(message)
        if message.metadata.message_type != MessageType.TRAIN or reply.has_error() or not instruction.asks(step):
            return reply
        if not built:
            built.append(model_fn())
        model = built[0]
        model.load_state_dict(_record(reply.content.array_records, ARRAYS).to_torch_state_dict())
        metrics = _record(reply.content.metric_records, METRICS)
        for key, value in measure(model, instruction).items():
            metrics[key] = float(value)
        return reply

    return mod


def _record(records: Mapping[str, Any], key: str) -> Any:
    """The record ``key`` of a reply, else its only one (a ClientApp may name its records otherwise)."""
    if key in records:
        return records[key]
    if len(records) != 1:
        raise ValueError(f"the reply has no record {key!r} and not exactly one to use instead: {list(records)}")
    return next(iter(records.values()))
