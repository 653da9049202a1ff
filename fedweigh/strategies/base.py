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

Asynchrony is a property of every strategy here, so that every arm of a
comparison sees the same delays: its own object, :attr:`WeightedFedAvg.asynchrony`
(:mod:`fedweigh.strategies.asynchrony`: updates held back in a simulation,
rounds closing at a deadline in a deployment, whom not to sample, which
models late updates still need), as the per-round values are
(:class:`~fedweigh.strategies.schedules.Schedules`). So a round reads as
sampling, instructions, then checks → rule → update → record.

It keeps a ``round_offset`` so that a resumed run continues the round
numbering, sampling and seeds of the original, and the global models that
replies still on their way (or, synchronously, of the last ``max_staleness``
rounds) may need.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result

from fedweigh.arrays import NamedArrays, decode, encode
from fedweigh.faults import FaultPlan
from fedweigh.methods.catalog import STEPS
from fedweigh.protocol import ARRAYS, CLIENT_STEPS, CONFIG, FAULT, FROZEN_DIGEST, SERVER_ROUND, TRAIN_LOSS, ConfigValue
from fedweigh.results import CLIENT_NUM_EXAMPLES
from fedweigh.rules.base import RoundSignals, RuleOutcome, WeightingRule
from fedweigh.strategies.asynchrony import Asynchrony
from fedweigh.strategies.averaging import all_finite
from fedweigh.strategies.deadline import Deadline
from fedweigh.strategies.grid_wrapper import GridWrapper
from fedweigh.strategies.replies import ClientReply, valid_replies
from fedweigh.strategies.robust import bound_update_norms
from fedweigh.strategies.sampling import NodeDirectory, sample_nodes, sample_size
from fedweigh.strategies.schedules import Schedule, Schedules
from fedweigh.strategies.updates import RoundUpdate, ServerUpdate, WeightedMean, as_current, client_key

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
    in_flight: list[int] = field(default_factory=list)  # partitions whose update is still on its way
    faults: dict[str, str] = field(default_factory=dict)  # fault injection: partition -> its fault
    excluded: int = 0  # clients left out this round, whatever the reason (len(left_out))
    wait_seconds: float | None = None  # from the instructions handed to the grid to the replies' aggregation

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
    delay_std : float
        Simulated asynchrony: σ (rounds) of the half-normal delay of every
        reply; 0: none.
    deadline : Deadline, optional
        Real asynchrony: training rounds close at this deadline.
    server_data : object, optional
        The server's own data, handed to the update step.
    seed : int
        Seeds client sampling; the same seed gives the same clients, round by
        round, for every strategy.
    client_sampling : str
        How (:func:`~fedweigh.strategies.sampling.sample_partitions`):
        ``"per-round"`` or ``"python-sequence"``.
    round_offset : int
        Rounds already done before this ``start`` (resuming).
    frozen_digest : str
        Hash of the model's frozen part (:func:`fedweigh.models.finetuning.frozen_digest`),
        sent with every instruction so that a client built from other weights
        refuses it; ``""`` when every tensor travels.
    update_norm_bound : float
        Robust aggregation (off: 0): each update's norm is capped at this
        multiple of the round's median (:mod:`fedweigh.strategies.robust`).
    faults : FaultPlan, optional
        Fault injection: the clients told to misbehave, round by round
        (:mod:`fedweigh.faults`); None in a normal run.
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
        delay_std: float = 0.0,
        deadline: Deadline | None = None,
        server_data: object | None = None,
        seed: int = 0,
        client_sampling: str = "per-round",
        round_offset: int = 0,
        frozen_digest: str = "",
        update_norm_bound: float = 0.0,
        faults: FaultPlan | None = None,
        **fedavg_kwargs: Any,
    ) -> None:
        super().__init__(arrayrecord_key=ARRAYS, configrecord_key=CONFIG, **fedavg_kwargs)
        self.rule = rule
        self.recipe = dict(recipe or {})
        self.update = update or WeightedMean()
        self.schedules = Schedules(schedules)
        self.max_staleness = max_staleness
        self.asynchrony = Asynchrony(delay_std, deadline, max_staleness, seed)
        self.server_data = server_data
        self.seed = seed
        self.client_sampling = client_sampling
        self.round_offset = round_offset
        self.frozen_digest = frozen_digest
        self.update_norm_bound = update_norm_bound
        self.faults = faults
        self.directory = NodeDirectory()
        self.records: dict[int, RoundRecord] = {}
        self.global_models: dict[int, NamedArrays] = {}  # round -> the global model it sent
        self._sent: list[Message] = []  # this round's train instructions (the grid gives them ids)
        self._handed_over: float | None = None  # when configure_train returned them (time.perf_counter)

    # -- Flower's template methods ---------------------------------------------

    def summary(self) -> None:
        name = type(self).__name__
        logger.info("\t├──> %s: rule %s, update %s, seed %d", name, self.rule.name, self.update.name, self.seed)
        logger.info("\t├──> recipe: %s", self.recipe)
        super().summary()

    @property
    def asynchronous(self) -> bool:
        return self.asynchrony.on

    @property
    def delay_std(self) -> float:
        """σ (rounds) of the simulated delays (:attr:`asynchrony`)."""
        return self.asynchrony.delay_std

    @property
    def deadline(self) -> Deadline | None:
        """The training rounds' deadline (:attr:`asynchrony`), None for rounds that wait for every reply."""
        return self.asynchrony.deadline

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, **kwargs: Any) -> Result:
        """Flower's ``Strategy.start``; with a round deadline, on a :class:`DeadlineGrid` around ``grid``."""
        grid = self.asynchrony.grid(grid)
        if isinstance(grid, GridWrapper):  # a wait that goes on names nodes with their partitions
            grid.set_node_label(self.directory.label)
        return super().start(grid, initial_arrays, num_rounds, **kwargs)

    def busy_nodes(self) -> set[int]:
        """Nodes whose update is still on its way: not to be sampled (spec: no re-sampling in flight)."""
        return self.asynchrony.busy_nodes(self.directory)

    def _sample(
        self, grid: Grid, server_round: int, fraction: float, minimum: int, stream: int, busy: set[int] | None = None
    ) -> list[int]:
        node_ids = self.directory.refresh(grid, max(self.min_available_nodes, minimum))
        size = sample_size(len(node_ids), fraction, minimum)
        if busy:
            node_ids = [node for node in node_ids if node not in busy]
            size = min(size, len(node_ids))
            if size == 0:
                return []
        return sample_nodes(self.directory, node_ids, self.seed + stream, server_round, size, self.client_sampling)

    def round_values(self, server_round: int) -> dict[str, ConfigValue]:
        """The schedules' config entries for ``server_round``."""
        return self.schedules(server_round)

    @property
    def checked_signals(self) -> tuple[str, ...]:
        """The signals every reply must carry, valid: the rule's, and those of the client steps it was told to run."""
        steps: list[str] = list(self.recipe.get(CLIENT_STEPS, []))  # type: ignore[arg-type]
        produced = [name for step in steps for name in STEPS[step].produces]
        return tuple(dict.fromkeys([*self.rule.signals, *produced]))

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample idle clients reproducibly and send them the model, the recipe and the round's values.

        The instructions are timed from here, when they go to the grid, to
        :meth:`aggregate_train` (the round record's ``wait_seconds``).
        """
        instructions = self._configure_train(server_round, arrays, config, grid)
        self._handed_over = time.perf_counter()
        return instructions

    def _configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        """:meth:`configure_train`'s work.

        With simulated delays, a sampled client whose update is late is sent
        nothing yet: it gets its instruction (the model and values of the
        round it was sampled in) in the round its update arrives.
        """
        current = server_round + self.round_offset
        if self.fraction_train == 0.0:
            return []
        self.global_models[current] = decode(arrays)
        self._forget_unneeded_models(current)
        values = self.round_values(current)
        record = self.records[current] = RoundRecord(round=current, diagnostics=dict(values))
        self._sent = []
        if not self.update.needs_clients:  # the server trains alone (Center)
            return []
        chosen = self._sample(grid, current, self.fraction_train, self.min_train_nodes, 0, self.busy_nodes())
        record.sampled = [self.directory.partition_of.get(node, -1) for node in chosen]
        fault_of: dict[int, str] = {}  # node -> the fault it is told to commit (fault injection only)
        if self.faults is not None:
            for position, kind in self.faults.assign(current, record.sampled).items():
                fault_of[chosen[position]] = kind
                record.faults[str(record.sampled[position])] = kind
        now = self.asynchrony.hold_back(current, chosen, record.sampled, fault_of)
        self._sent = self._instructions(now, current, arrays, config, fault_of)
        if self.delay_std > 0:
            self._sent += self._arrivals(current, config, record)
        return self._sent

    def _instructions(
        self,
        nodes: Sequence[int],
        model_round: int,
        arrays: ArrayRecord,
        config: ConfigRecord,
        faults: Mapping[int, str] | None = None,
    ) -> list[Message]:
        """Train instructions: the model of ``model_round`` with that round's recipe and values.

        ``faults`` (fault injection) names the fault each of some nodes is told to commit.
        """
        values = self.round_values(model_round)
        entries = {**dict(config), **self.recipe, **values, **self._model_check(), SERVER_ROUND: model_round}
        per_client = self.update.sends_per_client  # then one message each, with the update's arrays for it
        groups: dict[tuple[str, int | None], list[int]] = {}
        for node in nodes:
            groups.setdefault(((faults or {}).get(node, ""), node if per_client else None), []).append(node)
        model = decode(arrays) if per_client else {}
        messages: list[Message] = []
        for (fault, node), members in groups.items():
            train_config = ConfigRecord({**entries, FAULT: fault} if fault else entries)
            records = {self.arrayrecord_key: arrays, self.configrecord_key: train_config}
            if node is not None:
                own = self.update.instruction_arrays(self._client_key(node), model, model_round)
                records.update({key: encode(value) for key, value in own.items()})
            messages += self._construct_messages(RecordDict(records), members, MessageType.TRAIN)
        return messages

    def _client_key(self, node: int) -> str:
        """The name of ``node``'s client in what an update keeps per client (:func:`client_key`)."""
        return client_key(self.directory.partition_of.get(node, -1), node)

    def _model_check(self) -> dict[str, ConfigValue]:
        """The config entry that lets a client check its frozen model part against the server's (none without)."""
        return {FROZEN_DIGEST: self.frozen_digest} if self.frozen_digest else {}

    def _arrivals(self, current: int, config: ConfigRecord, record: RoundRecord) -> list[Message]:
        """Instructions for the clients sampled earlier whose update arrives now (simulated delays)."""
        arrived = self.asynchrony.arrivals(current, self.directory)
        record.left_out.update(arrived.left_out)
        messages = []
        for model_round, nodes in sorted(arrived.by_round.items()):
            messages += self._instructions(
                nodes, model_round, encode(self.global_models[model_round]), config, arrived.faults
            )
        return messages

    def _forget_unneeded_models(self, current: int) -> None:
        """Keep the global models an update may still be applied against (:meth:`Asynchrony.rounds_to_keep`)."""
        keep = self.asynchrony.rounds_to_keep(current, list(self.global_models))
        for old in [r for r in self.global_models if r not in keep]:
            del self.global_models[old]

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Federated evaluation on a seeded sample (off unless fraction-evaluate > 0)."""
        current = server_round + self.round_offset
        if self.fraction_evaluate == 0.0:
            return []
        chosen = self._sample(grid, current, self.fraction_evaluate, self.min_evaluate_nodes, stream=7919)
        evaluate_config = ConfigRecord({**dict(config), **self._model_check(), SERVER_ROUND: current})
        content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: evaluate_config})
        return self._construct_messages(content, chosen, MessageType.EVALUATE)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check replies, hold back or release delayed ones, weigh them with the rule, apply the server update."""
        current = server_round + self.round_offset
        record = self.records.setdefault(current, RoundRecord(round=current))
        if self._handed_over is not None:
            record.wait_seconds = time.perf_counter() - self._handed_over
            self._handed_over = None
        reference = self.global_models.get(current)
        if reference is None:
            raise RuntimeError(f"round {current} is aggregated but was never configured")
        replies = list(replies)
        sent = {m.metadata.message_id: m.metadata.dst_node_id for m in self._sent if m.metadata.message_id}
        origin = {**self.asynchrony.origins(), **sent}
        oldest = min(self.global_models)  # configure_train keeps the models replies may still need
        accepted, rejected = valid_replies(current, replies, reference, self.checked_signals, origin, oldest)
        if self.asynchrony.deadline_grid is None:
            rejected.update(_unanswered(current, sent, replies))
        record.left_out.update({str(self.directory.partition_of.get(n, n)): why for n, why in rejected.items()})
        record.excluded = len(record.left_out)
        record.in_flight = self.asynchrony.in_flight(self.directory)
        if not accepted and self.update.needs_clients:
            self._account_memory(current, record)
            if self.asynchronous:
                logger.info("round %d: no update arrived; the global model stays as it was", current)
            else:
                logger.warning("round %d: no valid reply; the global model stays as it was", current)
            return None, None
        if self.update.needs_clients and not self.asynchronous and len(accepted) < self.min_train_nodes:
            logger.warning(
                "round %d: skipped: %d valid repl%s, fewer than min-train-nodes = %d; the global model stays as it was",
                current,
                len(accepted),
                "y" if len(accepted) == 1 else "ies",
                self.min_train_nodes,
            )
            return None, None
        # Replies arrive in any order; summing in partition order makes runs bit-reproducible.
        accepted.sort(key=lambda reply: (reply.partition_id, reply.node_id, reply.model_round))

        sizes = np.array([reply.num_examples for reply in accepted], dtype=np.float64)
        models = [reply.arrays for reply in accepted]
        model_rounds = [reply.model_round for reply in accepted]
        start_models = {r: self.global_models[r] for r in set(model_rounds)}
        norms: dict[str, list[float]] = {}
        if self.update_norm_bound > 0 and accepted:
            starts = [start_models[r] for r in model_rounds]
            models, update_norms, factors = bound_update_norms(models, starts, self.update_norm_bound)
            norms = {"update-norm": update_norms.tolist(), "norm-factor": factors.tolist()}
            record.diagnostics["median-update-norm"] = float(np.median(update_norms))
            record.diagnostics["updates-bounded"] = int(np.sum(factors < 1.0))
        values: dict[str, np.ndarray] = {
            key: np.array([reply.signals[key] for reply in accepted], dtype=np.float64) for key in self.rule.signals
        }
        if accepted:
            derived_from = as_current(models, model_rounds, current, reference, start_models)
            values.update(self.rule.derive_signals(derived_from, reference, sizes))
            outcome = self.rule(RoundSignals(num_examples=sizes, values=values))
            _check_weights(outcome, len(accepted), self.rule.name)
        else:
            outcome = RuleOutcome(weights=np.zeros(0))
        step = RoundUpdate(
            current,
            reference,
            models,
            model_rounds,
            outcome.weights,
            sizes,
            values,
            start_models,
            self.server_data,
            partitions=[reply.partition_id for reply in accepted],
            clients_per_round=len(record.sampled),
            clients=[self._client_key(reply.node_id) for reply in accepted],
            num_clients=max(len(self.directory.connected), self.directory.num_partitions or 0),
            reports=[reply.signals for reply in accepted],
        )
        averaged = self.update(step)
        self._account_memory(current, record)
        if not all_finite(averaged):
            logger.warning("round %d: the new model is not finite; the global model stays as it was", current)
            return None, None

        record.aggregated = True
        record.diagnostics.update({k: v for k, v in outcome.diagnostics.items() if not _per_client(v, len(accepted))})
        record.diagnostics.update(step.diagnostics)
        record.clients = [
            _client_entry(
                index, reply, current, outcome, values, start_models[reply.model_round], self.update.uses_weights
            )
            for index, reply in enumerate(accepted)
        ]
        for key, series in norms.items():
            for entry, value in zip(record.clients, series, strict=True):
                entry[key] = value
        metrics = {"num-clients": len(accepted), "num-left-out": len(rejected)}
        if accepted:
            metrics[TRAIN_LOSS] = float(np.dot(sizes, [r.train_loss for r in accepted]) / sizes.sum())
        return encode(averaged), MetricRecord(metrics)

    def _account_memory(self, current: int, record: RoundRecord) -> None:
        """Forget the global models no update needs any more; record how many the server holds, and their size."""
        if not self.asynchronous:
            return
        self._forget_unneeded_models(current)
        model_bytes = sum(_nbytes(model) for model in self.global_models.values())
        record.diagnostics.update(
            {
                "in-flight": len(record.in_flight),
                "held-models": len(self.global_models),
                "held-mb": round(model_bytes / 2**20, 3),
            }
        )

    # -- state for checkpoints ---------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Server-side state to checkpoint: the rule's, the update's, and the models stale replies may need.

        After round t the next round accepts replies to the models of rounds
        ``t + 1 - max_staleness`` and later; the ones already sent are kept
        (none when replies must be fresh).
        """
        latest = max(self.global_models, default=0)
        needed = {r: dict(m) for r, m in self.global_models.items() if r >= latest + 1 - self.max_staleness}
        state: dict[str, Any] = {"rule": self.rule.state(), "update": self.update.state(), "global_models": needed}
        return {**state, **self.asynchrony.state()}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.rule.load_state(state.get("rule", {}))
        self.update.load_state(state.get("update", {}))
        self.global_models.update({int(r): dict(m) for r, m in state.get("global_models", {}).items()})
        self.asynchrony.load_state(state)


def _nbytes(arrays: NamedArrays) -> int:
    return sum(np.asarray(value).nbytes for value in arrays.values())


def _client_entry(
    index: int,
    reply: ClientReply,
    server_round: int,
    outcome: RuleOutcome,
    values: Mapping[str, np.ndarray],
    sent: NamedArrays,
    weighted: bool = True,
) -> dict[str, Any]:
    """One client's line of the round record: who, how much, its weight (if the update uses one), signals, metrics.

    ``bytes_sent`` and ``bytes_received`` are the tensor bytes of the model the
    client was sent (``sent``, its round's global model) and of the one it returned.
    """
    count = len(outcome.weights)
    entry: dict[str, Any] = {
        "partition": reply.partition_id,
        CLIENT_NUM_EXAMPLES: reply.num_examples,
        TRAIN_LOSS: reply.train_loss,
        "staleness": server_round - reply.model_round,
        "bytes_sent": _nbytes(sent),
        "bytes_received": _nbytes(reply.arrays),
    }
    if reply.partition_id < 0:  # a site without a partition id: its node id is what names it
        entry["node"] = reply.node_id
    if weighted:
        entry["weight"] = float(outcome.weights[index])
    entry.update({key: float(series[index]) for key, series in values.items()})
    entry.update({key: float(v[index]) for key, v in outcome.diagnostics.items() if _per_client(v, count)})
    entry.update({key: value for key, value in {**reply.signals, **reply.reported}.items() if key not in entry})
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
