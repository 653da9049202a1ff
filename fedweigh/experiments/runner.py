"""Run an experiment's grid: one simulation SuperLink, one ``flwr run`` per (arm, seed).

Each run is exactly what ``fedweigh simulate`` (and so ``flwr run``) does for
a user; the runner only chooses the run config, watches the streamed log for
``[fedweigh] round r/T`` lines to show progress, keeps each run's log under
``<output-dir>/logs/`` and records each run's wall time. Runs already done
are skipped and interrupted ones resumed (:mod:`fedweigh.experiments.grid`);
a failed run does not stop the grid. At the end the table and plots are
written (:mod:`fedweigh.experiments.report`).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from fedweigh.experiments.grid import (
    Action,
    PlannedRun,
    RunPlan,
    expand_grid,
    expected_settings,
    plan_grid,
    record_segment,
    run_settings,
)
from fedweigh.experiments.report import Report, write_report
from fedweigh.experiments.spec import Experiment, ExperimentError

__all__ = ["GridProgress", "RoundLine", "format_duration", "parse_round_line", "plan_experiment", "run_experiment"]

# RunRecorder.record_round logs "[fedweigh] round 3/10  accuracy 0.4123  loss 1.6620  2.1s".
_ROUND_LINE = re.compile(
    r"\[fedweigh\] round (\d+)/(\d+)\s+accuracy\s+(\S+)\s+loss\s+(\S+)\s+([0-9.]+)s",
)


@dataclass(frozen=True)
class RoundLine:
    """One parsed ``[fedweigh] round`` log line."""

    round: int
    total: int
    accuracy: float
    loss: float
    seconds: float


def parse_round_line(line: str) -> RoundLine | None:
    """Parse a run's progress line; None for any other line.

    >>> parse_round_line("INFO :      [fedweigh] round 3/10  accuracy 0.4123  loss 1.6620  2.1s")
    RoundLine(round=3, total=10, accuracy=0.4123, loss=1.662, seconds=2.1)
    >>> parse_round_line("INFO :      [ROUND 3/10]") is None
    True
    """
    match = _ROUND_LINE.search(line)
    if not match:
        return None
    return RoundLine(
        int(match.group(1)), int(match.group(2)), float(match.group(3)), float(match.group(4)), float(match.group(5))
    )


def format_duration(seconds: float | None) -> str:
    """``1h02m``, ``5m07s``, ``42s``; ``?`` when unknown.

    >>> format_duration(3725), format_duration(307), format_duration(42.4), format_duration(None)
    ('1h02m', '5m07s', '42s', '?')
    """
    if seconds is None:
        return "?"
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


@dataclass
class GridProgress:
    """Progress of the grid: runs done, the current run's round, time left.

    The time left is estimated from what was measured so far: the mean wall
    time of a round (from consecutive round lines, spread over the rounds
    between them when only every few rounds print one) times the rounds still to
    go, plus each remaining run's fixed cost (start-up and shut-down: a
    finished run's wall time minus its rounds).
    """

    plans: Sequence[RunPlan]
    out: TextIO = field(default_factory=lambda: sys.stderr)
    clock: Callable[[], float] = time.monotonic
    done: int = 0
    current: RunPlan | None = None
    current_round: int = 0
    last_accuracy: float | None = None
    round_seconds: list[float] = field(default_factory=list)
    reported_seconds: list[float] = field(default_factory=list)
    fixed_seconds: list[float] = field(default_factory=list)
    _run_started: float = 0.0
    _last_mark: float = 0.0
    _live: bool = False

    def __post_init__(self) -> None:
        self.total = len(self.plans)
        self.done = sum(1 for plan in self.plans if plan.action is Action.SKIP)
        self._live = bool(getattr(self.out, "isatty", lambda: False)())

    def start_run(self, plan: RunPlan) -> None:
        self.current = plan
        self.current_round = plan.done_rounds
        self.last_accuracy = None
        self._run_started = self._last_mark = self.clock()
        self.show()

    def on_line(self, line: str) -> None:
        """Feed a log line of the current run; shows progress on round lines."""
        parsed = parse_round_line(line)
        if parsed is None or self.current is None:
            return
        now = self.clock()
        rounds = parsed.round - self.current_round  # more than one when rounds are evaluated every few
        if self.current_round > self.current.done_rounds and rounds > 0:  # the first line carries the start-up
            self.round_seconds.extend([(now - self._last_mark) / rounds] * rounds)
        self.reported_seconds.append(parsed.seconds)
        self._last_mark = now
        self.current_round = parsed.round
        self.last_accuracy = parsed.accuracy
        self.show()

    def finish_run(self, ok: bool) -> None:
        wall = self.clock() - self._run_started
        if ok and self.current is not None:
            rounds_done = self.current_round - self.current.done_rounds
            per_round = self.mean_round_seconds() or 0.0
            self.fixed_seconds.append(max(0.0, wall - rounds_done * per_round))
        self.done += 1
        self.current = None
        self.show(final=True)

    def mean_round_seconds(self) -> float | None:
        """Mean wall time between round lines; the rounds' own times until two rounds were seen."""
        measured = self.round_seconds or self.reported_seconds
        return sum(measured) / len(measured) if measured else None

    def seconds_left(self) -> float | None:
        per_round = self.mean_round_seconds()
        if per_round is None:
            return None
        fixed = sum(self.fixed_seconds) / len(self.fixed_seconds) if self.fixed_seconds else 0.0
        pending = [p for p in self.plans if p.action is not Action.SKIP]
        started = self.done - (self.total - len(pending))
        future = pending[started + (1 if self.current else 0) :]
        left = sum(p.remaining_rounds for p in future) * per_round + len(future) * fixed
        if self.current is not None:
            left += (self.current.run.rounds - self.current_round) * per_round
            if self.current_round == self.current.done_rounds:  # still starting up
                left += max(0.0, fixed - (self.clock() - self._run_started))
        return left

    def line(self) -> str:
        text = f"[experiment] runs {self.done}/{self.total} done"
        if self.current is not None:
            run = self.current.run
            text += f" | {run.name}: round {self.current_round}/{run.rounds}"
            if self.last_accuracy is not None:
                text += f" acc {self.last_accuracy:.4f}"
        text += f" | left ~{format_duration(self.seconds_left())}"
        return text

    def show(self, final: bool = False) -> None:
        if self._live:
            self.out.write("\r\x1b[2K" + self.line() + ("\n" if final else ""))
        else:
            self.out.write(self.line() + "\n")
        self.out.flush()


