"""The grid of an experiment: one run per (arm, seed), and what each still needs.

Every run has a fixed folder, ``<output-dir>/runs/<arm>-seed<k>/`` (the run
folder of :mod:`fedweigh.results`), so invoking the same experiment again
finds its earlier work:

* ``summary.json`` with all the rounds asked for: the run is done, skipped;
* ``checkpoint.pt`` of an earlier round: the run was interrupted (Ctrl-C, a
  crash, a closed laptop) and is resumed with ``resume-from``; because
  sampling and client seeds depend only on (seed, round, partition) it ends
  exactly where an uninterrupted run would have;
* nothing usable: the run starts (again) from round 1 in that folder.

A folder whose recorded settings differ from what the experiment now asks
for (someone edited the file) is never silently reused: planning fails and
names the run and the settings that differ.

With tracking on (``tracking``), every run of the grid logs into one
TensorBoard folder, ``<output-dir>/tensorboard/<arm>-seed<k>`` (or under the
file's ``tensorboard-dir``), and one MLflow experiment named after the
experiment, in one store (``<output-dir>/mlflow.db`` unless the file gives a
``tracking-uri``), so that the arms overlay in either UI.

Runs go seed by seed (all arms of seed 1, then of seed 2, ...), so a grid
stopped half-way already holds paired comparisons.

Example
-------
>>> from fedweigh.experiments.spec import load_experiment
>>> defaults = {"strategy": "fedavg", "seed": 1, "num-server-rounds": 5, "output-dir": "outputs",
...             "run-name": "", "resume-from": ""}
>>> experiment = load_experiment({"experiment": {"name": "demo", "seeds": [1, 2]},
...     "arms": [{"name": "a", "strategy": "fedavg"}, {"name": "b", "strategy": "fedprox"}]}, defaults)
>>> [run.name for run in expand_grid(experiment, Path("/tmp/demo"), defaults)]
['a-seed1', 'b-seed1', 'a-seed2', 'b-seed2']
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedweigh.experiments.spec import Experiment, ExperimentError
from fedweigh.results import CHECKPOINT_FILE, CONFIG_FILE, SUMMARY_FILE, Checkpoint
from fedweigh.run_folder import shaping_differences
from fedweigh.settings import flatten
from fedweigh.tracking import TENSORBOARD_FOLDER, local_store

if TYPE_CHECKING:
    from fedweigh.settings import Settings

__all__ = [
    "RUNS_FOLDER",
    "RUN_RECORD_FILE",
    "TRACKING_SETTINGS",
    "Action",
    "PlannedRun",
    "RunPlan",
    "expand_grid",
    "expected_settings",
    "grid_tracking",
    "run_settings",
    "inspect_run",
    "plan_grid",
    "read_run_record",
    "record_segment",
    "run_name",
    "settings_differences",
    "tracking_commands",
]

RUNS_FOLDER = "runs"
RUN_RECORD_FILE = "experiment-run.json"
"""Written by the runner in each run folder: arm, seed, and the wall time of every ``flwr run`` segment."""

TRACKING_SETTINGS = frozenset({"tracking", "tensorboard-dir", "tracking-uri", "tracking-experiment"})
"""Where a run's rounds are shown, not what they are: they may change on resuming, and name no output folder."""


def run_name(arm: str, seed: int) -> str:
    """The run folder's name: ``<arm>-seed<k>``.

    >>> run_name("fedoui", 3)
    'fedoui-seed3'
    """
    return f"{arm}-seed{seed}"


@dataclass(frozen=True)
class PlannedRun:
    """One (arm, seed) of the grid.

    Attributes
    ----------
    arm, strategy, seed : str, str, int
        What the run compares.
    rounds : int
        ``num-server-rounds`` asked for.
    run_dir : Path
        Its results folder, ``<output-dir>/runs/<arm>-seed<k>``.
    run_config : dict
        The run-config overrides to submit (``output-dir`` and ``run-name`` included).
    """

    arm: str
    strategy: str
    seed: int
    rounds: int
    run_dir: Path
    run_config: dict[str, Any] = field(hash=False, compare=False)

    @property
    def name(self) -> str:
        return self.run_dir.name


def expand_grid(experiment: Experiment, output_dir: Path, app_defaults: Mapping[str, Any]) -> list[PlannedRun]:
    """Every (arm, seed) of the experiment, seed-major, with its run config and folder."""
    runs_root = Path(output_dir) / RUNS_FOLDER
    planned = []
    for seed in experiment.seeds:
        for arm in experiment.arms:
            name = run_name(arm.name, seed)
            arm_config = experiment.arm_configs[arm.name]
            config = {
                **arm_config,
                "seed": seed,
                "output-dir": str(runs_root),
                "run-name": name,
                **grid_tracking({**app_defaults, **arm_config}, Path(output_dir), name, experiment.name),
            }
            planned.append(
                PlannedRun(
                    arm=arm.name,
                    strategy=arm.strategy,
                    seed=seed,
                    rounds=experiment.rounds(arm.name, app_defaults),
                    run_dir=runs_root / name,
                    run_config=config,
                )
            )
    return planned


