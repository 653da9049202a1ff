"""``fedweigh benchmark <name|all> [--quick] [--output FILE]``: run benchmarks, write JSON and a table.

Benchmarks: ``overhead``, ``gpu-overhead`` (needs a CUDA GPU; ``all`` runs it
only where one is visible), ``allocator``, ``checkpoint``, ``methods``, ``scale``,
``deployment``, ``aggregation``, ``ufl-cost``, ``feddle-cost``, ``fine-tuning``,
``gpu-evidence`` (what only a GPU settles, under ``--budget`` seconds; needs a
CUDA GPU but with ``--quick``, its CPU smoke mode; see
:mod:`fedweigh.benchmarks`). Each writes ``benchmarks/results/<name>.json``
(or ``--output``) and a markdown table beside it (``.md``), and prints the
table. ``--quick`` runs a smaller version of each (fewer rounds, fewer
cases) to check that everything works; its numbers are not the reference.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedweigh.benchmarks.tables import render_table
from fedweigh.launch.superlink import choose_port, port_help

__all__ = ["BENCHMARKS", "add_benchmark_parser", "run_benchmark", "run_command", "render_table"]

BENCHMARKS = (
    "overhead",
    "gpu-overhead",
    "allocator",
    "checkpoint",
    "methods",
    "scale",
    "deployment",
    "aggregation",
    "ufl-cost",
    "feddle-cost",
    "fine-tuning",
    "gpu-evidence",
)
GPU_ONLY = {"gpu-overhead", "gpu-evidence"}
"""Benchmarks that ``all`` runs only where torch sees a CUDA GPU."""
Progress = Callable[[dict[str, Any]], None]
"""Receives a benchmark's report so far."""
DEFAULT_PORT = 39201
RESULTS_DIR = Path("benchmarks") / "results"
WRITTEN_AS_THEY_GO = {"gpu-evidence"}
"""Benchmarks whose JSON report is rewritten after each case (marked ``partial`` until the end), not beside it."""


@dataclass(frozen=True)
class Options:
    """What some benchmarks take from the command line besides ``--quick``."""

    strategies: list[str] | None = None
    budget: float | None = None
    runs_dir: Path | None = None
    cases: list[str] | None = None
    settings: list[str] | None = None


OVERHEAD_SETTINGS = (
    "fedoui-cifar10",
    "fednolowe-mnist",
    "fedoui-cifar10-polling",
    "fedoui-cifar10-in-process",
    "fednolowe-mnist-in-process",
)
"""The overhead benchmark's settings, in its order (fedoui-cifar10's run at 10 and at 60 rounds)."""


def _names(text: str, option: str, kind: str, accepted: tuple[str, ...]) -> list[str]:
    """A comma-separated list of ``accepted`` names given to ``option``; one clear error for anything else."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in accepted]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{option} = {text!r}: unknown {kind}(s) {', '.join(unknown) or '(none given)'}; "
            f"accepted: a comma-separated list of {', '.join(accepted)}"
        )
    return names


def parse_overhead_settings(text: str) -> list[str]:
    """``--settings fedoui-cifar10-in-process`` -> that one setting of the overhead benchmark; a clear error otherwise.

    >>> parse_overhead_settings("fedoui-cifar10-in-process, fedoui-cifar10")
    ['fedoui-cifar10-in-process', 'fedoui-cifar10']
    """
    return _names(text, "--settings", "setting", OVERHEAD_SETTINGS)


def parse_budget(text: str) -> float:
    """``--budget 600`` -> ``600.0`` seconds; a clear error otherwise.

    >>> parse_budget("600"), parse_budget("90.5")
    (600.0, 90.5)
    """
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"--budget = {text!r}: accepted: a number of seconds > 0, e.g. 720")
    return value


def parse_cases(text: str) -> list[str]:
    """``--cases flood,feddle`` -> ``["flood", "feddle"]``, each a case of gpu-evidence.

    >>> parse_cases("flood, feddle")
    ['flood', 'feddle']
    """
    from fedweigh.benchmarks.gpu_evidence import CASE_NAMES

    return _names(text, "--cases", "case", tuple(CASE_NAMES))


def add_benchmark_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``benchmark`` to the ``fedweigh`` command."""
    parser = subparsers.add_parser(
        "benchmark",
        help="measure the cost of federation, of each method, of scale and of aggregation",
        description="Run benchmarks (not tests) and write a JSON report and a markdown table; see docs/benchmarks.md.",
    )
    parser.add_argument("name", choices=[*BENCHMARKS, "all"], help="which benchmark")
    parser.add_argument("--quick", action="store_true", help="a smaller version (fewer rounds and cases)")
    parser.add_argument("--output", type=Path, default=None, help="JSON file (default: benchmarks/results/<name>.json)")
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help=port_help(DEFAULT_PORT, "the benchmark's own SuperLink"),
    )
    parser.add_argument(
        "--strategies", default=None, help="methods benchmark: comma-separated strategies (default: all registered)"
    )
    parser.add_argument(
        "--ray",
        choices=("shared", "per-run", "two-node"),
        default="shared",
        help="shared: one Ray cluster for all runs, as the experiment runner does (default); "
        "per-run: Flower's own Ray cluster started in each run, as a lone `flwr run` does; "
        "two-node: one shared cluster of two Ray nodes on this machine, the CPUs split between them",
    )
    parser.add_argument(
        "--budget",
        type=parse_budget,
        default=None,
        metavar="SECONDS",
        help="gpu-evidence: the seconds its cases may take; a case whose estimate does not fit in what is left "
        "is skipped, with the reason (default: 720)",
    )
    parser.add_argument(
        "--cases",
        type=parse_cases,
        default=None,
        help="gpu-evidence: only these cases, comma-separated, in their usual order (default: all), e.g. the ones "
        "a first lease left skipped",
    )
    parser.add_argument(
        "--settings",
        type=parse_overhead_settings,
        default=None,
        help="overhead: only these settings, comma-separated (default: all, and the vanilla Flower peer), e.g. "
        "fedoui-cifar10-in-process",
    )
    parser.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        help="gpu-evidence: where its experiment runs go (default: outputs/gpu-evidence, or "
        "outputs/gpu-evidence-quick with --quick); the same folder again skips the runs already finished",
    )


