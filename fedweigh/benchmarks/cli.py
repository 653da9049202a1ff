"""``fedweigh benchmark <name|all> [--quick] [--output FILE]``: run benchmarks, write JSON and a table.

Benchmarks: ``overhead``, ``gpu-overhead`` (needs a CUDA GPU; ``all`` runs it
only where one is visible), ``allocator``, ``checkpoint``, ``methods``, ``scale``,
``deployment``, ``aggregation``, ``ufl-cost``, ``feddle-cost``, ``fine-tuning`` (see
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
from pathlib import Path
from typing import Any

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
)
Progress = Callable[[dict[str, Any]], None]
"""Receives a benchmark's report so far."""
DEFAULT_PORT = 39201
RESULTS_DIR = Path("benchmarks") / "results"


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


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _overhead_table(settings: list[dict[str, Any]], gpu: bool) -> str:
    from fedweigh.benchmarks.common import markdown_table

    rows = [
        [
            r["setting"],
            *([_fmt(r["gpus_per_client"], 1)] if gpu else []),
            r["rounds"],
            _fmt(r["bare_seconds"], 1),
            _fmt(r["simulation_seconds"], 1),
            f"{r['ratio']:.2f}x",
            _fmt(r["round_ratio"]) + "x" if r["round_ratio"] else "–",
            _fmt(r["per_round_overhead_seconds"], 3 if gpu else 2),
            _fmt(r["fixed_overhead_seconds"], 1),
            _fmt(r["rounds_to_target"], 0) if r["rounds_to_target"] is not None else "never",
            "yes" if r["same_accuracies"] else "NO",
        ]
        for r in settings
    ]
    header = [
        "setting",
        *(["GPU per client"] if gpu else []),
        "rounds",
        "bare loop s",
        "simulation s",
        "ratio",
        "round ratio",
        "extra s/round",
        "extra fixed s",
        "rounds for ≤1.3x",
        "same accuracies",
    ]
    return markdown_table(header, rows)


_PARTS = ("training", "client_other", "transport", "evaluation", "server_other", "round")


def _breakdown_table(settings: list[dict[str, Any]]) -> str:
    """Each setting's round split (:func:`fedweigh.benchmarks.overhead.round_breakdown`) and Ray's floor, in ms."""
    from fedweigh.benchmarks.common import markdown_table

    def ms(value: float | None) -> str:
        return "–" if value is None else f"{1e3 * value:.0f}"

    rows = []
    for r in settings:
        split = r["round_breakdown"]
        floor = r.get("ray_floor") or {}
        rows.append(
            [
                f"{r['setting']} ({r['rounds']})",
                *[f"{ms(split['simulation'][p])} / {ms(split['bare'][p])}" for p in _PARTS],
                _fmt(split["messages_per_round"], 1),
                _fmt(split["transport_ms_per_message"], 1),
                _fmt(floor.get("default", {}).get("median_ms"), 1),
                _fmt(floor.get("inline_8mib", {}).get("median_ms"), 1),
            ]
        )
    header = [
        "setting (rounds)",
        "training",
        "client handler, rest",
        "transport",
        "central evaluation",
        "server, rest",
        "round",
        "messages/round",
        "transport ms/message",
        "Ray floor ms/call",
        "Ray floor, 8 MiB inline",
    ]
    return markdown_table(header, rows)


def _deployment_table(ways: list[dict[str, Any]]) -> str:
    from fedweigh.benchmarks.common import markdown_table

    rows = [
        [
            r["way"],
            _fmt(r.get("round_seconds"), 3),
            _fmt(r.get("round_seconds_std"), 3),
            _fmt(r.get("client_train_seconds"), 3),
            _fmt(r.get("overhead_seconds"), 3),
            _fmt(r.get("handoff_seconds"), 3),
            _fmt(r.get("server_seconds"), 3),
            _ratio(r.get("round_ratio_vs_simulation")),
            _fmt(r.get("first_round_seconds"), 2),
            _fmt(r.get("wall_seconds"), 1),
            _fmt(r.get("final_accuracy"), 4),
            r.get("hosts", "–"),
            r["status"],
        ]
        for r in ways
    ]
    header = ["way", "round s", "± std", "client training s", "overhead s", "of it: hand-off s", "and server s"]
    header += ["vs simulation", "round 1 s", "wall s", "final acc", "hosts", "status"]
    return markdown_table(header, rows)


