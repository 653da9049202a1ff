"""Flower's FedAvg with central evaluation; every round's time and accuracy to <output-dir>/<run-name>/metrics.jsonl."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from vanilla_fedavg.task import load_test, new_model, test

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    torch.set_num_threads(1)
    config = context.run_config
    out = Path(str(config["output-dir"])) / str(config["run-name"])
    out.mkdir(parents=True, exist_ok=True)
    testset = load_test(str(config["dataset"]), int(config["test-subset"]), int(config["seed"]))
    rows: list[dict[str, float]] = []
    marks = [time.monotonic()]

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = new_model(int(config["seed"]))
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = test(model, testset)
        now = time.monotonic()
        if server_round > 0:
            rows.append({"round": server_round, "seconds": now - marks[-1], "accuracy": accuracy, "loss": loss})
        marks.append(now)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=1, min_train_nodes=1)
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(new_model(int(config["seed"])).state_dict()),
        num_rounds=int(config["num-server-rounds"]),
        evaluate_fn=evaluate,
    )
    with (out / "metrics.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
