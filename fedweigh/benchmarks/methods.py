"""Method overhead: each strategy's round time against FedAvg's on the same run config.

Every strategy runs the same setting (same clients, data, model, recipe) as a
simulation with one ClientApp at a time; the cost of a method is what its
rounds take beyond FedAvg's. Round 1 is left out (it includes the actor's
first data load) and the median of the other rounds is taken, which a busy
shared machine disturbs less than the mean. Per round the report gives the
ServerApp's round seconds and the clients' summed ``train-seconds`` (the
local training loop alone: a method's client steps, such as OUI's probe or
UFL's MC-dropout passes, run outside it), so the cost of the steps and the
server rule shows as round time beyond the training.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedweigh.benchmarks.common import Setting, run_timed

__all__ = ["method_overhead"]


def _median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if len(values) else None


def method_overhead(
    setting: Setting, strategies: Sequence[str], sim: Any, output_dir: Path | None = None
) -> dict[str, Any]:
    """Run ``setting`` once per strategy on ``sim``; compare their round times with FedAvg's."""
    names = ["fedavg", *[s for s in strategies if s != "fedavg"]]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=output_dir) as scratch:
        for name in names:
            config = {**setting.run_config, "strategy": name, "output-dir": scratch, "run-name": f"method-{name}"}
            timed = run_timed(sim, config, setting.num_supernodes, cpus_per_client=os.cpu_count() or 1)
            if not timed.ok:
                rows.append({"strategy": name, "status": timed.status})
                continue
            rounds, train = timed.round_seconds(), timed.train_seconds()
            rows.append(
                {
                    "strategy": name,
                    "status": "ok",
                    "round_seconds": round(_median(rounds[1:]) or rounds[0], 3),
                    "client_train_seconds": round(_median(train[1:]) or train[0], 3),
                    "rounds": [round(r, 3) for r in rounds],
                    "final_accuracy": timed.accuracies()[-1],
                    "wall_seconds": round(timed.wall_seconds, 2),
                }
            )
    base = next((r for r in rows if r["strategy"] == "fedavg" and r["status"] == "ok"), None)
    for row in rows:
        if base is not None and row["status"] == "ok":
            row["round_ratio"] = round(row["round_seconds"] / base["round_seconds"], 3)
            row["extra_seconds_per_round"] = round(row["round_seconds"] - base["round_seconds"], 3)
    return {"setting": setting.name, "run_config": setting.run_config, "strategies": rows}
