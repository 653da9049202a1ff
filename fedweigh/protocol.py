"""The message format between the ServerApp and the ClientApp, written once.

Everything a server and a client must agree on lives here and nowhere else:

* the **record keys** of a message (``arrays``, ``config``, ``metrics``);
* the **train instruction**: a :class:`TrainRecipe` (how to train this round),
  the client steps to run, the server round, and each step's options;
* the **reply**: the metric keys every train reply carries (``num-examples``,
  ``train_loss``, ``partition-id``, ``model-round``, ...);
* the **signals**: what a client measures for a weighting rule, which client
  step produces it, and which values are valid (:class:`Signal`);
* the **client steps**: the signals each produces and the run-config
  table holding its options (:class:`StepSpec`);

each method declares its own signals, steps and options tables in its
package (``fedweigh/methods/<method>/protocol.py``), and
:mod:`fedweigh.methods.catalog` gathers them;
* the keys of a node's config and of its answer to the server's ``query``.

A step's options travel under their run-config keys (``oui.probe-size``):
:func:`table_entries` writes a settings table into a train config and
:func:`table_from_config` reads it back, so the two sides cannot spell a key
differently.

Example
-------
>>> recipe = TrainRecipe(local_epochs=2, learning_rate=0.01)
>>> config = recipe.to_config()
>>> config["local-epochs"], config["learning-rate"]
(2, 0.01)
>>> TrainRecipe.from_config(config) == recipe
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from pydantic import BaseModel

# ---------------------------------------------------------------------------
# records of a message
# ---------------------------------------------------------------------------

ARRAYS = "arrays"
"""The ArrayRecord of a message: the global model out, the trained model back."""
CONFIG = "config"
"""The ConfigRecord of an instruction."""
METRICS = "metrics"
"""The MetricRecord of a reply."""

# ---------------------------------------------------------------------------
# the train instruction
# ---------------------------------------------------------------------------

SERVER_ROUND = "server-round"
"""The round an instruction belongs to (and whose global model it carries)."""
CLIENT_STEPS = "client-steps"
"""Names of the client steps to run, in order (see :data:`fedweigh.methods.catalog.STEPS`)."""
FROZEN_DIGEST = "frozen-digest"
"""Hash of the model's frozen part (a pretrained body under LoRA), which never travels: a client whose
own differs refuses the instruction. Absent when every tensor trains (and travels)."""

ConfigValue = int | float | str | bool | list[str] | list[int] | list[float]


def dashed(name: str) -> str:
    """A Python name as a run-config key: ``local_epochs`` -> ``local-epochs``."""
    return name.replace("_", "-")


@dataclass(frozen=True)
class TrainRecipe:
    """How a client trains in one round; the server sends it in every train instruction.

    Each field travels under its dashed name (``local-epochs``). The run
    settings of the same names (:class:`fedweigh.settings.Settings`) hold the
    values; the server may change some per round (the learning rate under
    ``lr-decay``) and per method (``proximal-mu`` is 0 unless the strategy is
    FedProx).
    """

    local_epochs: int = 3
    batch_size: int = 32
    optimizer: str = "sgd"
    learning_rate: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    proximal_mu: float = 0.0
    persist_optimizer_state: bool = False
    mixed_precision: str = "off"

    def to_config(self) -> dict[str, ConfigValue]:
        """The recipe as train-config entries."""
        return {dashed(f.name): getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TrainRecipe:
        """Read a recipe from a train config; a missing entry names its key."""
        missing = [dashed(f.name) for f in fields(cls) if dashed(f.name) not in config]
        if missing:
            raise ValueError(f"the train config lacks {missing}; it was not sent by a fedweigh strategy")
        return cls(**{f.name: _typed(config[dashed(f.name)], f.type) for f in fields(cls)})

    @classmethod
    def from_settings(cls, settings: Any, **changes: Any) -> TrainRecipe:
        """The recipe named by run settings (attributes of the same names), with ``changes``."""
        values = {f.name: getattr(settings, f.name) for f in fields(cls) if f.name not in changes}
        return cls(**values, **changes)


def recipe_key(field_name: str) -> str:
    """The config key of a :class:`TrainRecipe` field (``learning_rate`` -> ``learning-rate``).

    >>> recipe_key("learning_rate")
    'learning-rate'
    """
    if field_name not in {f.name for f in fields(TrainRecipe)}:
        raise KeyError(f"TrainRecipe has no field {field_name!r}")
    return dashed(field_name)


def _typed(value: Any, annotation: str) -> Any:
    converters: dict[str, Callable[[Any], Any]] = {"int": int, "float": float, "str": str, "bool": bool}
    return converters[annotation](value)


# ---------------------------------------------------------------------------
# the reply
# ---------------------------------------------------------------------------

NUM_EXAMPLES = "num-examples"
"""Training samples of the client (train reply), or evaluation samples (evaluate reply)."""
TRAIN_LOSS = "train_loss"
"""Mean plain cross-entropy of local training (see :mod:`fedweigh.client.training`)."""
PARTITION_ID = "partition-id"
"""The client's data partition; -1 for a site without one. Also a node-config key."""
MODEL_ROUND = "model-round"
"""The server round whose global model the client trained (its instruction's ``server-round``)."""
TRAIN_SECONDS = "train-seconds"
"""Wall time of local training."""
TRAIN_CPU_SECONDS = "train-cpu-seconds"
"""CPU time the training thread used in local training (``time.thread_time``): with one torch thread all of
training's computing, so ``train-seconds`` less this is time the thread waited (for a CPU core, for the GIL);
torch's other threads (``torch.set_num_threads`` above 1) and a GPU's work are not in it."""
MC_SECONDS = "mc-seconds"
"""Wall time of UFL's MC-dropout passes."""
CLIENT_SECONDS = "client-seconds"
"""Wall time of the ClientApp's train handler, from its start to the reply built (training and client steps
included; what carries the message to and from the ClientApp is not): the round's wait for replies less this
is the transport (``fedweigh benchmark overhead``)."""
TIMING_KEYS = (TRAIN_SECONDS, TRAIN_CPU_SECONDS, MC_SECONDS, CLIENT_SECONDS)
"""Reply metrics that measure wall time: the only ones that differ between two runs of one config and seed."""
EVAL_LOSS = "eval_loss"
EVAL_ACCURACY = "eval_acc"

