"""The one ClientApp: it executes whatever instruction the strategy sends.

* ``query``: tells the server which data partition this node holds, so that
  client sampling can be seeded by partition (see
  :mod:`fedweigh.strategies.sampling`), and starts loading the node's data in
  the background (:func:`warm_data`).
* ``train``: loads the global model, runs the instruction's client steps
  before training (sample weights, signals on the global model), trains as
  its :class:`~fedweigh.protocol.TrainRecipe` says, runs the steps after
  training (signals on the trained model), and replies with the model and a
  MetricRecord: ``num-examples``, ``train_loss``, ``partition-id``,
  ``model-round`` and each step's signals (:mod:`fedweigh.protocol`).
* ``evaluate``: loss and accuracy of the global model on the local partition.

It imports no server code: the steps come from
:mod:`fedweigh.methods.registry`, the message format from
:mod:`fedweigh.protocol`.

The node's data comes from its node config, as set with
``flower-supernode --node-config`` in a deployment:

* ``partition-id=<i> num-partitions=<n>``: partition ``i`` of the run's
  ``dataset``, as in every Flower simulation;
* ``data-dir=<folder>``: a site that holds its own data, a folder with
  ``train.parquet`` and ``test.parquet`` of the same kind of images as the
  run's ``dataset`` (classes, channels, size); all of its train split is this
  node's. An optional ``partition-id`` names the site in the results.

``train-delay=<seconds>`` makes a node reply that much later, as a slow
device would: a way to see a round close at its ``round-deadline``.

In a run with ``[faults]`` (fault injection, :mod:`fedweigh.faults`) a train
instruction may ask the client to misbehave: raise, stall, or return a
corrupted model or corrupted signals, so that the server's checks can be seen
leaving it out. That, and ``train-delay``, are Flower mods around the
handlers (:func:`inject_faults`, :func:`slow_device`), not part of them.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import torch
from flwr.app import ArrayRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from torch import nn

from fedweigh.arrays import encode, to_tensors
from fedweigh.client.registry import build_steps
from fedweigh.client.steps import StepContext, combine
from fedweigh.client.training import evaluate, seed_torch, train_locally
from fedweigh.components import batch_transform, configure_torch, data_spec, new_model, resolve_device, settings_from
from fedweigh.data.federated import DataSpec, dataset_info, load_partition
from fedweigh.data.tensors import ImageTensors
from fedweigh.faults import InjectedFault, corrupt_arrays, corrupt_metrics, fault_to_commit
from fedweigh.flower.engine import prepare_if_simulating
from fedweigh.models import on_device
from fedweigh.models.finetuning import exchanged_state, frozen_digest, load_exchanged_state
from fedweigh.protocol import (
    ARRAYS,
    CLIENT_SECONDS,
    CLIENT_STEPS,
    CONFIG,
    DATA_DIR,
    EVAL_ACCURACY,
    EVAL_LOSS,
    FAULT,
    FROZEN_DIGEST,
    METRICS,
    MODEL_ROUND,
    NUM_EXAMPLES,
    NUM_PARTITIONS,
    PARTITION_ID,
    SERVER_ROUND,
    TRAIN_CPU_SECONDS,
    TRAIN_DELAY,
    TRAIN_LOSS,
    TRAIN_SECONDS,
    TrainRecipe,
)
from fedweigh.settings import Settings

logger = logging.getLogger("flwr.fedweigh")

OPTIMIZER_STATE = "optimizer-state"
"""Key in ``Context.state`` of the client's optimizer state (``persist-optimizer-state``)."""


def partition_of(context: Context) -> tuple[int, int]:
    """``(partition-id, num-partitions)`` from the node config; clear error if absent."""
    config = context.node_config
    if PARTITION_ID not in config or NUM_PARTITIONS not in config:
        raise ValueError(
            f'this SuperNode has no data partition: start it with --node-config "{PARTITION_ID}=<i> '
            f'{NUM_PARTITIONS}=<n>" (or "{DATA_DIR}=<folder>" for a site with its own data)'
        )
    return int(config[PARTITION_ID]), int(config[NUM_PARTITIONS])


def site_data(settings: Settings, folder: str) -> ImageTensors:
    """All of the train split of a site's own data folder, checked against the run's dataset."""
    expected, found = dataset_info(settings.dataset), dataset_info(folder)
    mismatch = [
        f"{name} {getattr(found, name)} (the run's dataset has {getattr(expected, name)})"
        for name in ("num_classes", "in_channels", "image_size")
        if getattr(found, name) != getattr(expected, name)
    ]
    if mismatch:
        raise ValueError(
            f"node config {DATA_DIR} = {folder!r} does not fit setting dataset = {settings.dataset!r}: "
            f"{'; '.join(mismatch)}; accepted: a folder of the same kind of images"
        )
    return load_partition(DataSpec(dataset=folder, partitioner="iid", num_partitions=1, seed=settings.seed), 0)