def grid_tracking(config: Mapping[str, Any], output_dir: Path, name: str, experiment: str) -> dict[str, Any]:
    """Where run ``name`` of a grid tracks: one TensorBoard folder and one MLflow experiment for the whole grid.

    Empty when ``config`` (the run's full config) tracks nothing.

    >>> grid_tracking({"tracking": "tensorboard", "tensorboard-dir": "", "tracking-uri": "",
    ...                "tracking-experiment": ""}, Path("/grid"), "a-seed1", "demo")
    {'tensorboard-dir': '/grid/tensorboard/a-seed1', 'tracking-uri': 'sqlite:////grid/mlflow.db', \
'tracking-experiment': 'demo'}
    """
    if str(config.get("tracking", "none")).strip() in ("", "none"):
        return {}
    folder = Path(str(config.get("tensorboard-dir") or output_dir / TENSORBOARD_FOLDER))
    return {
        "tensorboard-dir": str(folder / name),
        "tracking-uri": str(config.get("tracking-uri") or local_store(output_dir)),
        "tracking-experiment": str(config.get("tracking-experiment") or experiment),
    }


def tracking_commands(runs: Sequence[PlannedRun], app_defaults: Mapping[str, Any]) -> list[str]:
    """How to open what the grid's runs track: one command per tracker they use.

    >>> run = PlannedRun("a", "fedavg", 1, 2, Path("/g/runs/a-seed1"), {"tracking": "tensorboard",
    ...     **grid_tracking({"tracking": "tensorboard"}, Path("/g"), "a-seed1", "demo")})
    >>> tracking_commands([run], {})
    ['tensorboard --logdir /g/tensorboard']
    """
    commands: dict[str, str] = {}
    for run in runs:
        config = {**app_defaults, **run.run_config}
        names = [name.strip() for name in str(config.get("tracking", "none")).split(",")]
        if "tensorboard" in names:
            commands["tensorboard"] = f"tensorboard --logdir {Path(str(config['tensorboard-dir'])).parent}"
        if "mlflow" in names:
            uri, experiment = config["tracking-uri"], config["tracking-experiment"]
            where = f"mlflow ui --backend-store-uri {uri}" if str(uri).startswith("sqlite:") else f"MLflow at {uri}"
            commands["mlflow"] = f"{where}  (experiment {experiment!r}; the UI comes with pip install mlflow)"
    return list(commands.values())


class Action(Enum):
    """What a run still needs."""

    SKIP = "done"
    RESUME = "resume"
    START = "start"


