"""Run an experiment's grid: one simulation SuperLink, one ``flwr run`` per (arm, seed).

Each run is exactly what ``fedweigh simulate`` (and so ``flwr run``) does for
a user; the runner only chooses the run config, watches the streamed log for
``[fedweigh] round r/T`` lines to show progress (:mod:`fedweigh.launch.progress`),
keeps each run's log under ``<output-dir>/logs/`` and records each run's wall
time. Runs already done
are skipped and interrupted ones resumed (:mod:`fedweigh.experiments.grid`);
a failed run does not stop the grid. At the end the table and plots are
written (:mod:`fedweigh.experiments.report`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
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
from fedweigh.launch.commands import COMPLETED
from fedweigh.launch.progress import RunsProgress
from fedweigh.run_folder import set_aside

__all__ = ["data_problems", "plan_experiment", "run_experiment"]


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
    progress = RunsProgress(plans, label="experiment", out=out)
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
                if plan.action is Action.START and (aside := set_aside(plan.run.run_dir)) is not None:
                    launcher_log.write(f"[experiment] {plan.run.name}: {plan.note}; the earlier files are in {aside}\n")
                progress.start_run(plan)
                started, started_at = time.monotonic(), datetime.now(UTC).isoformat(timespec="seconds")
                status, details, run_id = "interrupted", "", None
                try:
                    outcome = sim.run(
                        plan.run_config,
                        num_supernodes=spec.num_supernodes,
                        cpus_per_client=spec.cpus_per_client,
                        gpus_per_client=spec.gpus_per_client,
                        echo=False,  # echoed above the progress line instead
                        log_path=logs / f"{plan.run.name}.log",
                        on_line=progress.echo_and_watch(sys.stdout) if echo else progress.on_line,
                    )
                    status, details, run_id = outcome.status, outcome.details, outcome.run_id
                    if status != COMPLETED and outcome.results_complete(plan.rounds):
                        status = COMPLETED  # killed after it wrote its model and summary: the run is whole
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
                ok = status == COMPLETED
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
