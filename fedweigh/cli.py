"""``fedweigh``: the command line.

::

    fedweigh simulate [--app PATH] [--run-config "k=v k2=v2" ...]
                      [--num-supernodes 10] [--cpus-per-client 1]
                      [--gpus-per-client 0.0] [--port 39191] [--keep-superlink]
    fedweigh stop-superlink [--app PATH] [--port 39191]
    fedweigh experiment run|report FILE ...    (fedweigh.experiments.cli)
    fedweigh benchmark NAME|all ...            (fedweigh.benchmarks.cli)

``simulate`` checks the run config (:func:`fedweigh.preflight.check_run`)
before it starts anything, then runs one simulation on a local SuperLink
(:class:`fedweigh.launch.simulation.LocalSimulation`), shows Flower's log with
a progress line below it (:mod:`fedweigh.launch.progress`: the round, time
left) and prints where the results are.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fedweigh.benchmarks.cli import add_benchmark_parser
from fedweigh.benchmarks.cli import run_command as run_benchmark_command
from fedweigh.experiments.cli import add_experiment_parser
from fedweigh.experiments.cli import run_command as run_experiment_command
from fedweigh.launch.commands import DEFAULT_NUM_SUPERNODES
from fedweigh.launch.connection import resolve_flwr_home
from fedweigh.launch.processes import ProcessTree, sigint_ignored
from fedweigh.launch.progress import PendingRun, RunsProgress
from fedweigh.launch.runconfig import (
    SimulationError,
    build_run_config_arg,
    load_app_config,
    parse_run_config,
    prepare_run_config,
)
from fedweigh.launch.simulation import LocalSimulation, RunOutcome
from fedweigh.launch.superlink import DEFAULT_PORT, choose_port, port_help
from fedweigh.run_folder import CHECKPOINT_FILE, METRICS_FILE, MODEL_FILE, ROUNDS_NOT_AGGREGATED, SUMMARY_FILE


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedweigh", description="Run fedweigh Flower simulations locally.")
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser(
        "simulate",
        help="run one simulation on a local SuperLink (no `uv sync`)",
        description="Start a local simulation SuperLink (unless one answers on --port), "
        "run the app with `flwr run ... --stream`, wait for it to finish and print "
        "where the results are.",
    )
    sim.add_argument("--app", default=None, help="Flower app dir (default: cwd)")
    sim.add_argument(
        "--run-config",
        "-c",
        action="append",
        default=[],
        metavar='"k=v k2=v2"',
        help="run-config overrides as for `flwr run` (repeatable; values are TOML, "
        "quote strings: name='a b'); or a single .toml file",
    )
    sim.add_argument("--num-supernodes", type=int, default=DEFAULT_NUM_SUPERNODES)
    sim.add_argument("--cpus-per-client", type=int, default=1)
    sim.add_argument("--gpus-per-client", type=float, default=0.0)
    sim.add_argument(
        "--port",
        type=int,
        default=None,
        help=port_help(DEFAULT_PORT),
    )
    sim.add_argument(
        "--keep-superlink",
        action="store_true",
        help="leave the SuperLink running for later runs",
    )
    sim.add_argument(
        "--database",
        default=None,
        help="SuperLink state database file (default: in memory)",
    )

    sub.add_parser(
        "list",
        help="the strategies, aggregation rules, client steps and models a run config may name",
        description="What `strategy`, `aggregation`, `client-steps` and `model` accept, with their options.",
    )

    stop = sub.add_parser("stop-superlink", help="stop a SuperLink left running by --keep-superlink")
    stop.add_argument("--app", default=None, help="Flower app dir (default: cwd)")
    stop.add_argument("--port", type=int, default=DEFAULT_PORT)

    add_experiment_parser(sub)
    add_benchmark_parser(sub)
    return parser


def _cmd_simulate(args: argparse.Namespace) -> int:
    app = Path(args.app or Path.cwd()).expanduser().resolve()
    if not (app / "pyproject.toml").is_file():
        print(f"fedweigh: no pyproject.toml in {app}", file=sys.stderr)
        return 2
    try:
        defaults = load_app_config(app)
        overrides = prepare_run_config(parse_run_config(args.run_config), defaults, Path.cwd())  # run name fixed
        full = {**defaults, **overrides}
    except (ValueError, SimulationError) as err:
        print(f"fedweigh: {err}", file=sys.stderr)
        return 2
    from fedweigh.preflight import check_run  # torch and the registries: only for this command

    try:
        settings = check_run(full, args.num_supernodes)  # the one check, before any SuperLink starts
    except ValueError as err:
        print(f"fedweigh: {err}", file=sys.stderr)
        return 2
    run = PendingRun(str(full.get("run-name") or "run"), settings.num_server_rounds)
    progress = RunsProgress([run], label="simulate", out=sys.stderr)

    try:
        port = choose_port(args.port)
    except SimulationError as err:
        print(f"fedweigh: {err}", file=sys.stderr)
        return 1
    sim = LocalSimulation(app, port=port, database=args.database, keep_superlink=args.keep_superlink)
    t0 = time.monotonic()
    try:
        with sim:
            progress.start_run(run)
            outcome = sim.run(
                overrides,
                num_supernodes=args.num_supernodes,
                cpus_per_client=args.cpus_per_client,
                gpus_per_client=args.gpus_per_client,
                echo=False,  # echoed above the progress line instead
                on_line=progress.echo_and_watch(sys.stdout),
            )
            complete = outcome.ok or outcome.results_complete(settings.num_server_rounds)
            progress.finish_run(complete)
    except KeyboardInterrupt:
        print("fedweigh: interrupted", file=sys.stderr)
        return 130
    except SimulationError as err:
        print(f"fedweigh: {err}", file=sys.stderr)
        return 1

    total = time.monotonic() - t0
    print(f"\nrun {outcome.run_id}: {outcome.status}" + (f" ({outcome.details})" if outcome.details else ""))
    if complete and not outcome.ok:
        print(
            f"its results are complete nonetheless: all {settings.num_server_rounds} rounds, {MODEL_FILE} and "
            f"{SUMMARY_FILE} were written before its process ended"
        )
    if outcome.results_dir is not None:
        missing = "" if outcome.results_dir.exists() else " (not created)"
        print(f"results: {outcome.results_dir}{missing}")
        summary = outcome.summary() if complete else None  # never another run's, nor a failed run's
        if summary is not None and "final_accuracy" in summary:
            print(f"final_accuracy: {summary['final_accuracy']}")
        elif complete:
            print(f"(no {SUMMARY_FILE} in {outcome.results_dir})")
        if lost := (summary or {}).get(ROUNDS_NOT_AGGREGATED):
            print(
                f"warning: {len(lost)} of {settings.num_server_rounds} rounds were not aggregated (the global model "
                f"stayed as it was): rounds {', '.join(map(str, lost))}; {METRICS_FILE}'s left_out says why"
            )
    if not complete and (hint := _continue_hint(outcome, settings.num_server_rounds, args)):
        print(hint)
    timing = ", ".join(f"{k}={v:.1f}s" for k, v in outcome.timings.items())
    startup = f"superlink_start={sim.startup_seconds:.1f}s, " if sim.startup_seconds else ""
    stop = f", superlink_stop={sim.stop_seconds:.1f}s" if sim.stop_seconds else ""
    print(f"timings: {startup}{timing}{stop}, wall={total:.1f}s")
    return 0 if complete else 1


def _continue_hint(outcome: RunOutcome, num_rounds: int, args: argparse.Namespace) -> str | None:
    """How to continue a run that stopped with a checkpoint on disk: the exact command (None without one)."""
    from fedweigh.results import Checkpoint

    folder = outcome.results_dir
    if folder is None or not (folder / CHECKPOINT_FILE).is_file():
        return None
    try:
        done = Checkpoint.load(folder / CHECKPOINT_FILE).round
    except ValueError:
        return None
    if done >= num_rounds:
        return (
            f"all {num_rounds} rounds are in {folder / CHECKPOINT_FILE} (the final global model), but the run ended "
            f"before it wrote {MODEL_FILE} and {SUMMARY_FILE}"
        )
    options = [("--app", args.app, None), ("--num-supernodes", args.num_supernodes, DEFAULT_NUM_SUPERNODES)]
    options += [("--cpus-per-client", args.cpus_per_client, 1), ("--gpus-per-client", args.gpus_per_client, 0.0)]
    command = ["fedweigh", "simulate"]
    command += [
        shlex.quote(part) for flag, value, default in options if value != default for part in (flag, str(value))
    ]
    command += ["--run-config", _shell_word(build_run_config_arg({"resume-from": str(folder)}))]
    return f"the run stopped after round {done} of {num_rounds}; its checkpoint continues it:\n  {' '.join(command)}"


def _shell_word(text: str) -> str:
    """``text`` as one shell word: in double quotes where they keep it as it is (a run config's 'strings')."""
    return f'"{text}"' if not any(char in text for char in '"$`\\!') else shlex.quote(text)


def _cmd_stop_superlink(args: argparse.Namespace) -> int:
    app = Path(args.app or Path.cwd()).expanduser().resolve()
    pid_path = resolve_flwr_home(app) / f"superlink-{args.port}.pid"
    try:
        pid = int(pid_path.read_text().strip())
    except (OSError, ValueError):
        print(f"fedweigh: no pid file {pid_path}", file=sys.stderr)
        return 1
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        cmdline = "flower-superlink"  # no /proc (macOS): trust the pid file
    if "flower-superlink" not in cmdline or f"{args.port}" not in cmdline:
        print(
            f"fedweigh: pid {pid} is not our SuperLink; removing {pid_path}",
            file=sys.stderr,
        )
        pid_path.unlink(missing_ok=True)
        return 1
    sim = LocalSimulation(app, port=args.port)
    with sigint_ignored():
        sim.tree = ProcessTree(pid)  # snapshot while the tree is intact
        sim.stop_runs(sim.unfinished_runs())
        sim.settle()
        killed = sim.tree.terminate()
    pid_path.unlink(missing_ok=True)
    print(f"stopped SuperLink pid {pid}" + (f" (SIGKILLed {killed})" if killed else ""))
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from fedweigh.methods.catalog import SIGNALS, STEPS
    from fedweigh.methods.registry import METHODS, RULES
    from fedweigh.models import model_names, model_options

    print("strategy = ...            (its rule; the client steps of its local objective)")
    for method in METHODS.values():
        extras = ", ".join([*method.steps, *(["proximal term"] if method.proximal else [])])
        print(f"  {method.name:<14} {method.meaning} [rule {method.rule.name}{'; ' + extras if extras else ''}]")
    print('\naggregation = ...         ("" = the strategy\'s own; options in the table named)')
    for rule in RULES.values():
        print(f"  {rule.name:<14} {rule.meaning}" + (f" [{rule.table}.*]" if rule.table else ""))
    print("\nclient-steps = ...        (added by strategies and rules; the signals it reports; options)")
    width = max(len(step.name) for step in STEPS.values())
    for step in STEPS.values():
        options = f"{step.options}.*" if step.options else "no options"
        print(f"  {step.name:<{width}} {step.meaning} [{', '.join(step.produces) or 'no signal'}; {options}]")
    print("\nsignals")
    width = max(len(name) for name in SIGNALS)
    for spec in SIGNALS.values():
        print(f"  {spec.name:<{width}} {spec.meaning} [from: {spec.producer or 'every reply'}]")
    print("\nmodel = ...               (its options, as model-<option>)")
    for name in model_names():
        print(f"  {name:<18} {', '.join(option.replace('_', '-') for option in model_options(name)) or '-'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fedweigh`` console script."""
    args = _build_parser().parse_args(argv)
    # `kill <pid>` stops a run the way Ctrl-C does: the run, the SuperLink and Ray go too.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "simulate": _cmd_simulate,
        "stop-superlink": _cmd_stop_superlink,
        "list": _cmd_list,
        "experiment": run_experiment_command,
        "benchmark": run_benchmark_command,
    }
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
