"""Deployment rounds: a real multi-host federation against the simulation of the same work.

The federation is :mod:`fedweigh.launch.virtual_federation`'s: a SuperLink and
SuperNodes as separate processes on separate hosts (network namespaces where
permitted, else loopback, which the report says), TLS everywhere and SuperNode
authentication on. The same run (CIFAR-10, fedoui-cnn, every client in every
round) goes three ways:

``simulation``
    ``flwr run`` on a local simulation SuperLink, one ClientApp actor per client;
``deployment``
    Flower's default isolation: the SuperNode's SuperExec starts a
    ``flwr-clientapp`` process for every message (imports, data load each time);
``deployment-resident``
    ``--isolation process`` and ``fedweigh-superexec`` (:mod:`fedweigh.resident`):
    one long-running ClientApp process per SuperNode.

Per way: the ServerApp's seconds per round (rounds 2..T: round 1 also loads
data everywhere), the clients' own training time in those rounds, and the
rest, the round's overhead. Nothing here asserts a time.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from fedweigh.benchmarks.common import Setting, dataset_folder, run_timed
from fedweigh.results import read_metrics

__all__ = ["deployment", "deployment_setting"]


def deployment_setting(nodes: int = 2, rounds: int = 6) -> Setting:
    """CIFAR-10 (1,000 training images per client), fedoui-cnn, FedAvg, every client every round."""
    return Setting(
        "cifar10-deployment",
        {
            "strategy": "fedavg",
            "dataset": dataset_folder("cifar10"),
            "model": "fedoui-cnn",
            "partitioner": "iid",
            "train-subset": 1000 * nodes,
            "test-subset": 1000,
            "fraction-train": 1.0,
            "min-train-nodes": nodes,
            "local-epochs": 1,
            "batch-size": 32,
            "learning-rate": 0.01,
            "momentum": 0.9,
            "eval-batch-size": 256,
            "seed": 1,
            "num-server-rounds": rounds,
        },
        num_supernodes=nodes,
    )


def _summary(way: str, rows: list[dict[str, Any]], wall: float, extra: dict[str, Any]) -> dict[str, Any]:
    later = rows[1:] or rows
    rounds = [float(row["seconds"]) for row in later]
    training = [max(float(c.get("train-seconds", 0.0)) for c in row["clients"]) for row in later]
    overhead = [r - t for r, t in zip(rounds, training, strict=True)]
    return {
        "way": way,
        "status": "ok",
        "round_seconds": round(statistics.mean(rounds), 3),
        "round_seconds_std": round(statistics.pstdev(rounds), 3),
        "first_round_seconds": round(float(rows[0]["seconds"]), 3),
        "client_train_seconds": round(statistics.mean(training), 3),
        "overhead_seconds": round(statistics.mean(overhead), 3),
        "wall_seconds": round(wall, 1),
        "final_accuracy": float(rows[-1]["accuracy"]),
        **extra,
    }


def _simulated(sim: Any, setting: Setting, scratch: Path) -> dict[str, Any]:
    config = {**setting.run_config, "output-dir": str(scratch), "run-name": "simulation"}
    timed = run_timed(sim, config, setting.num_supernodes, cpus_per_client=1)
    if not timed.ok:
        return {"way": "simulation", "status": timed.status}
    return _summary("simulation", timed.rows, timed.wall_seconds, {})


def _deployed(setting: Setting, resident: bool, scratch: Path) -> dict[str, Any]:
    from fedweigh.launch.virtual_federation import federation_on_hosts

    way = "deployment-resident" if resident else "deployment"
    nodes = [f"node-{i + 1}" for i in range(setting.num_supernodes)]
    with federation_on_hosts(nodes, scratch / f"{way}-hosts", nodes) as fed:
        for index, name in enumerate(nodes):
            fed.register(name)
            fed.start_supernode(name, name, {"partition-id": index, "num-partitions": len(nodes)}, resident=resident)
        for name in nodes:
            fed.supernodes[name].wait_for(r"SuperNode ID: \d+", timeout=180)
        config = {**setting.run_config, "output-dir": str(scratch), "run-name": way}
        started = time.monotonic()
        run = fed.finish(fed.submit(config, way), timeout=1800)
        wall = time.monotonic() - started
        if run.status != "finished:completed":
            return {"way": way, "status": run.status or "unknown", "details": run.details}
        hosts = "network namespaces" if fed.topology.isolated else "loopback"
    return _summary(way, read_metrics(scratch / way), wall, {"hosts": hosts, "tls": True, "node_auth": True})


def deployment(sim: Any, nodes: int = 2, rounds: int = 6, output_dir: Path | None = None) -> dict[str, Any]:
    """The same run simulated, deployed with Flower's default isolation, and deployed with resident ClientApps."""
    setting = deployment_setting(nodes, rounds)
    with tempfile.TemporaryDirectory(dir=output_dir) as folder:
        scratch = Path(folder)
        ways = [
            _simulated(sim, setting, scratch),
            _deployed(setting, False, scratch),
            _deployed(setting, True, scratch),
        ]
    base = ways[0] if ways[0]["status"] == "ok" else None
    for way in ways[1:]:
        if base is not None and way["status"] == "ok":
            way["round_ratio_vs_simulation"] = round(way["round_seconds"] / base["round_seconds"], 2)
            way["extra_seconds_per_round_vs_simulation"] = round(way["round_seconds"] - base["round_seconds"], 3)
    accuracies = {way["final_accuracy"] for way in ways if way["status"] == "ok"}
    return {
        "setting": setting.name,
        "run_config": setting.run_config,
        "nodes": nodes,
        "rounds": rounds,
        "same_final_accuracy": len(accuracies) == 1,
        "ways": ways,
    }
