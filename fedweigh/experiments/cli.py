"""``fedweigh experiment run|report FILE``: the command line of the experiment runner.

Only argparse lives here at import time; the runner (and torch) load when a
command runs, so ``fedweigh --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from fedweigh.launch.runconfig import SimulationError, load_app_config, parse_run_config
from fedweigh.launch.superlink import DEFAULT_PORT, choose_port, port_help

__all__ = ["add_experiment_parser", "default_app_dir", "default_output_dir", "parse_arms", "parse_seeds", "run_command"]

OUTPUT_ROOT = Path("outputs") / "experiments"


def parse_seeds(text: str) -> list[int]:
    """``"1,2,3"`` -> ``[1, 2, 3]``; a clear error otherwise.

    >>> parse_seeds("1, 2,3")
    [1, 2, 3]
    """
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--seeds = {text!r}: accepted: comma-separated integers, e.g. 1,2,3"
        ) from None
    if not seeds:
        raise argparse.ArgumentTypeError(f"--seeds = {text!r}: accepted: comma-separated integers, e.g. 1,2,3")
    return seeds


def parse_arms(text: str) -> list[str]:
    """``--arms fedavg,flood`` -> ``["fedavg", "flood"]``.

    >>> parse_arms("fedavg, flood")
    ['fedavg', 'flood']
    """
    arms = [part.strip() for part in text.split(",") if part.strip()]
    if not arms:
        raise argparse.ArgumentTypeError(f"--arms = {text!r}: accepted: comma-separated arm names, e.g. fedavg,flood")
    return arms


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--rounds = {text!r}: accepted: an integer >= 1")
    return value


def default_app_dir() -> Path:
    """The current directory if it is a Flower app, else the folder fedweigh was installed from."""
    here = Path.cwd()
    try:
        with (here / "pyproject.toml").open("rb") as handle:
            if "app" in tomllib.load(handle).get("tool", {}).get("flwr", {}):
                return here
    except (OSError, tomllib.TOMLDecodeError):
        pass
    return Path(__file__).resolve().parents[2]


def default_output_dir(
    name: str, rounds: int | None, seeds: list[int] | None, settings: dict[str, Any] | None = None
) -> Path:
    """``outputs/experiments/<name>``; overrides get their own folder so that runs never mix.

    Tracking settings change where the rounds are shown, not the runs: they keep the folder.

    >>> default_output_dir("grid", None, [1, 2], {"fraction-train": 0.2, "tracking": "tensorboard"}).as_posix()
    'outputs/experiments/grid-fraction-train0.2-seeds1_2'
    """
    from fedweigh.experiments.grid import TRACKING_SETTINGS

    shown = {key: value for key, value in (settings or {}).items() if key not in TRACKING_SETTINGS}
    suffix = "".join(f"-{key}{value}" for key, value in shown.items())
    if rounds is not None:
        suffix += f"-rounds{rounds}"
    if seeds is not None:
        suffix += "-seeds" + "_".join(map(str, seeds))
    return OUTPUT_ROOT / f"{name}{suffix}"


def parse_setting(text: str) -> tuple[str, Any]:
    """``--set KEY=VALUE`` -> ``(key, value)``, the value read as in ``flwr run --run-config``.

    >>> parse_setting("fraction-train=0.2"), parse_setting("strategy=fedavg")
    (('fraction-train', 0.2), ('strategy', 'fedavg'))
    """
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"--set = {text!r}: accepted: KEY=VALUE, e.g. fraction-train=0.2")
    try:
        parsed = parse_run_config([f"{key.strip()}={value.strip()}"])
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--set = {text!r}: {err}") from None
    if len(parsed) != 1:
        raise argparse.ArgumentTypeError(f"--set = {text!r}: accepted: one KEY=VALUE per --set")
    return next(iter(parsed.items()))


def add_experiment_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``experiment run`` and ``experiment report`` to the ``fedweigh`` command."""
    parser = subparsers.add_parser(
        "experiment",
        help="run a named comparison (arms x seeds) and get its table and plots",
        description="Run every (arm, seed) of an experiment file as a real Flower run on one local "
        "simulation SuperLink; see docs/experiments.md.",
    )
    actions = parser.add_subparsers(dest="experiment_command", required=True)
    for name, help_text in (
        ("run", "run the grid (skipping finished runs, resuming interrupted ones), then write the report"),
        ("report", "only (re)write results.csv, summary.md and the plots from the runs already done"),
    ):
        sub = actions.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("file", type=Path, help="the experiment file (TOML)")
        sub.add_argument("--output-dir", type=Path, default=None, help="default: outputs/experiments/<name>")
        sub.add_argument("--seeds", type=parse_seeds, default=None, help="replace the file's seeds, e.g. 1,2")
        sub.add_argument("--rounds", type=_positive, default=None, help="replace num-server-rounds (a quick look)")
        sub.add_argument(
            "--arms", type=parse_arms, default=None, help="only these arms, comma-separated, e.g. fedavg,flood"
        )
        sub.add_argument(
            "--set",
            dest="settings",
            type=parse_setting,
            action="append",
            default=None,
            metavar="KEY=VALUE",
            help="a run-config value for every run, e.g. --set fraction-train=0.2 (repeatable; "
            "wins over the file's base and arm overrides)",
        )
        sub.add_argument(
            "--report-dir",
            type=Path,
            default=None,
            help="where results.csv, summary.md and plots/ go (default: the output dir), e.g. docs/results/<name> "
            "to publish them; the runs and their logs stay in the output dir",
        )
        sub.add_argument("--app", type=Path, default=None, help="Flower app dir (default: cwd, else fedweigh's)")
        if name == "report":
            sub.add_argument(
                "--include-results",
                dest="earlier",
                type=Path,
                action="append",
                default=[],
                metavar="CSV",
                help="an earlier report's results.csv of this experiment: planned runs without a finished folder "
                "are taken from it (repeatable; the first file holding a run wins), e.g. seeds run elsewhere",
            )
        if name == "run":
            sub.add_argument("--dry-run", action="store_true", help="validate and show the plan; run nothing")
            sub.add_argument(
                "--port",
                type=int,
                default=None,
                help=port_help(DEFAULT_PORT, "the simulation SuperLink"),
            )
            sub.add_argument("--echo", action="store_true", help="print the runs' Flower logs too")