def plan_experiment(
    experiment: Experiment, output_dir: Path, app_defaults: dict[str, Any], cwd: Path | None = None
) -> tuple[list[PlannedRun], list[RunPlan]]:
    """Expand the grid and decide each run's action (raises on conflicting folders)."""
    cwd = Path.cwd() if cwd is None else Path(cwd)
    runs = expand_grid(experiment, output_dir, app_defaults)
    expected = {run.name: expected_settings(run, app_defaults, cwd) for run in runs}
    return runs, plan_grid(runs, expected)


def data_problems(
    plans: Sequence[RunPlan], app_defaults: dict[str, Any], num_partitions: int, cwd: Path | None = None
) -> list[str]:
    """Runs whose data cannot be split ``num_partitions`` ways, each with the reason.

    Checked once per distinct split (dataset, partitioner, seed, ...), before
    anything runs: otherwise a grid learns that, say, Flower Datasets'
    Dirichlet partitioner gives up for seed 3 only when it reaches seed 3's
    runs, possibly hours in.
    """
    from fedweigh.components import data_spec
    from fedweigh.preflight import data_problems as split_problems

    cwd = Path.cwd() if cwd is None else Path(cwd)
    verdicts: dict[Any, str | None] = {}
    problems = []
    for plan in plans:
        settings = run_settings(plan.run, app_defaults, cwd)
        split = data_spec(settings, num_partitions)
        if split not in verdicts:
            found = split_problems(settings, num_partitions)
            verdicts[split] = "; ".join(found) if found else None
        if verdicts[split] is not None:
            problems.append(f"{plan.run.name}: {verdicts[split]}")
    return problems


