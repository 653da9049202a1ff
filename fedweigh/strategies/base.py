"""The strategy every method here is built on.

:class:`WeightedFedAvg` is Flower's ``FedAvg`` with its parts made explicit,
in the order a round runs them:

* **sampling**: clients drawn reproducibly by partition
  (:mod:`fedweigh.strategies.sampling`), the same for every strategy;
* the **instruction**: static config entries (the
  :class:`~fedweigh.protocol.TrainRecipe`, the client steps and their
  options) plus each round's values from its **schedules**
  (:mod:`fedweigh.strategies.schedules`: the decayed learning rate, ...);
* **reply checks** (:mod:`fedweigh.strategies.replies`): nothing unchecked
  reaches the global model;
* the **weighting rule** (:mod:`fedweigh.rules`): the round's signals to
  weights;
* the **server update** (:mod:`fedweigh.strategies.updates`): replies and
  weights to the new global model (the weighted mean by default; stale replies
  rebased onto this round's model);
* a **record** of the round: who was sampled, who was left out and why, each
  client's weight and signals, the rule's diagnostics, the round's values.

It keeps a ``round_offset`` so that a resumed run continues the round
numbering, sampling and seeds of the original, and the global models of the
last ``max_staleness`` rounds, which stale replies are applied against.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fedweigh.protocol import ARRAYS, CONFIG, SERVER_ROUND, TRAIN_LOSS, ConfigValue
from fedweigh.rules.base import RoundSignals, RuleOutcome, WeightingRule
from fedweigh.strategies.aggregation import NamedArrays, all_finite, decode, encode
from fedweigh.strategies.replies import ClientReply, valid_replies
from fedweigh.strategies.sampling import NodeDirectory, sample_nodes, sample_size
from fedweigh.strategies.schedules import Schedule
from fedweigh.strategies.updates import RoundUpdate, ServerUpdate, WeightedMean, as_current

logger = logging.getLogger("flwr.fedweigh")


@dataclass
class RoundRecord:
    """What one training round did; one line of ``metrics.jsonl`` holds it."""

    round: int
    sampled: list[int] = field(default_factory=list)
    clients: list[dict[str, Any]] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)
    diagnostics: dict[str, Any] = field(default_factory=dict)
    aggregated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class WeightedFedAvg(FedAvg):
    """FedAvg with a weighting rule, a server update, a client recipe and a round record.

    Parameters
    ----------
    rule : WeightingRule
        Turns the round's signals into weights.
    recipe : Mapping[str, ConfigValue]
        Entries added to every train ``ConfigRecord``.
    update : ServerUpdate, optional
        Replies and weights to the new global model; default
        :class:`~fedweigh.strategies.updates.WeightedMean`.
    schedules : sequence of Schedule
        Per-round config entries, added after ``recipe``.
    max_staleness : int
        A reply may have trained the global model of up to this many rounds
        ago; 0 (synchronous) accepts only this round's.
    server_data : object, optional
        The server's own data, handed to the update step.
    seed : int
        Seeds client sampling; the same seed gives the same clients, round by
        round, for every strategy.
    round_offset : int
        Rounds already done before this ``start`` (resuming).
    **fedavg_kwargs
        ``fraction_train``, ``min_train_nodes``, ... as for Flower's FedAvg.
    """

    def __init__(
        self,
        rule: WeightingRule,
        recipe: Mapping[str, ConfigValue] | None = None,
        *,
        update: ServerUpdate | None = None,
        schedules: Sequence[Schedule] = (),
        max_staleness: int = 0,
        server_data: object | None = None,
        seed: int = 0,
        round_offset: int = 0,
        **fedavg_kwargs: Any,
    ) -> None:
        super().__init__(arrayrecord_key=ARRAYS, configrecord_key=CONFIG, **fedavg_kwargs)
        self.rule = rule
        self.recipe = dict(recipe or {})
        self.update = update or WeightedMean()
        self.schedules = list(schedules)
        self.max_staleness = max_staleness
        self.server_data = server_data
        self.seed = seed
        self.round_offset = round_offset
        self.directory = NodeDirectory()
        self.records: dict[int, RoundRecord] = {}
        self.global_models: dict[int, NamedArrays] = {}  # round -> the global model it sent
        self._sent: list[Message] = []  # this round's train instructions (the grid gives them ids)

    # -- Flower's template methods ---------------------------------------------

    def summary(self) -> None:
        name = type(self).__name__
        logger.info("\t├──> %s: rule %s, update %s, seed %d", name, self.rule.name, self.update.name, self.seed)
        logger.info("\t├──> recipe: %s", self.recipe)
        super().summary()

    def _sample(self, grid: Grid, server_round: int, fraction: float, minimum: int, stream: int) -> list[int]:
        node_ids = self.directory.refresh(grid, max(self.min_available_nodes, minimum))
        size = sample_size(len(node_ids), fraction, minimum)
        return sample_nodes(self.directory, node_ids, self.seed + stream, server_round, size)

    def round_values(self, server_round: int) -> dict[str, ConfigValue]:
        """The schedules' config entries for ``server_round``."""
        values: dict[str, ConfigValue] = {}
        for schedule in self.schedules:
            values.update(schedule(server_round))
        return values

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample clients reproducibly and send them the model, the recipe and the round's values."""
        current = server_round + self.round_offset
        if self.fraction_train == 0.0:
            return []
        chosen = self._sample(grid, current, self.fraction_train, self.min_train_nodes, stream=0)
        self.global_models[current] = decode(arrays)
        for old in [r for r in self.global_models if r < current - self.max_staleness]:
            del self.global_models[old]
        values = self.round_values(current)
        self.records[current] = RoundRecord(
            round=current,
            sampled=[self.directory.partition_of.get(node, -1) for node in chosen],
            diagnostics=dict(values),
        )
        train_config = ConfigRecord({**dict(config), **self.recipe, **values, SERVER_ROUND: current})
        content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: train_config})
        self._sent = list(self._construct_messages(content, chosen, MessageType.TRAIN))
        return self._sent

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Federated evaluation on a seeded sample (off unless fraction-evaluate > 0)."""
        current = server_round + self.round_offset
        if self.fraction_evaluate == 0.0:
            return []
        chosen = self._sample(grid, current, self.fraction_evaluate, self.min_evaluate_nodes, stream=7919)
        evaluate_config = ConfigRecord({**dict(config), SERVER_ROUND: current})
        content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: evaluate_config})
        return self._construct_messages(content, chosen, MessageType.EVALUATE)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check replies, weigh them with the rule, apply the server update, record."""
        current = server_round + self.round_offset
        record = self.records.setdefault(current, RoundRecord(round=current))
        reference = self.global_models.get(current)
        if reference is None:
            raise RuntimeError(f"round {current} is aggregated but was never configured")
        replies = list(replies)
        origin = {m.metadata.message_id: m.metadata.dst_node_id for m in self._sent if m.metadata.message_id}
        oldest = min(self.global_models)  # configure_train keeps the last max_staleness rounds' models
        accepted, rejected = valid_replies(current, replies, reference, self.rule.signals, origin, oldest)
        rejected.update(_unanswered(current, origin, replies))
        record.left_out = {str(self.directory.partition_of.get(n, n)): why for n, why in rejected.items()}
        if not accepted:
            logger.warning("round %d: no valid reply; the global model stays as it was", current)
            return None, None
        # Replies arrive in any order; summing in partition order makes runs bit-reproducible.
        accepted.sort(key=lambda reply: (reply.partition_id, reply.node_id))

        sizes = np.array([reply.num_examples for reply in accepted], dtype=np.float64)
        models = [reply.arrays for reply in accepted]
        model_rounds = [reply.model_round for reply in accepted]
        start_models = {r: self.global_models[r] for r in set(model_rounds)}
        values: dict[str, np.ndarray] = {
            key: np.array([reply.signals[key] for reply in accepted], dtype=np.float64) for key in self.rule.signals
        }
        derived_from = as_current(models, model_rounds, current, reference, start_models)
        values.update(self.rule.derive_signals(derived_from, reference, sizes))
        outcome = self.rule(RoundSignals(num_examples=sizes, values=values))
        _check_weights(outcome, len(accepted), self.rule.name)

        averaged = self.update(
            RoundUpdate(
                current, reference, models, model_rounds, outcome.weights, sizes, values, start_models, self.server_data
            )
        )
        if not all_finite(averaged):
            logger.warning("round %d: the new model is not finite; the global model stays as it was", current)
            return None, None

        record.aggregated = True
        record.diagnostics.update({k: v for k, v in outcome.diagnostics.items() if not _per_client(v, len(accepted))})
        record.clients = [_client_entry(index, reply, current, outcome, values) for index, reply in enumerate(accepted)]
        metrics = MetricRecord(
            {
                TRAIN_LOSS: float(np.dot(sizes, [r.train_loss for r in accepted]) / sizes.sum()),
                "num-clients": len(accepted),
                "num-left-out": len(rejected),
            }
        )
        return encode(averaged), metrics

    # -- state for checkpoints ---------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Server-side state to checkpoint: the rule's, the update's, and the models stale replies may need.

        After round t the next round accepts replies to the models of rounds
        ``t + 1 - max_staleness`` and later; the ones already sent are kept
        (none when replies must be fresh).
        """
        latest = max(self.global_models, default=0)
        needed = {r: dict(m) for r, m in self.global_models.items() if r >= latest + 1 - self.max_staleness}
        return {"rule": self.rule.state(), "update": self.update.state(), "global_models": needed}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.rule.load_state(state.get("rule", {}))
        self.update.load_state(state.get("update", {}))
        self.global_models.update({int(r): dict(m) for r, m in state.get("global_models", {}).items()})


def _client_entry(
    index: int, reply: ClientReply, server_round: int, outcome: RuleOutcome, values: Mapping[str, np.ndarray]
) -> dict[str, Any]:
    """One client's line of the round record: who, how much, its weight, signals and reported metrics."""
    count = len(outcome.weights)
    entry: dict[str, Any] = {
        "partition": reply.partition_id,
        "node": reply.node_id,
        "num_examples": reply.num_examples,
        TRAIN_LOSS: reply.train_loss,
        "weight": float(outcome.weights[index]),
        "staleness": server_round - reply.model_round,
    }
    entry.update({key: float(series[index]) for key, series in values.items()})
    entry.update({key: float(v[index]) for key, v in outcome.diagnostics.items() if _per_client(v, count)})
    entry.update({key: value for key, value in reply.reported.items() if key not in entry})
    return entry


def _unanswered(server_round: int, origin: Mapping[str, int], replies: list[Message]) -> dict[int, str]:
    """Nodes sent an instruction (``origin``: message id to node) that got no reply at all."""
    answered = {reply.metadata.reply_to_message_id for reply in replies}
    missing = {node: "no reply before the round's timeout" for mid, node in origin.items() if mid not in answered}
    for node, why in missing.items():
        logger.warning("round %d: left out node %d: %s", server_round, node, why)
    return missing


def _per_client(value: Any, count: int) -> bool:
    return isinstance(value, list | tuple | np.ndarray) and len(value) == count


def _check_weights(outcome: RuleOutcome, count: int, rule: str) -> None:
    weights = outcome.weights
    if weights.shape != (count,) or not np.all(np.isfinite(weights)) or np.any(weights < 0):
        raise RuntimeError(f"rule {rule} returned invalid weights {weights!r} for {count} clients")
    if abs(weights.sum() - 1.0) > 1e-6:
        raise RuntimeError(f"rule {rule} returned weights summing to {weights.sum()}, not 1")