def run_command(args: argparse.Namespace) -> int:
    """Handler of ``fedweigh experiment ...``; returns the exit code."""
    from fedweigh.experiments.grid import Action, tracking_commands
    from fedweigh.experiments.report import write_report
    from fedweigh.experiments.runner import data_problems, plan_experiment, run_experiment
    from fedweigh.experiments.sampling import SamplingMismatchError
    from fedweigh.experiments.spec import ExperimentError, load_experiment
    from fedweigh.launch.progress import format_duration

    app = (args.app or default_app_dir()).expanduser().resolve()
    try:
        defaults = load_app_config(app)
        settings = dict(args.settings) if args.settings else None
        experiment = load_experiment(
            args.file, defaults, seeds=args.seeds, rounds=args.rounds, settings=settings, arms=args.arms
        )
        output_dir = args.output_dir or default_output_dir(experiment.name, args.rounds, args.seeds, settings)
        output_dir = output_dir.resolve()
        runs, plans = plan_experiment(experiment, output_dir, defaults)
    except (ExperimentError, SimulationError) as err:
        print(f"fedweigh: {err}", file=sys.stderr)
        return 2

    try:
        if args.experiment_command == "report":
            report = write_report(experiment, runs, args.report_dir or output_dir, earlier=args.earlier)
            print(f"wrote {report.results_csv} and {report.summary_md} ({len(report.plots)} plots)")
            return 0
        todo = [plan for plan in plans if plan.action is not Action.SKIP]
        print(
            f"experiment {experiment.name}: {len(plans)} runs ({len(experiment.arms)} arms x "
            f"{len(experiment.seeds)} seeds), {len(plans) - len(todo)} done, {len(todo)} to run; "
            f"results in {output_dir}",
            file=sys.stderr,
        )
        if args.dry_run:
            for plan in plans:
                print(f"  {plan.run.name:<32} {plan.action.value:<7} {plan.note}")
            problems = data_problems(todo, defaults, experiment.spec.experiment.num_supernodes)
            for problem in problems:
                print(f"fedweigh: {problem}", file=sys.stderr)
            return 2 if problems else 0
        started = time.monotonic()
        outcome = run_experiment(
            experiment,
            output_dir,
            app,
            defaults,
            port=choose_port(args.port),
            echo=args.echo,
            report_dir=args.report_dir,
        )
    except SamplingMismatchError as err:
        print(f"fedweigh: {err}", file=sys.stderr)
        return 1
    except ExperimentError as err:
        print(f"fedweigh: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedweigh: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except SimulationError as err:
        print(f"fedweigh: {err}", file=sys.stderr)
        return 1
    elapsed = time.monotonic() - started
    report = outcome.report
    if report is not None:
        print(f"\ndone in {format_duration(elapsed)}; results in {output_dir}\n")
        print(report.summary_md.read_text(encoding="utf-8"))
    for command in tracking_commands([plan.run for plan in plans], defaults):
        print(f"watch: {command}")
    if outcome.failed:
        print(f"fedweigh: {len(outcome.failed)} run(s) failed: {', '.join(outcome.failed)}", file=sys.stderr)
        return 1
    return 0
