"""The markdown table of each benchmark's report (``fedweigh benchmark`` prints it and writes it beside the JSON)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from fedweigh.benchmarks.common import markdown_table


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


_PARTS = ("training", "training_cpu", "client_other", "transport", "evaluation", "server_other", "round")


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
                *[f"{ms(split['simulation'].get(p))} / {ms(split['bare'].get(p))}" for p in _PARTS],
                _fmt(split["messages_per_round"], 1),
                _fmt(split["transport_ms_per_message"], 1),
                _fmt(floor.get("default", {}).get("median_ms"), 1),
                _fmt(floor.get("inline_8mib", {}).get("median_ms"), 1),
            ]
        )
    header = [
        "setting (rounds)",
        "training",
        "of it: training thread's CPU",
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


def _overhead_tables(report: dict[str, Any], gpu: bool = False) -> str:
    table = _overhead_table(report["settings"], gpu=gpu)
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


def _methods_table(report: dict[str, Any]) -> str:
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


def _scale_table(report: dict[str, Any]) -> str:
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


def _deployment_tables(report: dict[str, Any]) -> str:
    tables = [report, *([report["containers"]] if "containers" in report else [])]
    return "\n\n".join(
        f"{table['setting']}: {table['nodes']} nodes, {report['rounds']} rounds; rounds 2..T; "
        f"same final accuracy every way: {table['same_final_accuracy']}\n\n" + _deployment_table(table["ways"])
        for table in tables
    )


def _aggregation_table(report: dict[str, Any]) -> str:
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


def _ufl_cost_table(report: dict[str, Any]) -> str:
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


def _allocator_table(report: dict[str, Any]) -> str:
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


def _checkpoint_table(report: dict[str, Any]) -> str:
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


def _fine_tuning_table(report: dict[str, Any]) -> str:
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


def _feddle_cost_table(report: dict[str, Any]) -> str:
    return _feddle_tables(report)


def _gpu_evidence_table(report: dict[str, Any]) -> str:
    """One row a step, cases in the order they ran (value per estimated minute), each with what it found or why not."""
    rows = [
        [
            case["case"],
            _fmt(case["value_per_minute"]),
            step["step"],
            step["status"],
            _fmt(step["estimated_seconds"], 0),
            _fmt(step.get("seconds"), 0),
            " ".join((step.get("headline") or step.get("reason", "")).split()),  # one line a cell
        ]
        for case in report["cases"]
        for step in case["steps"] or [{"step": "–", "status": case["status"], "estimated_seconds": None}]
    ]
    header = ["case", "value/min", "step", "status", "estimated s", "took s", "found (or why not)"]
    used, device = report.get("elapsed_seconds", 0), report.get("device", "?")
    head = f"budget {report['budget_seconds']:.0f} s, {used:.0f} s used, on {device}"
    return head + "\n\n" + markdown_table(header, rows)


TABLES: dict[str, Callable[[dict[str, Any]], str]] = {
    "overhead": _overhead_tables,
    "gpu-overhead": functools.partial(_overhead_tables, gpu=True),
    "methods": _methods_table,
    "scale": _scale_table,
    "deployment": _deployment_tables,
    "aggregation": _aggregation_table,
    "ufl-cost": _ufl_cost_table,
    "feddle-cost": _feddle_tables,
    "allocator": _allocator_table,
    "checkpoint": _checkpoint_table,
    "fine-tuning": _fine_tuning_table,
    "gpu-evidence": _gpu_evidence_table,
}
"""Each benchmark's table, by the benchmark's name."""


def render_table(name: str, report: dict[str, Any]) -> str:
    """The markdown table of one benchmark's report."""
    if name not in TABLES:
        raise ValueError(f"unknown benchmark {name!r}")
    return TABLES[name](report)
