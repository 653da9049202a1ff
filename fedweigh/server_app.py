"""The ServerApp: settings in, a recorded federated run out.

It checks the run config (:func:`fedweigh.preflight.check_run`: one clear
error before any training), builds the strategy, the model and the server's
test split, learns which partition each node holds, checks that the data can
be split that many ways, then runs the strategy with central evaluation after
every round. Every round is written to the run folder
(:mod:`fedweigh.results`) with a checkpoint, so a run can be resumed with
``resume-from``, and to the trackers ``tracking`` names (:mod:`fedweigh.tracking`:
TensorBoard, MLflow), which are told how the run ended.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from fedweigh.arrays import decode, encode, to_tensors
from fedweigh.client.training import evaluate
from fedweigh.components import batch_transform, configure_torch, new_model, resolve_device, server_and_test_data
from fedweigh.data.tensors import ImageTensors
from fedweigh.flower import logs, objects
from fedweigh.flower.engine import prepare_if_simulating
from fedweigh.methods.catalog import STEPS
from fedweigh.methods.registry import plan_run
from fedweigh.methods.ufl.client import model_uncertainty, u_tail
from fedweigh.models import on_device
from fedweigh.models.finetuning import exchanged_state, frozen_digest, load_exchanged_state
from fedweigh.preflight import check_run, federation_problems
from fedweigh.results import (
    CHECKPOINT_FILE,
    EVALUATE_SECONDS,
    FINAL_U_ABOVE_1,
    FINAL_U_P95,
    TOP5_ACCURACY,
    WEIGHTED_F1,
    Checkpoint,
    CheckpointWriter,
    RunRecorder,
    resolve_run_dir,
    round_train_loss,
)
from fedweigh.run_folder import ROUNDS_NOT_AGGREGATED
from fedweigh.settings import Settings, SettingsError
from fedweigh.strategies.base import RoundRecord, WeightedFedAvg
from fedweigh.strategies.build import build_strategy
from fedweigh.strategies.replay import ReplayGrid
from fedweigh.strategies.sampling import NodeDirectory
from fedweigh.strategies.wakeup import wakeup_grid
from fedweigh.tracking import open_trackers

logger = logging.getLogger("flwr.fedweigh")

# In a simulation process this module is imported before Flower's engine starts its message loop: the moment
# to make the hand-off event-driven (fedweigh/flower/engine.py). Elsewhere (a SuperNode, the CLI) nothing changes.
prepare_if_simulating()
objects.install()  # in a deployment: a reply's content not stored yet is asked for again after 0.05 s, not 1 s
logs.install()  # on exit: the final status is pushed once the last log lines are uploaded, not 1 s later

app = ServerApp()


def central_evaluation(
    settings: Settings,
    test: ImageTensors,
    strategy: WeightedFedAvg,
    recorder: RunRecorder,
    checkpoints: CheckpointWriter,
    model: torch.nn.Module,
) -> Callable[[int, ArrayRecord], MetricRecord | None]:
    """The ``evaluate_fn`` for ``Strategy.start``: test (every ``evaluate-every`` rounds), record, checkpoint.

    ``model`` is the run's model, which holds the frozen part that does not travel.
    """
    device = resolve_device(settings.device)
    model = on_device(model, device)
    transform = batch_transform(settings)

    def evaluate_round(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round == 0:  # the initial model: not part of a round's record
            return None
        current = server_round + strategy.round_offset
        record = strategy.records.get(current)
        clients = record.clients if record else []
        row: dict[str, object] = {"round": current}
        result = None
        if current % settings.evaluate_every == 0 or current == settings.num_server_rounds:
            started = time.perf_counter()
            load_exchanged_state(model, to_tensors(arrays))
            result = evaluate(model, test, transform, device, settings.eval_batch_size, settings.mixed_precision)
            row.update(
                {
                    EVALUATE_SECONDS: time.perf_counter() - started,
                    "accuracy": result.accuracy,
                    "loss": result.loss,
                    "macro_f1": result.macro_f1,
                    "prediction_share": result.prediction_share,
                    WEIGHTED_F1: result.weighted_f1,
                }
            )
            if math.isfinite(result.top5_accuracy):  # at least TOP_K classes
                row[TOP5_ACCURACY] = result.top5_accuracy
        row.update(round_train_loss(clients))
        fields = (record or RoundRecord(round=current)).to_dict()
        fields.pop("round")
        faults = fields.pop("faults")
        row.update(fields)
        if faults:  # fault injection: who was told to commit which fault
            row["faults"] = faults
        recorder.record_round(row, settings.num_server_rounds)
        checkpoints.save(Checkpoint(current, decode(arrays), strategy.state()))
        return None if result is None else MetricRecord({"accuracy": result.accuracy, "loss": result.loss})

    return evaluate_round


def final_u_tail(
    settings: Settings, model: torch.nn.Module, arrays: ArrayRecord, test: ImageTensors
) -> dict[str, float]:
    """The tail of ``u`` of the final model on the test set (``final-uncertainty`` passes; empty when 0).

    The clients' MC dropout (:func:`fedweigh.methods.ufl.client.model_uncertainty`),
    with the run's ``ufl.*`` dropout options and its seed.
    """
    if settings.final_uncertainty == 0:
        return {}
    device = resolve_device(settings.device)
    model = on_device(model, device)
    load_exchanged_state(model, to_tensors(arrays))
    u = model_uncertainty(
        model, test, batch_transform(settings), device, settings.ufl, settings.seed, settings.final_uncertainty
    )
    p95, above_1 = u_tail(u)
    return {FINAL_U_P95: p95, FINAL_U_ABOVE_1: above_1}


def client_held_state(settings: Settings) -> list[str]:
    """What of a run the clients keep between their rounds, which no server checkpoint holds (for the resume)."""
    held = ["persist-optimizer-state = true: the clients' optimizer state"] if settings.persist_optimizer_state else []
    held += [
        f"the client step {name!r} ({origin}): what it keeps on the node"
        for name, origin in plan_run(settings).steps
        if STEPS[name].keeps_node_state
    ]
    return held


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the federated training the run config describes."""
    configure_torch()
    settings = check_run(context.run_config)
    resolve_device(settings.device)  # device = 'cuda' on a machine without one: fail before anything is written
    run_dir = resolve_run_dir(settings.output_dir, settings.run_name, settings.resume_from, settings.strategy)

    model = new_model(settings)  # only its trainable tensors travel; the server keeps the frozen rest
    if settings.resume_from:
        checkpoint = Checkpoint.load(run_dir / CHECKPOINT_FILE)
        start_round = checkpoint.round
        initial = encode(checkpoint.arrays)
        logger.info("[fedweigh] resuming %s after round %d", run_dir, start_round)
        for what in client_held_state(settings):
            logger.warning(
                "[fedweigh] %s lives on the clients, not in the checkpoint; the resumed run starts it afresh, so it "
                "will not end exactly where an uninterrupted run would",
                what,
            )
    else:
        start_round = 0
        initial = encode(exchanged_state(model))

    grid = wakeup_grid(grid, settings.event_driven_simulation)  # a simulation: replies picked up when stored
    directory = NodeDirectory()
    nodes = directory.await_federation(grid, settings.min_train_nodes)
    num_partitions = directory.num_partitions or len(nodes)
    if problems := federation_problems(settings, num_partitions):
        raise SettingsError(problems)
    server_data, test = server_and_test_data(settings, num_partitions)
    if server_data is not None:
        logger.info(
            "[fedweigh] server data: %d images (%s, %s)", len(server_data), server_data.kind, server_data.source
        )
    strategy = build_strategy(
        settings,
        round_offset=start_round,
        server_data=server_data,
        directory=directory,
        frozen_digest=frozen_digest(model),
    )
    if settings.resume_from:
        strategy.load_state(checkpoint.strategy_state)

    if strategy.faults is not None:
        logger.warning(
            "[fedweigh] fault injection: %s of each round's clients commit %s",
            settings.faults.fraction,
            ", ".join(strategy.faults.kinds),
        )
        if "duplicate" in strategy.faults.kinds:
            grid = ReplayGrid(grid)  # the transport's fault: some replies delivered twice

    recorder = RunRecorder(run_dir, open_trackers(settings, run_dir))
    recorder.begin(
        settings.model_dump(by_alias=True), start_round, instruction=strategy.recipe, num_partitions=num_partitions
    )
    logger.info("[fedweigh] results: %s", run_dir)
    checkpoints = CheckpointWriter(run_dir / CHECKPOINT_FILE)
    try:
        result = strategy.start(
            grid=grid,
            initial_arrays=initial,
            num_rounds=settings.num_server_rounds - start_round,
            timeout=settings.round_timeout,
            evaluate_fn=central_evaluation(settings, test, strategy, recorder, checkpoints, model),
        )
        checkpoints.close()  # the last round's checkpoint is on disk before the run reports its end
        final_round = max(result.evaluate_metrics_serverapp, default=None)
        final = dict(result.evaluate_metrics_serverapp[final_round]) if final_round else {}
        final_arrays = result.arrays if result.arrays is not None else initial
        tail = final_u_tail(settings, model, final_arrays, test)
        summary = recorder.finish(final_arrays.to_torch_state_dict(), final, tail)
    except BaseException as err:
        try:
            checkpoints.close()  # what was written stays resumable
        except Exception:  # noqa: BLE001 - the run's own error is the one to raise
            logger.exception("[fedweigh] the last checkpoint could not be written")
        recorder.fail(err)  # the trackers' runs end FAILED (KILLED when interrupted)
        raise
    if lost := summary[ROUNDS_NOT_AGGREGATED]:
        logger.warning(
            "[fedweigh] %d of %d rounds were not aggregated (the global model stayed as it was): %s; "
            "metrics.jsonl's left_out says why",
            len(lost),
            summary["rounds"],
            ", ".join(map(str, lost)),
        )
    logger.info(
        "[fedweigh] done: final accuracy %.4f after %d rounds; results in %s",
        summary["final_accuracy"] if summary["final_accuracy"] is not None else float("nan"),
        summary["rounds"],
        run_dir,
    )