def render_table(name: str, report: dict[str, Any]) -> str:
    """The markdown table of one benchmark's report."""
    from fedweigh.benchmarks.common import markdown_table

    if name in ("overhead", "gpu-overhead"):
        table = _overhead_table(report["settings"], gpu=name == "gpu-overhead")
        if breakdowns := [r for r in report["settings"] if r.get("round_breakdown")]:
            table += "\n\nWhere a round goes (rounds 2..T, mean ms per round; simulation / bare loop):\n\n"
            table += _breakdown_table(breakdowns)
        if fine_tuning := report.get("fine_tuning"):
            table += "\n\nThe pretrained models' client step on the GPU:\n\n" + render_table("fine-tuning", fine_tuning)
        if peer := report.get("peer"):
            table += "\n\nfedweigh's FedAvg against vanilla Flower (FedAvg, a plain ClientApp), the same work:\n\n"
            table += markdown_table(
                ["rounds", "fedweigh s", "vanilla s", "ratio", "fedweigh s/round", "vanilla s/round", "round ratio"],
                [
                    [
                        peer["rounds"],
                        _fmt(peer["fedweigh_seconds"], 1),
                        _fmt(peer["vanilla_seconds"], 1),
                        f"{peer['ratio']:.2f}x",
                        _fmt(peer["fedweigh_round_seconds"], 3),
                        _fmt(peer["vanilla_round_seconds"], 3),
                        _fmt(peer["round_ratio"]) + "x" if peer["round_ratio"] else "–",
                    ]
                ],
            )
        return table
    if name == "methods":
        rows = [
            [
                r["strategy"],
                _fmt(r.get("round_seconds")),
                _fmt(r.get("client_train_seconds")),
                (_fmt(r.get("round_ratio")) + "x") if r.get("round_ratio") else "–",
                _fmt(r.get("extra_seconds_per_round")),
                _fmt(r.get("final_accuracy"), 4),
                r["status"],
            ]
            for r in report["strategies"]
        ]
        header = ["strategy", "round s", "local training s/round", "vs FedAvg", "extra s/round", "final acc", "status"]
        return f"setting: {report['setting']}\n\n" + markdown_table(header, rows)
    if name == "scale":
        rows = [
            [
                r["clients"],
                r.get("per_round", "–"),
                _fmt(r.get("revisit_share")),
                _fmt(r.get("peak_pss_mb"), 0),
                r.get("peak_processes", "–"),
                _fmt(r.get("round_seconds")),
                _fmt(r.get("round_seconds_std")),
                _fmt(r.get("startup_seconds"), 1),
                _fmt(r.get("node_query_seconds"), 1),
                _fmt(r.get("partition_check_seconds")),
                _ratio(r.get("memory_ratio")),
                _ratio(r.get("round_ratio")),
                _fmt(r.get("kb_per_extra_client"), 1),
                _fmt(r.get("startup_ms_per_extra_client"), 2),
                r["status"],
            ]
            for r in report["clients"]
        ]
        header = [
            "clients",
            "per round",
            "revisited",
            "peak memory (PSS) MB",
            "processes",
            "round s",
            "± std",
            "start-up s",
            "nodes' partitions s",
            "data check s",
            "memory vs smallest",
            "round vs smallest",
            "KB per extra client",
            "start-up ms per extra client",
            "status",
        ]
        return markdown_table(header, rows)
    if name == "deployment":
        tables = [report, *([report["containers"]] if "containers" in report else [])]
        return "\n\n".join(
            f"{table['setting']}: {table['nodes']} nodes, {report['rounds']} rounds; rounds 2..T; "
            f"same final accuracy every way: {table['same_final_accuracy']}\n\n" + _deployment_table(table["ways"])
            for table in tables
        )
    if name == "aggregation":
        rows = [
            [
                r["k"],
                _fmt(r["strategy_fedweigh_s"], 3),
                _fmt(r["strategy_flower_s"], 3),
                f"{r['strategy_speedup']:.2f}x",
                _fmt(r["arrays_fedweigh_s"], 3),
                _fmt(r["arrays_flower_s"], 3),
                f"{r['arrays_speedup']:.2f}x",
                _fmt(r["arithmetic_fedweigh_s"], 3),
                _fmt(r["arithmetic_flower_s"], 3),
                f"{_fmt(r['strategy_extra_peak_mb_fedweigh'], 0)} / {_fmt(r['strategy_extra_peak_mb_flower'], 0)}",
            ]
            for r in report["summary"]
        ]
        header = [
            "K",
            "strategy: fedweigh s",
            "Flower FedAvg s",
            "speed-up",
            "arrays: fedweigh s",
            "Flower s",
            "speed-up",
            "arithmetic: fedweigh s",
            "Flower pattern s",
            "extra peak MB fedweigh / Flower",
        ]
        parameters = report["cases"][0]["parameters"] if report["cases"] else 0
        return f"model: {report['model']} ({parameters:,} parameters)\n\n" + markdown_table(header, rows)
    if name == "ufl-cost":
        rows = [
            [
                r["model"],
                r["samples"],
                _fmt(r["fedavg_seconds"], 3),
                _fmt(r["ufl_mc_seconds"], 3),
                _fmt(r["ufl_seconds"], 3),
                f"{r['ratio']:.2f}x",
                f"{r['mc_ratio']:.2f}x",
                f"{r['naive_ratio']:.2f}x",
            ]
            for r in report["models"]
        ]
        header = [
            "model",
            "samples",
            "FedAvg client s",
            "UFL MC s",
            "UFL client s",
            "UFL / FedAvg",
            "UFL MC / FedAvg",
            "naive MC / FedAvg",
        ]
        return f"N = 10 MC passes, 1 local epoch, batch 64, 1 thread; target <= {report['target_ratio']}x\n\n" + (
            markdown_table(header, rows)
        )
    if name == "feddle-cost":
        return _feddle_tables(report)
    if name == "allocator":
        rows = [
            [
                r["process"],
                "worker" if r.get("thread") else "main",
                r.get("arena", "default"),
                "kept (fedweigh)" if r["keep_freed_memory"] else "glibc default",
                " / ".join(f"{s:.2f}" for s in r["train_seconds"]),
                f"{r['median_train_seconds']:.2f}",
                f"{r['vs_plain_default']:.2f}x",
                f"{r['median_minor_faults']:,.0f}",
                _fmt(r.get("median_evaluate_seconds")),
                "–" if r.get("evaluate_vs_plain_default") is None else f"{r['evaluate_vs_plain_default']:.2f}x",
                "–" if r.get("median_evaluate_minor_faults") is None else f"{r['median_evaluate_minor_faults']:,.0f}",
            ]
            for r in report["cases"]
        ]
        header = ["process", "thread", "MALLOC_ARENA_MAX", "freed memory", "train s per pass", "median s"]
        header += ["vs plain, default", "page faults a pass", "evaluate s a pass", "vs plain, default", "page faults"]
        return (
            f"{report['setting']}, {report['rounds']} rounds of sampled clients a pass (training, then the central "
            f"evaluation once a round), {report['repeats']} passes, 1 torch thread; each case a fresh process\n\n"
            + markdown_table(header, rows)
        )
    if name == "checkpoint":
        rows = [
            [
                r["model"],
                _fmt(r["state_mb"], 1),
                r["way"],
                _fmt(1000 * r["median_seconds"], 1),
                _fmt(1000 * r["p90_seconds"], 1),
            ]
            for r in report["cases"]
        ]
        return markdown_table(["model", "state MB", "checkpoint", "round waits ms (median)", "p90 ms"], rows)
    if name == "fine-tuning":
        on_gpu = report.get("device", "cpu") == "cuda"
        digits = 4 if on_gpu else 2
        rows = [
            [
                r["model"],
                r["fine_tuning"],
                f"{r['trainable_parameters']:,}",
                f"{r['message_bytes'] / 2**20:.2f}",
                f"{r['fewer_bytes_than_full']:.0f}x",
                f"{r['step_seconds_mean']:.{digits}f} ± {r['step_seconds_std']:.{digits}f}",
                _fmt(r["peak_gpu_mb"] if on_gpu else r["peak_rss_mb"], 0),
            ]
            for r in report["cases"]
        ]
        header = [
            "model",
            "fine-tuning",
            "trainable parameters",
            "MB per client message",
            "fewer bytes than full",
            f"GPU step s (batch {report['batch_size']})"
            if on_gpu
            else f"CPU step s (batch {report['batch_size']}, 1 thread)",
            "peak GPU memory MB" if on_gpu else "peak memory MB",
        ]
        return markdown_table(header, rows)
    raise ValueError(f"unknown benchmark {name!r}")