@dataclass(frozen=True)
class RunPlan:
    """A planned run and what to do with it.

    Attributes
    ----------
    run : PlannedRun
    action : Action
    done_rounds : int
        Rounds already in the folder (the checkpoint's round when resuming).
    note : str
        Why, in words (shown by ``--dry-run``).
    """

    run: PlannedRun
    action: Action
    done_rounds: int = 0
    note: str = ""

    @property
    def name(self) -> str:
        return self.run.name

    @property
    def rounds(self) -> int:
        return self.run.rounds

    @property
    def run_config(self) -> dict[str, Any]:
        """The overrides to submit: with ``resume-from`` when resuming."""
        if self.action is Action.RESUME:
            return {**self.run.run_config, "resume-from": str(self.run.run_dir)}
        return dict(self.run.run_config)

    @property
    def remaining_rounds(self) -> int:
        return 0 if self.action is Action.SKIP else self.run.rounds - self.done_rounds


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def settings_differences(recorded: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    """Settings whose recorded and expected values differ, among those that shape a run.

    Keys present on one side only are ignored (a newer version may add
    settings); so are those a resumed run may change
    (:data:`fedweigh.run_folder.RESUME_MAY_CHANGE`: output folder, run name,
    resume point, number of rounds, trackers, ...).

    >>> settings_differences({"seed": 1, "fedoui": {"window": 1}}, {"seed": 1, "fedoui": {"window": 5}})
    ['fedoui.window: 1 in the folder, 5 now']
    """
    return [
        f"{key}: {old!r} in the folder, {new!r} now"
        for key, old, new in shaping_differences(flatten(recorded), flatten(expected))
    ]


def inspect_run(run: PlannedRun, expected_settings: Mapping[str, Any] | None = None) -> RunPlan:
    """Decide what ``run`` needs from what its folder holds.

    Parameters
    ----------
    run : PlannedRun
    expected_settings : Mapping, optional
        The settings the run would record in ``config.json`` (nested, dashed
        keys); when given, a folder recorded with other settings is an error.

    Raises
    ------
    ExperimentError
        The folder holds a run with other settings, or more rounds than asked for.
    """
    folder = run.run_dir
    if not folder.is_dir():
        return RunPlan(run, Action.START, 0, "new")
    config = _read_json(folder / CONFIG_FILE)
    if expected_settings is not None and isinstance(config, dict) and isinstance(config.get("settings"), dict):
        differences = settings_differences(config["settings"], expected_settings)
        if differences:
            raise ExperimentError(
                f"run {run.name}: {folder} holds a run with other settings ({'; '.join(differences)}); "
                "accepted: the same settings, or another --output-dir (or remove that folder)"
            )
    summary = _read_json(folder / SUMMARY_FILE)
    finished_rounds = int(summary.get("rounds") or 0) if isinstance(summary, dict) else 0
    if finished_rounds == run.rounds:
        return RunPlan(run, Action.SKIP, finished_rounds, "finished")
    if finished_rounds > run.rounds:
        raise ExperimentError(
            f"run {run.name}: {folder} already holds {finished_rounds} rounds, the experiment asks for "
            f"{run.rounds}; accepted: num-server-rounds >= {finished_rounds}, or another --output-dir"
        )
    checkpoint = folder / CHECKPOINT_FILE
    if checkpoint.is_file():
        try:
            done = Checkpoint.load(checkpoint).round
        except Exception as err:  # a damaged file: start over rather than fail the grid
            return RunPlan(run, Action.START, 0, f"unreadable checkpoint ({type(err).__name__}), starting over")
        if done < run.rounds:
            why = "extending a finished run" if finished_rounds else "interrupted"
            return RunPlan(run, Action.RESUME, done, f"{why}: resuming after round {done}")
        if done > run.rounds:
            raise ExperimentError(
                f"run {run.name}: the checkpoint in {folder} is of round {done}, the experiment asks for "
                f"{run.rounds} rounds; accepted: num-server-rounds >= {done}, or another --output-dir"
            )
        return RunPlan(run, Action.START, 0, "last round checkpointed but never finished, starting over")
    return RunPlan(run, Action.START, 0, "no checkpoint, starting over")


def run_settings(run: PlannedRun, app_defaults: Mapping[str, Any], cwd: Path) -> Settings:
    """The settings ``run`` trains with (paths resolved as ``flwr run`` gets them)."""
    from fedweigh.launch.runconfig import prepare_run_config
    from fedweigh.preflight import parse_settings

    return parse_settings({**app_defaults, **prepare_run_config(run.run_config, app_defaults, cwd)})


def expected_settings(run: PlannedRun, app_defaults: Mapping[str, Any], cwd: Path) -> dict[str, Any]:
    """The settings ``run`` records in its ``config.json``."""
    settings = run_settings(run, app_defaults, cwd).model_dump(by_alias=True)
    return json.loads(json.dumps(settings, default=str))


def plan_grid(
    runs: Sequence[PlannedRun], expected_settings: Mapping[str, Mapping[str, Any]] | None = None
) -> list[RunPlan]:
    """:func:`inspect_run` for every run; one :class:`ExperimentError` listing every conflict.

    ``expected_settings`` maps run names to the settings they would record.
    """
    plans, problems = [], []
    for run in runs:
        try:
            plans.append(inspect_run(run, (expected_settings or {}).get(run.name)))
        except ExperimentError as err:
            problems.append(str(err))
    if problems:
        raise ExperimentError("cannot reuse the output folder:\n" + "\n".join(f"  - {p}" for p in problems))
    return plans


def record_segment(run_dir: Path, run: PlannedRun, segment: Mapping[str, Any]) -> None:
    """Append one ``flwr run`` segment (status, wall seconds, ...) to the run's record."""
    path = Path(run_dir) / RUN_RECORD_FILE
    record = read_run_record(run_dir) or {}
    record.update({"arm": run.arm, "strategy": run.strategy, "seed": run.seed, "rounds": run.rounds})
    record["segments"] = [*record.get("segments", []), dict(segment)]
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(record, indent=2), encoding="utf-8")
    partial.replace(path)


def read_run_record(run_dir: Path) -> dict[str, Any] | None:
    """The runner's record of a run folder, if any."""
    record = _read_json(Path(run_dir) / RUN_RECORD_FILE)
    return record if isinstance(record, dict) else None
