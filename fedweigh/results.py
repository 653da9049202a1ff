"""Where a run leaves its results, and how it is resumed.

Each run writes one folder, ``<output-dir>/<run-name>/``::

    config.json        the resolved settings (defaults filled in), the train
                       instruction every client receives, and versions
    metrics.jsonl      one JSON object per round: central accuracy and loss,
                       mean client train loss, round seconds, the sampled
                       partitions, each client's weight and signals, the
                       clients left out and why, the rule's diagnostics
    checkpoint.pt      the latest round's global model and strategy state
    model.pt           the final global model (a PyTorch state_dict)
    summary.json       final and best accuracy, final loss, rounds, seconds

A run started with ``resume-from=<run folder>`` continues in that folder from
its checkpoint; because client sampling and client seeds depend only on (seed,
round, partition), it ends exactly where the uninterrupted run would have.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

logger = logging.getLogger("flwr.fedweigh")

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_FILE = "checkpoint.pt"
MODEL_FILE = "model.pt"
SUMMARY_FILE = "summary.json"


@dataclass
class Checkpoint:
    """The state a run needs to continue after round ``round``."""

    round: int
    arrays: dict[str, np.ndarray]
    strategy_state: dict[str, Any]

    def save(self, path: Path) -> None:
        """Write atomically: a crash mid-write never leaves a broken checkpoint."""
        partial = path.with_suffix(".partial")
        torch.save({"round": self.round, "arrays": self.arrays, "strategy_state": self.strategy_state}, partial)
        os.replace(partial, path)

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        payload = torch.load(path, weights_only=False)
        return cls(round=payload["round"], arrays=payload["arrays"], strategy_state=payload["strategy_state"])


def default_run_name(strategy: str) -> str:
    """``<strategy>-<UTC time>``, e.g. ``fedavg-20261122-101500``."""
    return f"{strategy}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"


def resolve_run_dir(output_dir: str, run_name: str, resume_from: str, strategy: str) -> Path:
    """The folder of this run: the resumed one, or ``output-dir/run-name``."""
    if resume_from:
        folder = Path(resume_from).expanduser()
        if not (folder / CHECKPOINT_FILE).is_file():
            raise ValueError(
                f"setting resume-from = {resume_from!r}: no {CHECKPOINT_FILE} there; "
                "accepted: the folder of an earlier run of this app"
            )
        return folder
    return Path(output_dir).expanduser() / (run_name or default_run_name(strategy))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunRecorder:
    """Writes a run's folder as the run goes."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.started = time.perf_counter()
        self.last_mark = self.started
        self.accuracies: dict[int, float] = {}
        self.last_round = 0

    def begin(
        self, settings: Mapping[str, Any], resumed_round: int, instruction: Mapping[str, Any] | None = None
    ) -> None:
        """Create the folder, write the config, drop rounds after a resume point.

        ``instruction`` is the train config every client receives (its
        per-round values, such as the learning rate, are in each round's record).
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = {
            "settings": dict(settings),
            "instruction": dict(instruction or {}),
            "resumed_from_round": resumed_round,
            "versions": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "flwr": _version("flwr"),
                "flwr-datasets": _version("flwr-datasets"),
            },
        }
        (self.run_dir / CONFIG_FILE).write_text(json.dumps(_jsonable(config), indent=2))
        metrics = self.run_dir / METRICS_FILE
        kept = []
        if resumed_round and metrics.exists():
            for line in metrics.read_text().splitlines():
                row = json.loads(line)
                if row["round"] <= resumed_round:
                    kept.append(line)
                    self.last_round = max(self.last_round, int(row["round"]))
                    if row.get("accuracy") is not None:
                        self.accuracies[row["round"]] = row["accuracy"]
        metrics.write_text("".join(line + "\n" for line in kept))

    def record_round(self, row: dict[str, Any], num_rounds: int) -> None:
        """Append one round to metrics.jsonl and print a progress line."""
        now = time.perf_counter()
        row = {"round": row["round"], "seconds": round(now - self.last_mark, 3), **row}
        self.last_mark = now
        if row.get("accuracy") is not None:
            self.accuracies[row["round"]] = row["accuracy"]
        with (self.run_dir / METRICS_FILE).open("a") as handle:
            handle.write(json.dumps(_jsonable(row)) + "\n")
        self.last_round = max(self.last_round, int(row["round"]))
        if row.get("accuracy") is None:  # not an evaluation round (evaluate-every)
            logger.info("[fedweigh] round %d/%d  %.1fs", row["round"], num_rounds, row["seconds"])
            return
        logger.info(
            "[fedweigh] round %d/%d  accuracy %.4f  loss %.4f  %.1fs",
            row["round"],
            num_rounds,
            row["accuracy"],
            row.get("loss", float("nan")),
            row["seconds"],
        )

    def finish(self, state_dict: Mapping[str, torch.Tensor], final: Mapping[str, float]) -> dict[str, Any]:
        """Write the final model and summary.json; return the summary."""
        torch.save(dict(state_dict), self.run_dir / MODEL_FILE)
        summary = {
            "final_accuracy": final.get("accuracy"),
            "final_loss": final.get("loss"),
            "best_accuracy": max(self.accuracies.values()) if self.accuracies else None,
            "rounds": self.last_round,
            "seconds": round(time.perf_counter() - self.started, 2),
            "run_dir": str(self.run_dir),
        }
        (self.run_dir / SUMMARY_FILE).write_text(json.dumps(_jsonable(summary), indent=2))
        return summary


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl."""
    path = Path(run_dir) / METRICS_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"