def local_data(settings: Settings, context: Context) -> tuple[ImageTensors, int, int]:
    """This node's training data, its partition id (-1: none) and the key that seeds it."""
    config = context.node_config
    if DATA_DIR in config:
        partition_id = int(config.get(PARTITION_ID, -1))
        key = partition_id if partition_id >= 0 else int(context.node_id) % 2**31
        return site_data(settings, str(config[DATA_DIR])), partition_id, key
    partition_id, num_partitions = partition_of(context)
    return load_partition(data_spec(settings, num_partitions), partition_id), partition_id, partition_id


def client_seed(seed: int, server_round: int, partition_id: int) -> int:
    """A seed per (run seed, round, partition), independent of node ids and history."""
    return zlib.crc32(f"{seed}/{server_round}/{partition_id}".encode()) & 0x7FFFFFFF


@functools.lru_cache(maxsize=2)
def _cached_model(settings: Settings) -> tuple[nn.Module, str]:
    """This process's model for ``settings`` and the digest of its frozen part, built once, on its device."""
    model = new_model(settings)
    digest = frozen_digest(model)
    return on_device(model, resolve_device(settings.device)), digest


def _setup(message: Message, context: Context) -> tuple[Settings, nn.Module, torch.device]:
    """The run's settings, and its model holding the message's tensors (only the trainable ones travel)."""
    configure_torch()
    settings = settings_from(context.run_config)
    device = resolve_device(settings.device)
    model, digest = _cached_model(settings)
    expected = message.content[CONFIG].get(FROZEN_DIGEST, "") if CONFIG in message.content else ""
    if expected and expected != digest:
        raise ValueError(
            f"this node's frozen model part (digest {digest or 'none'}) differs from the server's ({expected}): "
            f"every node must build model = {settings.model!r} from the same weights; check model-pretrained and "
            f"model-weights = {settings.model_weights!r} (the same file, or the same Hub revision, everywhere)"
        )
    load_exchanged_state(model, to_tensors(message.content[ARRAYS]))
    return settings, model, device


_WARMED: set[tuple[object, ...]] = set()
_WARMED_LOCK = threading.Lock()


MESSAGE_PROCESS = "flwr-clientapp"
"""The program of Flower's process per message (its default isolation in a deployment)."""


def outlives_its_message() -> bool:
    """Whether this process stays after the message it handles: a simulation's actor or process, or a resident
    ClientApp (``fedweigh-superexec``); not Flower's ``flwr-clientapp``, which exits once it has replied."""
    return Path(sys.argv[0]).name != MESSAGE_PROCESS


def warm_data(context: Context) -> threading.Thread | None:
    """Start loading this node's training data in a background thread (once per process and data).

    The server asks every node for its partition before round 1 and then loads
    its own data (the partition check, the test split). Loading the client's
    data meanwhile, rather than in the first train message, overlaps the two:
    a few seconds per run with MNIST or CIFAR-10 on a small machine. The data
    caches are shared and locked, so the first train message simply finds the
    data loaded (or waits for the load to finish); a failure is left for that
    message to report. Returns the thread, or None when nothing was started.

    Nothing starts in a process that ends with its message (Flower's
    ``flwr-clientapp``): the load would gain nothing there, and a load cut
    off as the process exits can leave the dataset cache's file lock with a
    process that never finishes exiting, so that the next message's process
    waits on it for ever (seen with CIFAR-10 in the compose stack).
    """
    if not outlives_its_message():
        return None
    config = dict(context.node_config)
    key = (tuple(sorted(context.run_config.items())), config.get(DATA_DIR), config.get(NUM_PARTITIONS))
    with _WARMED_LOCK:
        if key in _WARMED:
            return None
        _WARMED.add(key)
    run_config = dict(context.run_config)
    node = SimpleNamespace(node_config=config, node_id=context.node_id)  # what local_data reads

    def load() -> None:
        try:
            configure_torch()
            local_data(settings_from(run_config), node)  # type: ignore[arg-type]
        except Exception as err:  # noqa: BLE001 - the train message reports it
            logger.debug("loading the data ahead of training failed: %s", err)

    thread = threading.Thread(target=load, name="fedweigh-data-warm-up", daemon=True)
    thread.start()
    return thread