REPLY_KEYS = (NUM_EXAMPLES, TRAIN_LOSS, PARTITION_ID, MODEL_ROUND)
"""Metric keys every train reply carries besides the signals."""

# ---------------------------------------------------------------------------
# the node
# ---------------------------------------------------------------------------

NUM_PARTITIONS = "num-partitions"
"""Node-config key and ``query`` reply: how many partitions the federation has."""
DATA_DIR = "data-dir"
"""Node-config key of a site that holds its own data folder."""
FAULT = "fault"
"""Train-config key: the fault this client commits (runs with ``[faults]`` only; :mod:`fedweigh.faults`)."""
TRAIN_DELAY = "train-delay"
"""Node-config key: seconds a node waits after training before it replies, as a slow device would (for testing)."""


# ---------------------------------------------------------------------------
# signals
# ---------------------------------------------------------------------------


def finite(value: float) -> bool:
    """Any finite value (OOD scores can be negative)."""
    return bool(math.isfinite(value))


def finite_non_negative(value: float) -> bool:
    """A finite value >= 0 (losses, uncertainties)."""
    return bool(math.isfinite(value) and value >= 0)


def in_unit_interval(value: float) -> bool:
    """A finite value in [0, 1] (OUI)."""
    return bool(math.isfinite(value) and 0.0 <= value <= 1.0)


SignalCheck = Callable[[float], bool]


@dataclass(frozen=True)
class Signal:
    """One number a client reports for a weighting rule.

    Attributes
    ----------
    name : str
        Its metric key in the train reply.
    producer : str or None
        The client step that measures it; None when every train reply
        carries it (the training loss).
    check : callable
        True for a valid value; a reply with an invalid one is left out.
    meaning : str
        One line for the docs and error messages.
    """

    name: str
    producer: str | None
    check: SignalCheck
    meaning: str


TRAIN_LOSS_SIGNAL = Signal(TRAIN_LOSS, None, finite_non_negative, "mean training loss of the round's local training")
"""The signal every train reply carries; the methods' own are in their packages (:mod:`fedweigh.methods.catalog`)."""


# ---------------------------------------------------------------------------
# client steps
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StepSpec:
    """A client step as both sides know it.

    Attributes
    ----------
    name : str
        What the train config's ``client-steps`` lists.
    produces : tuple of str
        The signals it reports (keys of :data:`fedweigh.methods.catalog.SIGNALS`).
    options : str or None
        The run-config table with its options (``ufl`` for ``ufl.mc-passes``),
        sent with every instruction that runs it.
    meaning : str
        One line for the docs.
    keeps_node_state : bool
        It keeps something on the node between the rounds the node trains
        in (MOON's last local model): a server checkpoint does not hold it,
        so a resumed run starts it afresh.
    """

    name: str
    produces: tuple[str, ...]
    options: str | None
    meaning: str
    keeps_node_state: bool = False


Table = TypeVar("Table", bound=BaseModel)


def table_entries(table: str, section: BaseModel) -> dict[str, ConfigValue]:
    """A settings table as config entries under its run-config keys.

    >>> from pydantic import BaseModel
    >>> class Probe(BaseModel):
    ...     probe_size: int = 32
    >>> table_entries("oui", Probe())
    {'oui.probe-size': 32}
    """
    return {f"{table}.{dashed(key)}": value for key, value in section.model_dump().items()}


def table_from_config(table: str, model: type[Table], config: Mapping[str, Any]) -> Table:
    """Read a settings table back from config entries (missing keys take their defaults)."""
    prefix = f"{table}."
    entries = {key[len(prefix) :]: value for key, value in config.items() if key.startswith(prefix)}
    return model.model_validate(entries)
