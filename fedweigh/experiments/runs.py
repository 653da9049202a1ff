"""What a finished (or interrupted) run of a grid left behind, and its accuracy scores.

Per run, from the central test accuracy ``acc_1 .. acc_T`` of its rounds:

* **final** = ``acc_T``;
* **best** = ``max_t acc_t`` (selected on test data, so optimistic);
* **mean** = ``mean_t acc_t`` (the FedNolowe paper's tables report this);
* **AUC** = trapezoid of ``acc_1 .. acc_T`` with unit spacing, divided by
  ``T - 1`` (the FedOUI paper's definition; a mean-like number in [0, 1]);
  for ``T = 1`` it is ``acc_1``.

:func:`collect_results` reads every planned run's folder into a
:class:`RunResult`; the report (:mod:`fedweigh.experiments.report`) and the
plots (:mod:`fedweigh.experiments.plots`) both start from those.

Example
-------
>>> scores = run_scores([0.2, 0.4, 0.3])
>>> scores.final, scores.best, round(scores.mean, 4), round(scores.auc, 4)
(0.3, 0.4, 0.3, 0.325)
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedweigh.experiments.grid import PlannedRun, read_run_record
from fedweigh.results import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, read_metrics


def accuracy_auc(accuracies: Sequence[float]) -> float:
    """Trapezoid over rounds ``1..T`` (unit spacing) divided by ``T - 1``; ``acc_1`` when ``T = 1``.

    >>> accuracy_auc([0.5, 0.5, 0.5]), accuracy_auc([0.0, 1.0]), accuracy_auc([0.7])
    (0.5, 0.5, 0.7)
    """
    values = np.asarray(accuracies, dtype=np.float64)
    if values.size == 0:
        raise ValueError("accuracy_auc needs at least one round")
    if values.size == 1:
        return float(values[0])
    return float(np.trapezoid(values) / (values.size - 1))


@dataclass(frozen=True)
class RunScores:
    """The accuracy scores of one run (see the module docstring)."""

    final: float
    best: float
    mean: float
    auc: float
    rounds: int

    def get(self, name: str) -> float:
        return float(getattr(self, name))


def run_scores(accuracies: Sequence[float]) -> RunScores:
    """Final, best, mean-over-rounds and AUC of ``acc_1 .. acc_T``."""
    values = [float(a) for a in accuracies]
    if not values:
        raise ValueError("run_scores needs at least one round")
    return RunScores(
        final=values[-1], best=max(values), mean=float(np.mean(values)), auc=accuracy_auc(values), rounds=len(values)
    )


@dataclass
class RunResult:
    """What one (arm, seed) run left in its folder."""

    run: PlannedRun
    status: str  # "finished", "incomplete (k/T rounds)", "missing"
    rows: list[dict[str, Any]] = field(default_factory=list)
    scores: RunScores | None = None
    final_loss: float | None = None
    wall_seconds: float | None = None
    server_seconds: float | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.scores is not None

    def csv_row(self, experiment: str) -> dict[str, Any]:
        scores = self.scores
        return {
            "experiment": experiment,
            "arm": self.run.arm,
            "strategy": self.run.strategy,
            "seed": self.run.seed,
            "run_name": self.run.name,
            "status": self.status,
            "rounds": len(self.rows),
            "final_accuracy": _cell(scores.final if scores else None),
            "best_accuracy": _cell(scores.best if scores else None),
            "mean_accuracy": _cell(scores.mean if scores else None),
            "auc_accuracy": _cell(scores.auc if scores else None),
            "final_loss": _cell(self.final_loss),
            "wall_seconds": _cell(self.wall_seconds, 2),
            "server_seconds": _cell(self.server_seconds, 2),
            "run_dir": str(self.run.run_dir),
        }


def _cell(value: float | None, digits: int = 6) -> str:
    return "" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def collect_results(runs: Sequence[PlannedRun]) -> list[RunResult]:
    """Read every planned run's folder; runs not (fully) done are marked, not scored."""
    results = []
    for run in runs:
        folder = run.run_dir
        if not (folder / METRICS_FILE).is_file():
            results.append(RunResult(run, "missing"))
            continue
        rows = sorted(read_metrics(folder), key=lambda row: row["round"])
        summary = _read_json(folder / SUMMARY_FILE)
        config = _read_json(folder / CONFIG_FILE)
        record = read_run_record(folder) or {}
        accuracies = [row.get("accuracy") for row in rows]
        complete = (
            isinstance(summary, dict)
            and summary.get("rounds") == run.rounds
            and [row["round"] for row in rows] == list(range(1, run.rounds + 1))
            and all(isinstance(a, int | float) for a in accuracies)
        )
        segments = record.get("segments", [])
        wall = sum(float(s.get("wall_seconds") or 0.0) for s in segments) if segments else None
        result = RunResult(
            run,
            "finished" if complete else f"incomplete ({len(rows)}/{run.rounds} rounds)",
            rows=rows,
            wall_seconds=wall,
            server_seconds=summary.get("seconds") if isinstance(summary, dict) else None,
            settings=config.get("settings", {}) if isinstance(config, dict) else {},
        )
        if complete:
            result.scores = run_scores(accuracies)
            result.final_loss = rows[-1].get("loss")
        results.append(result)
    return results