def inject_faults(message: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """A mod: the fault a train instruction asks of this client, committed (:mod:`fedweigh.faults`).

    Only in a run whose own run config injects faults: ``exception`` raises
    before the handler runs; the array and signal faults corrupt its reply;
    ``stall`` holds the reply past the round's timeout.
    """
    if message.metadata.message_type != MessageType.TRAIN:
        return call_next(message, context)
    settings = settings_from(context.run_config)
    config = message.content[CONFIG]
    fault = fault_to_commit(settings, config, FAULT)  # "" unless the run injects faults
    if not fault:
        return call_next(message, context)
    partition_id, server_round = int(context.node_config.get(PARTITION_ID, -1)), int(config[SERVER_ROUND])
    if fault == "exception":
        raise InjectedFault(f"fault injection: partition {partition_id} raises in round {server_round}")
    reply = call_next(message, context)
    logger.info("fault injection: partition %d commits '%s' in round %d", partition_id, fault, server_round)
    arrays = corrupt_arrays(fault, to_tensors(reply.content[ARRAYS]), settings.faults.scale)
    steps = list(config.get(CLIENT_STEPS, []))
    metrics = corrupt_metrics(fault, dict(reply.content[METRICS]), steps, server_round, settings.max_staleness)
    corrupted = Message(RecordDict({ARRAYS: encode(arrays), METRICS: MetricRecord(metrics)}), reply_to=message)
    if fault == "stall":  # past the round's timeout: the server has closed the round without this reply
        time.sleep(settings.round_timeout + 1.0)
    return corrupted


def slow_device(message: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """A mod: a node with ``train-delay`` in its node config replies that many seconds after training (testing)."""
    reply = call_next(message, context)
    delay = float(context.node_config.get(TRAIN_DELAY, 0))
    if message.metadata.message_type == MessageType.TRAIN and delay > 0:
        time.sleep(delay)
    return reply


# In a simulation process this module is imported before Flower's engine starts its message loop: the moment
# to make the hand-off event-driven (fedweigh/flower/engine.py). Elsewhere (a SuperNode, the CLI) nothing changes.
prepare_if_simulating()

app = ClientApp(mods=[inject_faults, slow_device])


@app.query()
def describe(message: Message, context: Context) -> Message:
    """Reply with this node's partition id (-1 when it has none); start loading its data."""
    warm_data(context)
    config = context.node_config
    metrics = MetricRecord(
        {PARTITION_ID: int(config.get(PARTITION_ID, -1)), NUM_PARTITIONS: int(config.get(NUM_PARTITIONS, 0))}
    )
    return Message(RecordDict({METRICS: metrics}), reply_to=message)


@app.train()
def train(message: Message, context: Context) -> Message:
    """Run the instruction in the train ConfigRecord and reply with model and signals."""
    started = time.perf_counter()
    settings, model, device = _setup(message, context)
    config = dict(message.content[CONFIG])
    recipe = TrainRecipe.from_config(config)
    server_round = int(config[SERVER_ROUND])
    data, partition_id, seed_key = local_data(settings, context)
    seed = client_seed(settings.seed, server_round, seed_key)
    seed_torch(seed, device)  # dropout draws from the global generator
    generator = torch.Generator().manual_seed(seed)
    step_context = StepContext(
        model=model,
        data=data,
        transform=batch_transform(settings),
        device=device,
        seed=seed,
        run_seed=settings.seed,
        partition_id=seed_key,  # the partition id; for a site without one, the key its seeds derive from
        server_round=server_round,
        config=config,
        node_state=context.state,
        records=message.content,
    )
    steps = build_steps(list(config.get(CLIENT_STEPS, [])))
    weightings, signals = [], {}
    for step in steps:
        weighting, metrics = step.before_training(step_context)
        signals.update(metrics)
        if weighting is not None:
            weightings.append(weighting)

    kept = context.state.get(OPTIMIZER_STATE) if recipe.persist_optimizer_state else None
    stats = train_locally(
        model,
        data,
        recipe,
        step_context.transform,
        device,
        generator,
        combine(weightings),
        optimizer_state=to_tensors(kept, writable=True) if isinstance(kept, ArrayRecord) else None,
        loss_terms=[term for step in steps if (term := step.loss_term(step_context)) is not None],
        after_step=[hook for step in steps if (hook := step.after_each_step(step_context)) is not None],
    )
    if stats.optimizer_state is not None:
        context.state[OPTIMIZER_STATE] = encode(stats.optimizer_state)
    for step in steps:
        signals.update(step.after_training(step_context))

    metrics = {
        NUM_EXAMPLES: stats.num_examples,
        TRAIN_LOSS: stats.train_loss,
        PARTITION_ID: partition_id,
        MODEL_ROUND: server_round,
        TRAIN_SECONDS: stats.seconds,
        TRAIN_CPU_SECONDS: stats.cpu_seconds,
        **{key: float(value) for key, value in signals.items()},
    }
    arrays_record = encode(exchanged_state(model))
    metrics[CLIENT_SECONDS] = time.perf_counter() - started
    return Message(RecordDict({ARRAYS: arrays_record, METRICS: MetricRecord(metrics)}), reply_to=message)


@app.evaluate()
def evaluate_locally(message: Message, context: Context) -> Message:
    """Loss and accuracy of the received model on this node's partition."""
    settings, model, device = _setup(message, context)
    data, _, _ = local_data(settings, context)
    result = evaluate(
        model, data, batch_transform(settings), device, settings.eval_batch_size, settings.mixed_precision
    )
    metrics = MetricRecord({NUM_EXAMPLES: result.num_examples, EVAL_LOSS: result.loss, EVAL_ACCURACY: result.accuracy})
    return Message(RecordDict({METRICS: metrics}), reply_to=message)