def _feddle_tables(report: dict[str, Any]) -> str:
    from fedweigh.benchmarks.common import markdown_table

    parts = []
    if rounds := report.get("rounds"):
        rows = [
            [
                r["strategy"],
                _fmt(r.get("round_seconds")),
                (_fmt(r["vs_fedbuff"]) + "x") if "vs_fedbuff" in r else "–",
                _fmt(r.get("final_accuracy"), 4),
                r["status"],
            ]
            for r in rounds["strategies"]
        ]
        parts.append(
            f"rounds ({rounds['setting']}; median of rounds 2+)\n\n"
            + markdown_table(["strategy", "round s", "vs FedBuff", "final acc", "status"], rows)
        )
    rows = [
        [r["search_epochs"], r["search_steps"], _fmt(r["fedbuff"], 4), _fmt(r["feddle"], 4), f"{r['ratio']:.1f}x"]
        for r in report["server_step"]
    ]
    parts.append(
        "server step alone (atlas of 20, 1,000 server images)\n\n"
        + markdown_table(["passes", "search steps", "FedBuff s", "Feddle s", "ratio"], rows)
    )
    rows = [
        [
            r["model"],
            f"{r['trainable_parameters']:,}",
            r["clients_per_round"],
            r["atlas_size"],
            _fmt(r["model_mb"]),
            _fmt(r["atlas_mb"], 1),
        ]
        for r in report["memory"]
    ]
    parts.append(
        "atlas memory (float32)\n\n"
        + markdown_table(["model", "trainable d", "clients/round", "M", "model MB", "atlas MB"], rows)
    )
    return "\n\n".join(parts)


