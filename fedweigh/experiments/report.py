"""The experiment's table: ``results.csv`` (one row per run) and ``summary.md`` (per arm).

Per run, from the central test accuracy ``acc_1 .. acc_T`` of its rounds:

* **final** = ``acc_T``;
* **best** = ``max_t acc_t`` (selected on test data, so optimistic);
* **mean** = ``mean_t acc_t`` (the FedNolowe paper's tables report this);
* **AUC** = trapezoid of ``acc_1 .. acc_T`` with unit spacing, divided by
  ``T - 1`` (the FedOUI paper's definition; a mean-like number in [0, 1]);
  for ``T = 1`` it is ``acc_1``.

Per arm: mean ± sample standard deviation (``ddof=1``) over seeds, with the
paper's reported numbers beside them when the experiment file gives them.

The report also checks what makes a comparison paired: for each seed, every
arm (with the same sampling settings) must have trained the same clients in
every round. If that does not hold, ``summary.md`` says so at the top and
:func:`write_report` raises :class:`SamplingMismatchError` after writing.

Example
-------
>>> scores = run_scores([0.2, 0.4, 0.3])
>>> scores.final, scores.best, round(scores.mean, 4), round(scores.auc, 4)
(0.3, 0.4, 0.3, 0.325)
>>> mean_std([0.2, 0.4])
(0.30000000000000004, 0.14142135623730953)
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from fedweigh.experiments.grid import PlannedRun, read_run_record
from fedweigh.experiments.spec import SCORE_NAMES, Experiment, Reported
from fedweigh.results import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, read_metrics

__all__ = [
    "CSV_COLUMNS",
    "ArmSummary",
    "RunResult",
    "RunScores",
    "SamplingCheck",
    "SamplingMismatchError",
    "accuracy_auc",
    "check_sampling",
    "collect_results",
    "mean_std",
    "render_summary",
    "run_scores",
    "summarize_arms",
    "write_report",
    "write_results_csv",
]

RESULTS_CSV = "results.csv"
SUMMARY_MD = "summary.md"

CSV_COLUMNS = (
    "experiment",
    "arm",
    "strategy",
    "seed",
    "run_name",
    "status",
    "rounds",
    "final_accuracy",
    "best_accuracy",
    "mean_accuracy",
    "auc_accuracy",
    "final_loss",
    "wall_seconds",
    "server_seconds",
    "run_dir",
)

# Settings that change which clients a round samples; arms differing in them are not paired.
SAMPLING_SETTINGS = ("fraction-train", "min-train-nodes")


class SamplingMismatchError(RuntimeError):
    """Arms of one seed trained different clients: the comparison is not paired."""


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


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (``ddof=1``; None for one value)."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        raise ValueError("mean_std needs at least one value")
    return float(array.mean()), (float(array.std(ddof=1)) if array.size > 1 else None)


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


def write_results_csv(results: Sequence[RunResult], path: Path, experiment: str) -> Path:
    """One row per run (see :data:`CSV_COLUMNS`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for result in results:
            writer.writerow(result.csv_row(experiment))
    return path


@dataclass(frozen=True)
class SamplingCheck:
    """Whether every arm of a seed trained the same clients, round by round."""

    ok: bool
    lines: tuple[str, ...]


def _sampling_group(result: RunResult) -> tuple[Any, ...]:
    return tuple(result.settings.get(key) for key in SAMPLING_SETTINGS)


def check_sampling(results: Sequence[RunResult]) -> SamplingCheck:
    """Compare the ``sampled`` partitions of every round across the arms of each seed.

    Arms whose sampling settings (``fraction-train``, ``min-train-nodes``)
    differ are compared only within their own group. Runs that are not
    finished are left out.
    """
    finished = [r for r in results if r.finished]
    seeds = sorted({r.run.seed for r in finished})
    ok, lines = True, []
    for seed in seeds:
        groups: dict[tuple[Any, ...], list[RunResult]] = {}
        for result in (r for r in finished if r.run.seed == seed):
            groups.setdefault(_sampling_group(result), []).append(result)
        for members in groups.values():
            if len(members) < 2:
                continue
            rounds = min(len(r.rows) for r in members)
            reference = members[0]
            paired = True
            for other in members[1:]:
                for index in range(rounds):
                    left, right = reference.rows[index].get("sampled"), other.rows[index].get("sampled")
                    if left != right:
                        paired = ok = False
                        lines.append(
                            f"seed {seed}, round {index + 1}: {reference.run.arm} sampled {left}, "
                            f"{other.run.arm} sampled {right}"
                        )
                        break
            if paired:
                arms = ", ".join(r.run.arm for r in members)
                lines.append(f"seed {seed}: the same clients in all {rounds} rounds for {arms}")
    if not lines:
        lines.append("fewer than two finished arms per seed: nothing to compare")
    return SamplingCheck(ok, tuple(lines))


@dataclass(frozen=True)
class ArmSummary:
    """Mean ± std over seeds of one arm's scores."""

    arm: str
    strategy: str
    finished: int
    planned: int
    scores: dict[str, tuple[float, float | None]]
    wall_seconds: float | None
    paper: Mapping[str, Reported]


def summarize_arms(experiment: Experiment, results: Sequence[RunResult]) -> list[ArmSummary]:
    """Per arm, in the experiment file's order."""
    summaries = []
    for arm in experiment.arms:
        mine = [r for r in results if r.run.arm == arm.name]
        done = [r for r in mine if r.finished]
        scores = {name: mean_std([r.scores.get(name) for r in done]) for name in SCORE_NAMES} if done else {}
        walls = [r.wall_seconds for r in done if r.wall_seconds is not None]
        summaries.append(
            ArmSummary(
                arm=arm.name,
                strategy=arm.strategy,
                finished=len(done),
                planned=len(mine),
                scores=scores,
                wall_seconds=float(np.mean(walls)) if walls else None,
                paper=dict(arm.paper),
            )
        )
    return summaries


_HEADINGS = {"final": "final", "best": "best", "mean": "mean over rounds", "auc": "AUC"}


def _format_score(value: tuple[float, float | None] | None) -> str:
    if value is None:
        return "–"
    mean, std = value
    return f"{mean:.4f}" if std is None else f"{mean:.4f} ± {std:.4f}"


def render_summary(
    experiment: Experiment,
    summaries: Sequence[ArmSummary],
    sampling: SamplingCheck,
    results: Sequence[RunResult],
    plots: Sequence[Path] = (),
    output_dir: Path | None = None,
) -> str:
    """The text of ``summary.md``."""
    spec = experiment.spec.experiment
    rounds = sorted({r.run.rounds for r in results})
    lines = [f"# {spec.name}", ""]
    if spec.description:
        lines += [spec.description.strip(), ""]
    if experiment.settings:
        values = ", ".join(f"`{key} = {value}`" for key, value in experiment.settings.items())
        lines += [f"Set for every run on the command line (`--set`), over the file: {values}.", ""]
    if not sampling.ok:
        lines += [
            "**WARNING: client sampling differs between arms of the same seed; the comparison is not paired.**",
            "",
        ]
    lines.append(
        f"Seeds {', '.join(map(str, experiment.seeds))}; {'/'.join(map(str, rounds))} rounds; "
        f"{spec.num_supernodes} simulated clients. Central test accuracy; mean ± sample std (ddof=1) over seeds."
    )
    lines.append("")
    has_paper = any(s.paper for s in summaries)
    header = ["arm", "strategy", "runs", *(_HEADINGS[name] for name in SCORE_NAMES), "wall s/run"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for summary in summaries:
        cells = [summary.arm, summary.strategy, f"{summary.finished}/{summary.planned}"]
        for name in SCORE_NAMES:
            cell = _format_score(summary.scores.get(name))
            if name in summary.paper:
                cell += f" (paper {summary.paper[name]})"
            cells.append(cell)
        cells.append("–" if summary.wall_seconds is None else f"{summary.wall_seconds:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if has_paper:
        source = f": {spec.paper_source}" if spec.paper_source else ""
        lines.append(f"(paper ...) = the numbers the paper reports{source}.")
        if experiment.settings:
            lines.append("They are for the file's own setting, not necessarily for the values set with `--set`.")
        lines.append("")
    verdict = "identical across arms" if sampling.ok else "NOT identical across arms"
    lines.append(f"Client sampling: {verdict}.")
    lines += [f"- {line}" for line in sampling.lines]
    lines.append("")
    unfinished = [r for r in results if not r.finished]
    if unfinished:
        lines.append("Not in the table (not finished):")
        lines += [f"- {r.run.name}: {r.status}" for r in unfinished]
        lines.append("")
    if plots:
        lines.append("Plots:")
        for plot in plots:
            shown = plot.relative_to(output_dir) if output_dir and plot.is_relative_to(output_dir) else plot
            lines.append(f"- [{shown}]({shown})")
        lines.append("")
    lines.append(f"Per-run numbers: {RESULTS_CSV}. Generated {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Report:
    """Where the report went and what it found."""

    results_csv: Path
    summary_md: Path
    plots: tuple[Path, ...]
    results: tuple[RunResult, ...]
    sampling: SamplingCheck


def write_report(experiment: Experiment, runs: Sequence[PlannedRun], output_dir: Path, *, plots: bool = True) -> Report:
    """Write ``results.csv``, the plots and ``summary.md`` into ``output_dir``.

    Raises
    ------
    SamplingMismatchError
        After writing everything, when arms of one seed sampled different clients.
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    results = collect_results(runs)
    csv_path = write_results_csv(results, output_dir / RESULTS_CSV, experiment.name)
    sampling = check_sampling(results)
    drawn: list[Path] = []
    if plots and any(r.finished for r in results):
        from fedweigh.experiments.plots import draw_all

        drawn = draw_all(experiment, [r for r in results if r.finished], output_dir / "plots")
    summary = render_summary(experiment, summarize_arms(experiment, results), sampling, results, drawn, output_dir)
    summary_path = output_dir / SUMMARY_MD
    summary_path.write_text(summary, encoding="utf-8")
    if not sampling.ok:
        raise SamplingMismatchError(
            "client sampling differs between arms of the same seed (see "
            f"{summary_path}):\n" + "\n".join(f"  - {line}" for line in sampling.lines)
        )
    return Report(csv_path, summary_path, tuple(drawn), tuple(results), sampling)
