"""The strategy every method here is built on.

:class:`WeightedFedAvg` is Flower's ``FedAvg`` with three parts made explicit:

* a **recipe**: the ``ConfigRecord`` entries that tell the generic ClientApp
  what to do (local epochs, optimiser, proximal term, which signals to
  measure, which per-sample loss weighting to apply);
* a **weighting rule** (:mod:`fedweigh.strategies.weighting`) that turns the
  round's signals into aggregation weights;
* a **record** of each round: who was sampled, who was left out and why, each
  client's weight and signals, and the rule's diagnostics.

It also samples clients reproducibly (:mod:`fedweigh.strategies.sampling`),
checks every reply before it can touch the global model
(:mod:`fedweigh.strategies.replies`), and keeps a ``round_offset`` so that a
resumed run continues the round numbering, sampling and seeds of the original.

A paper's strategy is a thin subclass (or just a configuration) of this class
that picks its rule and its recipe.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fedweigh.strategies.aggregation import all_finite, decode, encode, weighted_average
from fedweigh.strategies.replies import ClientReply, valid_replies
from fedweigh.strategies.sampling import NodeDirectory, sample_nodes, sample_size
from fedweigh.strategies.weighting import RoundSignals, RuleOutcome, SignalCheck, WeightingRule

logger = logging.getLogger("flwr.fedweigh")

RecipeValue = int | float | str | bool | list[str] | list[int] | list[float]


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
    """FedAvg with a pluggable weighting rule, a client recipe and a round record.

    Parameters
    ----------
    rule : WeightingRule
        Turns the round's signals into weights.
    recipe : Mapping[str, RecipeValue]
        Entries added to every train ``ConfigRecord``.
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
        recipe: Mapping[str, RecipeValue] | None = None,
        *,
        seed: int = 0,
        round_offset: int = 0,
        **fedavg_kwargs: Any,
    ) -> None:
        super().__init__(**fedavg_kwargs)
        self.rule = rule
        self.recipe = dict(recipe or {})
        self.seed = seed
        self.round_offset = round_offset
        self.directory = NodeDirectory()
        self.records: dict[int, RoundRecord] = {}
        self._reference: dict[str, np.ndarray] = {}
        self._sent: list[Message] = []  # this round's train instructions (the grid gives them ids)

    # -- hooks for subclasses ------------------------------------------------

    @property
    def required_signals(self) -> Mapping[str, SignalCheck]:
        """Metric keys each train reply must carry, with their checks."""
        return self.rule.signals

    def server_signals(self, replies: list[ClientReply], reference: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Signals the server derives from the replies themselves (none by default)."""
        return {}

    # -- Flower's template methods ---------------------------------------------

    def summary(self) -> None:
        logger.info("\t├──> %s: rule %s, seed %d", type(self).__name__, self.rule.name, self.seed)
        logger.info("\t├──> recipe: %s", self.recipe)
        super().summary()

    def _sample(self, grid: Grid, server_round: int, fraction: float, minimum: int, stream: int) -> list[int]:
        node_ids = self.directory.refresh(grid, max(self.min_available_nodes, minimum))
        size = sample_size(len(node_ids), fraction, minimum)
        return sample_nodes(self.directory, node_ids, self.seed + stream, server_round, size)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample clients reproducibly and send them the model and the recipe."""
        current = server_round + self.round_offset
        if self.fraction_train == 0.0:
            return []
        chosen = self._sample(grid, current, self.fraction_train, self.min_train_nodes, stream=0)
        self._reference = decode(arrays)
        self.records[current] = RoundRecord(
            round=current, sampled=[self.directory.partition_of.get(node, -1) for node in chosen]
        )
        train_config = ConfigRecord({**dict(config), **self.recipe, "server-round": current})
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
        evaluate_config = ConfigRecord({**dict(config), **self.recipe, "server-round": current})
        content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: evaluate_config})
        return self._construct_messages(content, chosen, MessageType.EVALUATE)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check replies, weigh them with the rule, average, record."""
        current = server_round + self.round_offset
        record = self.records.setdefault(current, RoundRecord(round=current))
        replies = list(replies)
        origin = {m.metadata.message_id: m.metadata.dst_node_id for m in self._sent if m.metadata.message_id}
        accepted, rejected = valid_replies(current, replies, self._reference, self.required_signals, origin)
        rejected.update(_unanswered(current, origin, replies))
        record.left_out = {str(self.directory.partition_of.get(n, n)): why for n, why in rejected.items()}
        if not accepted:
            logger.warning("round %d: no valid reply; the global model stays as it was", current)
            return None, None
        # Replies arrive in any order; summing in partition order makes runs bit-reproducible.
        accepted.sort(key=lambda reply: (reply.partition_id, reply.node_id))

        values: dict[str, np.ndarray] = {
            key: np.array([reply.signals[key] for reply in accepted], dtype=np.float64) for key in self.required_signals
        }
        values.update(self.server_signals(accepted, self._reference))
        round_signals = RoundSignals(
            num_examples=np.array([reply.num_examples for reply in accepted], dtype=np.float64), values=values
        )
        outcome = self.rule(round_signals)
        _check_weights(outcome, len(accepted), self.rule.name)

        averaged = weighted_average([reply.arrays for reply in accepted], outcome.weights)
        if not all_finite(averaged):
            logger.warning("round %d: the average is not finite; the global model stays as it was", current)
            return None, None

        record.aggregated = True
        record.diagnostics = {k: v for k, v in outcome.diagnostics.items() if not _per_client(v, len(accepted))}
        for index, reply in enumerate(accepted):
            client: dict[str, Any] = {
                "partition": reply.partition_id,
                "node": reply.node_id,
                "num_examples": reply.num_examples,
                "train_loss": reply.train_loss,
                "weight": float(outcome.weights[index]),
            }
            client.update({key: float(series[index]) for key, series in values.items()})
            client.update(
                {key: float(v[index]) for key, v in outcome.diagnostics.items() if _per_client(v, len(accepted))}
            )
            client.update({key: value for key, value in reply.reported.items() if key not in client})
            record.clients.append(client)

        sizes = round_signals.num_examples
        metrics = MetricRecord(
            {
                "train_loss": float(np.dot(sizes, [r.train_loss for r in accepted]) / sizes.sum()),
                "num-clients": len(accepted),
                "num-left-out": len(rejected),
            }
        )
        return encode(averaged), metrics

    # -- state for checkpoints ---------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Server-side state to checkpoint (the rule's; sampling is stateless)."""
        return {"rule": self.rule.state()}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.rule.load_state(state.get("rule", {}))


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