def overhead_settings(quick: bool) -> list[Any]:
    """The overhead benchmark's settings (:class:`~fedweigh.benchmarks.common.Setting`), named as in
    :data:`OVERHEAD_SETTINGS`."""
    from fedweigh.benchmarks.common import fednolowe_mnist, fedoui_cifar10

    settings = [fedoui_cifar10(3)] if quick else [fedoui_cifar10(10), fedoui_cifar10(60), fednolowe_mnist(5)]
    # Before and after the event-driven hand-off (strategies/wakeup.py): the CIFAR-10 settings again with
    # Flower's own 0.1 s polling loops.
    settings += [s.polling() for s in settings if s.name.startswith("fedoui")]
    # Ray's actors against the ClientApp in the simulation's own process (fedweigh/flower/engine.py), every setting.
    settings += [s.in_process() for s in settings if not s.name.endswith("-polling")]
    return settings


def _overhead(quick: bool, sim: Any, options: Options, progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.overhead import federation_overhead, vanilla_peer

    settings = overhead_settings(quick)
    if options.settings:  # only these (the vanilla Flower peer is not among them)
        settings = [s for s in settings if s.name in options.settings]
    results: list[dict[str, Any]] = []
    for setting in settings:
        results.append(federation_overhead(setting, sim, repeats=1 if quick else 2))
        progress({"settings": results})
    if options.settings:
        return {"settings": results, "chosen": options.settings}
    peer = vanilla_peer(sim, rounds=5 if quick else 30, repeats=1 if quick else 2)
    return {"settings": results, "peer": peer}


def _gpu_overhead(quick: bool, sim: Any, _: Options, progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.gpu import gpu_overhead

    return gpu_overhead(sim, quick, progress)


def _allocator(quick: bool, sim: Any, _: Options, _progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.allocator import allocator_cost

    return allocator_cost(rounds=3 if quick else 20, repeats=1 if quick else 3)


def _checkpoint(quick: bool, sim: Any, _: Options, _progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.checkpoint import checkpoint_cost

    return checkpoint_cost(saves=5 if quick else 30)


def _methods(quick: bool, sim: Any, options: Options, _progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.common import digits_small, fedoui_cifar10
    from fedweigh.benchmarks.methods import method_overhead
    from fedweigh.methods.registry import METHODS

    setting = digits_small(3) if quick else fedoui_cifar10(6)
    return method_overhead(setting, options.strategies or sorted(METHODS), sim)


def _scale(quick: bool, sim: Any, _: Options, _progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.scale import scale

    return scale(sim, sizes=(100, 1000) if quick else (100, 1000, 10000), rounds=2 if quick else 30)


def _deployment(quick: bool, sim: Any, _: Options, _progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.deployment import deployment

    return deployment(sim, nodes=2, rounds=3 if quick else 6, containers=True)


def _aggregation(quick: bool, sim: Any, _: Options, _progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.aggregation import aggregation

    return aggregation(ks=(10,) if quick else (10, 100), repeat=2 if quick else 3)


def _ufl_cost(quick: bool, sim: Any, _: Options, _progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.ufl_cost import ufl_cost

    return ufl_cost(quick=quick)


def _feddle_cost(quick: bool, sim: Any, _: Options, _progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.feddle_cost import feddle_cost

    return feddle_cost(sim, quick=quick)


def _finetuning(quick: bool, sim: Any, _: Options, _progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.finetuning import finetuning_cost

    return finetuning_cost(quick=quick)


def _gpu_evidence(quick: bool, sim: Any, options: Options, progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.gpu_evidence import gpu_evidence

    return gpu_evidence(
        sim, quick, budget=options.budget, runs_dir=options.runs_dir, cases=options.cases, progress=progress
    )


_RUNNERS: dict[str, Callable[[bool, Any, Options, Progress], dict[str, Any]]] = {
    "overhead": _overhead,
    "gpu-overhead": _gpu_overhead,
    "allocator": _allocator,
    "checkpoint": _checkpoint,
    "methods": _methods,
    "scale": _scale,
    "deployment": _deployment,
    "aggregation": _aggregation,
    "ufl-cost": _ufl_cost,
    "feddle-cost": _feddle_cost,
    "fine-tuning": _finetuning,
    "gpu-evidence": _gpu_evidence,
}
_NEEDS_SIMULATION = {"overhead", "gpu-overhead", "methods", "scale", "deployment", "feddle-cost", "gpu-evidence"}


def _ray_description(sim: Any) -> str:
    ray = getattr(sim, "ray", None)
    if ray is None:
        return "per-run"
    return "shared" if not ray.workers else f"shared, {1 + len(ray.workers)} nodes"


def run_benchmark(
    name: str,
    *,
    quick: bool,
    sim: Any = None,
    strategies: list[str] | None = None,
    progress: Progress | None = None,
    budget: float | None = None,
    runs_dir: Path | None = None,
    cases: list[str] | None = None,
    settings: list[str] | None = None,
) -> dict[str, Any]:
    """Run one benchmark; returns its report (with the machine it ran on).

    ``progress``, if given, receives the report so far (marked ``partial``)
    whenever a benchmark of several long cases finishes one, so that a run
    stopped by a time limit keeps what it measured. ``budget`` (seconds),
    ``runs_dir`` (where its experiment runs go) and ``cases`` are gpu-evidence's; ``settings`` the overhead
    benchmark's (:data:`OVERHEAD_SETTINGS`).
    """
    from fedweigh.benchmarks.common import machine_description

    started = time.monotonic()
    machine = machine_description()

    def so_far(partial: dict[str, Any]) -> None:
        if progress is not None:
            progress({"benchmark": name, "quick": quick, "machine": machine, "partial": True, **partial})

    report = _RUNNERS[name](quick, sim, Options(strategies, budget, runs_dir, cases, settings), so_far)
    machine["load_average_1m_after"] = machine_description()["load_average_1m"]
    return {
        "benchmark": name,
        "quick": quick,
        "machine": machine,
        "seconds": round(time.monotonic() - started, 1),
        "ray": None if sim is None else _ray_description(sim),
        **report,
    }


def run_command(args: argparse.Namespace) -> int:
    """Handler of ``fedweigh benchmark ...``; returns the exit code."""
    from fedweigh.benchmarks.common import APP_DIR, BenchmarkError, write_json
    from fedweigh.launch.runconfig import SimulationError
    from fedweigh.launch.simulation import LocalSimulation

    names = [args.name]
    if args.name == "all":
        import torch

        names = [name for name in BENCHMARKS if name not in GPU_ONLY or torch.cuda.is_available()]
    if args.output is not None and len(names) > 1:
        print("fedweigh: --output names one file; run one benchmark at a time with it", file=sys.stderr)
        return 2
    strategies = [s.strip() for s in args.strategies.split(",")] if args.strategies else None
    sim = None
    try:
        if "gpu-evidence" in names and not args.quick:  # before a SuperLink starts for nothing
            from fedweigh.benchmarks.gpu_evidence import require_gpu

            require_gpu()
        if _NEEDS_SIMULATION & set(names):
            from fedweigh.benchmarks.gpu_evidence import ray_installed

            port = choose_port(args.port, DEFAULT_PORT)
            sim = LocalSimulation(
                APP_DIR,
                port=port,
                connection=f"fedweigh-bench-{port}",
                shared_ray=args.ray != "per-run" and ray_installed(),  # without Ray (a lent GPU): in-process
                ray_nodes=2 if args.ray == "two-node" else 1,
            )
            sim.start()
        for name in names:
            print(f"[benchmark] {name}{' (quick)' if args.quick else ''} ...", file=sys.stderr, flush=True)
            path = args.output or (RESULTS_DIR / (f"{name}-quick.json" if args.quick else f"{name}.json"))
            # a long benchmark stopped by a time limit keeps the cases it finished beside the last full report
            partial_path = Path(path) if name in WRITTEN_AS_THEY_GO else Path(path).with_suffix(".partial.json")
            report = run_benchmark(
                name,
                quick=args.quick,
                sim=sim,
                strategies=strategies,
                progress=lambda partial, p=partial_path: write_json(p, partial),
                budget=args.budget,
                runs_dir=args.runs_dir,
                cases=args.cases,
                settings=args.settings,
            )
            table = render_table(name, report)
            if partial_path != Path(path):
                partial_path.unlink(missing_ok=True)
            write_json(path, report)
            Path(path).with_suffix(".md").write_text(f"# {name}\n\n{table}\n", encoding="utf-8")
            print(f"\n## {name} ({report['seconds']:.0f} s; {path})\n\n{table}\n")
    except (BenchmarkError, SimulationError, RuntimeError, ValueError) as err:
        print(f"fedweigh: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fedweigh: interrupted", file=sys.stderr)
        return 130
    finally:
        if sim is not None:
            sim.stop()
    return 0