@dataclass(frozen=True)
class GridOutcome:
    """What ``run_experiment`` did."""

    plans: tuple[RunPlan, ...]
    failed: tuple[str, ...]
    report: Report | None


def run_experiment(
    experiment: Experiment,
    output_dir: Path,
    app_dir: Path,
    app_defaults: dict[str, Any],
    *,
    port: int,
    echo: bool = False,
    out: TextIO | None = None,
    simulation: Any = None,
    report_dir: Path | None = None,
) -> GridOutcome:
    """Run every (arm, seed) that is not done yet, then write the report.

    Parameters
    ----------
    simulation : LocalSimulation, optional
        An already started simulation to submit to (tests share one);
        otherwise one is started on ``port`` for the grid and stopped after.
    report_dir : Path, optional
        Where ``results.csv``, ``summary.md`` and ``plots/`` go (default:
        ``output_dir``; the runs and their logs stay there).
    """
    from fedweigh.launch.connection import DEFAULT_CONNECTION
    from fedweigh.launch.simulation import LocalSimulation

    out = out or sys.stderr
    output_dir = Path(output_dir)
    runs, plans = plan_experiment(experiment, output_dir, app_defaults)
    todo = [plan for plan in plans if plan.action is not Action.SKIP]
    output_dir.mkdir(parents=True, exist_ok=True)
    logs = output_dir / "logs"
    logs.mkdir(exist_ok=True)
    progress = GridProgress(plans, out=out)
    failed: list[str] = []
    spec = experiment.spec.experiment
    if problems := data_problems(todo, app_defaults, spec.num_supernodes):
        raise ExperimentError(
            "runs whose data cannot be split, nothing was run:\n" + "\n".join(f"  - {problem}" for problem in problems)
        )
    if todo:
        own = simulation is None
        # The launcher's own messages (SuperLink start, each `flwr run` command) go to a log
        # file, so that the progress line stays alone on the terminal.
        launcher_log = (logs / "launcher.log").open("a", encoding="utf-8")  # noqa: SIM115
        connection = f"{DEFAULT_CONNECTION}-{port}"
        sim = simulation or LocalSimulation(
            app_dir, port=port, connection=connection, out=launcher_log, shared_ray=True
        )
        out.write(f"[experiment] {len(todo)} run(s) to go; Flower's logs go to {logs}\n")
        try:
            if own:
                sim.start()
            for plan in todo:
                progress.start_run(plan)
                started, started_at = time.monotonic(), datetime.now(UTC).isoformat(timespec="seconds")
                status, details, run_id = "interrupted", "", None
                try:
                    outcome = sim.run(
                        plan.run_config,
                        num_supernodes=spec.num_supernodes,
                        cpus_per_client=spec.cpus_per_client,
                        gpus_per_client=spec.gpus_per_client,
                        echo=echo,
                        log_path=logs / f"{plan.run.name}.log",
                        on_line=progress.on_line,
                    )
                    status, details, run_id = outcome.status, outcome.details, outcome.run_id
                finally:
                    record_segment(
                        plan.run.run_dir,
                        plan.run,
                        {
                            "started": started_at,
                            "action": plan.action.value,
                            "from_round": plan.done_rounds,
                            "status": status,
                            "run_id": run_id,
                            "wall_seconds": round(time.monotonic() - started, 2),
                        },
                    )
                ok = status == "finished:completed"
                if not ok:
                    failed.append(plan.run.name)
                    out.write(
                        f"[experiment] {plan.run.name} ended {status}"
                        + (f" ({details})" if details else "")
                        + f"; log: {logs / (plan.run.name + '.log')}\n"
                    )
                progress.finish_run(ok)
        finally:
            if own:
                sim.stop()
            launcher_log.close()
    report = write_report(experiment, runs, report_dir or output_dir)
    return GridOutcome(tuple(plans), tuple(failed), report)