def _overhead(quick: bool, sim: Any, _: list[str] | None, progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.common import fednolowe_mnist, fedoui_cifar10
    from fedweigh.benchmarks.overhead import federation_overhead, vanilla_peer

    settings = [fedoui_cifar10(3)] if quick else [fedoui_cifar10(10), fedoui_cifar10(60), fednolowe_mnist(5)]
    # Before and after the event-driven hand-off (strategies/wakeup.py): the CIFAR-10 settings again with
    # Flower's own 0.1 s polling loops.
    settings += [s.polling() for s in settings if s.name.startswith("fedoui")]
    # Ray's actors against the ClientApp in the simulation's own process (fedweigh/engine.py), every setting.
    settings += [s.in_process() for s in settings if not s.name.endswith("-polling")]
    results: list[dict[str, Any]] = []
    for setting in settings:
        results.append(federation_overhead(setting, sim, repeats=1 if quick else 2))
        progress({"settings": results})
    peer = vanilla_peer(sim, rounds=5 if quick else 30, repeats=1 if quick else 2)
    return {"settings": results, "peer": peer}


def _gpu_overhead(quick: bool, sim: Any, _: list[str] | None, progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.gpu import gpu_overhead

    return gpu_overhead(sim, quick, progress)


def _allocator(quick: bool, sim: Any, _: list[str] | None, _progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.allocator import allocator_cost

    return allocator_cost(rounds=3 if quick else 20, repeats=1 if quick else 3)


def _checkpoint(quick: bool, sim: Any, _: list[str] | None, _progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.checkpoint import checkpoint_cost

    return checkpoint_cost(saves=5 if quick else 30)


def _methods(quick: bool, sim: Any, strategies: list[str] | None, _progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.common import digits_small, fedoui_cifar10
    from fedweigh.benchmarks.methods import method_overhead
    from fedweigh.methods import METHODS

    setting = digits_small(3) if quick else fedoui_cifar10(6)
    return method_overhead(setting, strategies or sorted(METHODS), sim)


def _scale(quick: bool, sim: Any, _: list[str] | None, _progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.scale import scale

    return scale(sim, sizes=(100, 1000) if quick else (100, 1000, 10000), rounds=2 if quick else 30)


def _deployment(quick: bool, sim: Any, _: list[str] | None, _progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.deployment import deployment

    return deployment(sim, nodes=2, rounds=3 if quick else 6, containers=True)


def _aggregation(quick: bool, sim: Any, _: list[str] | None, _progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.aggregation import aggregation

    return aggregation(ks=(10,) if quick else (10, 100), repeat=2 if quick else 3)


def _ufl_cost(quick: bool, sim: Any, _: list[str] | None, _progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.ufl_cost import ufl_cost

    return ufl_cost(quick=quick)


def _feddle_cost(quick: bool, sim: Any, _: list[str] | None, _progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.feddle_cost import feddle_cost

    return feddle_cost(sim, quick=quick)


def _finetuning(quick: bool, sim: Any, _: list[str] | None, _progress: Progress) -> dict[str, Any]:
    from fedweigh.benchmarks.finetuning import finetuning_cost

    return finetuning_cost(quick=quick)


_RUNNERS: dict[str, Callable[[bool, Any, list[str] | None, Progress], dict[str, Any]]] = {
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
}
_NEEDS_SIMULATION = {"overhead", "gpu-overhead", "methods", "scale", "deployment", "feddle-cost"}


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
) -> dict[str, Any]:
    """Run one benchmark; returns its report (with the machine it ran on).

    ``progress``, if given, receives the report so far (marked ``partial``)
    whenever a benchmark of several long cases finishes one, so that a run
    stopped by a time limit keeps what it measured.
    """
    from fedweigh.benchmarks.common import machine_description

    started = time.monotonic()
    machine = machine_description()

    def so_far(partial: dict[str, Any]) -> None:
        if progress is not None:
            progress({"benchmark": name, "quick": quick, "machine": machine, "partial": True, **partial})

    report = _RUNNERS[name](quick, sim, strategies, so_far)
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

        names = [name for name in BENCHMARKS if name != "gpu-overhead" or torch.cuda.is_available()]
    if args.output is not None and len(names) > 1:
        print("fedweigh: --output names one file; run one benchmark at a time with it", file=sys.stderr)
        return 2
    strategies = [s.strip() for s in args.strategies.split(",")] if args.strategies else None
    sim = None
    try:
        if _NEEDS_SIMULATION & set(names):
            port = choose_port(args.port, DEFAULT_PORT)
            sim = LocalSimulation(
                APP_DIR,
                port=port,
                connection=f"fedweigh-bench-{port}",
                shared_ray=args.ray != "per-run",
                ray_nodes=2 if args.ray == "two-node" else 1,
            )
            sim.start()
        for name in names:
            print(f"[benchmark] {name}{' (quick)' if args.quick else ''} ...", file=sys.stderr, flush=True)
            path = args.output or (RESULTS_DIR / (f"{name}-quick.json" if args.quick else f"{name}.json"))
            # a long benchmark stopped by a time limit keeps the cases it finished beside the last full report
            partial_path = Path(path).with_suffix(".partial.json")
            report = run_benchmark(
                name,
                quick=args.quick,
                sim=sim,
                strategies=strategies,
                progress=lambda partial, p=partial_path: write_json(p, partial),
            )
            table = render_table(name, report)
            write_json(path, report)
            partial_path.unlink(missing_ok=True)
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
