"""Deployment rounds: a real multi-host federation against the simulation of the same work.

The federation is :mod:`fedweigh.launch.virtual_federation`'s: a SuperLink and
SuperNodes as separate processes on separate hosts (network namespaces where
permitted, else loopback, which the report says), TLS everywhere and SuperNode
authentication on. The same run (CIFAR-10, fedoui-cnn, every client in every
round) goes four ways:

``simulation``
    ``flwr run`` on a local simulation SuperLink, one ClientApp actor per client;
``deployment``
    Flower's default isolation: the SuperNode's SuperExec starts a
    ``flwr-clientapp`` process for every message (imports, data load each time);
``deployment-resident``
    ``--isolation process`` and ``fedweigh-superexec`` (:mod:`fedweigh.flower.resident`):
    one long-running ClientApp process per SuperNode, Flower's SuperNode;
``deployment-resident-prompt``
    the same with ``fedweigh-supernode`` (:mod:`fedweigh.flower.supernode`): the
    SuperNode asks for its next message without Flower's 3 s wait.

With ``containers=True`` and a Docker engine, the same run once more on the
repository's compose stack (:mod:`fedweigh.launch.containers`; the images of
``deploy/build-images.sh -a``), beside a simulation of the same work: its
three sites (the compose files' partitions 0-2 of 3), so three clients there
and in that simulation. The dataset is copied into the stack's
``deploy/data`` (mounted read-only at ``/app/data``):

``containers``
    ``docker-compose.yml``: Flower's images, Flower's default SuperExec;
``containers-resident-prompt``
    with ``docker-compose.resident.yml``: fedweigh-superexec and
    fedweigh-supernode at every site.

Per way: the ServerApp's seconds per round (rounds 2..T: round 1 also loads
data everywhere), the clients' own training time in those rounds, and the
rest, the round's overhead, in two parts: the hand-off (the ServerApp's wait
for the round's replies, ``wait_seconds``, less the slower client's training:
messages to and from the clients, and the waits between) and the server's own
work (the round less that wait: sampling, aggregation, central evaluation,
recording). Nothing here asserts a time.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from fedweigh.benchmarks.common import Setting, dataset_folder, run_timed
from fedweigh.results import EVALUATE_SECONDS, WAIT_SECONDS, read_metrics

__all__ = ["CONTAINER_WAYS", "DEPLOYED_WAYS", "deployment", "deployment_setting"]

DEPLOYED_WAYS = {
    "deployment": {"resident": False, "prompt": False},
    "deployment-resident": {"resident": True, "prompt": False},
    "deployment-resident-prompt": {"resident": True, "prompt": True},
}
"""Each deployed way: ``Federation.start_supernode``'s choices for every site."""
CONTAINER_WAYS = {
    "containers": ["docker-compose.yml"],
    "containers-resident-prompt": ["docker-compose.yml", "docker-compose.resident.yml"],
}
"""Each way in containers: the compose files it brings up."""


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
    waits = [float(row[WAIT_SECONDS]) for row in later]
    evaluation = [float(row.get(EVALUATE_SECONDS) or 0.0) for row in later]
    return {
        "way": way,
        "status": "ok",
        "round_seconds": round(statistics.mean(rounds), 3),
        "round_seconds_std": round(statistics.pstdev(rounds), 3),
        "first_round_seconds": round(float(rows[0]["seconds"]), 3),
        "client_train_seconds": round(statistics.mean(training), 3),
        "overhead_seconds": round(statistics.mean(overhead), 3),
        "handoff_seconds": round(statistics.mean(w - t for w, t in zip(waits, training, strict=True)), 3),
        "server_seconds": round(statistics.mean(r - w for r, w in zip(rounds, waits, strict=True)), 3),
        "evaluate_seconds": round(statistics.mean(evaluation), 3),
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


def _deployed(setting: Setting, way: str, scratch: Path) -> dict[str, Any]:
    from fedweigh.launch.virtual_federation import federation_on_hosts

    nodes = [f"node-{i + 1}" for i in range(setting.num_supernodes)]
    with federation_on_hosts(nodes, scratch / f"{way}-hosts", nodes) as fed:
        for index, name in enumerate(nodes):
            fed.register(name)
            node_config = {"partition-id": index, "num-partitions": len(nodes)}
            fed.start_supernode(name, name, node_config, **DEPLOYED_WAYS[way])
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


def _in_containers(setting: Setting, way: str, scratch: Path) -> dict[str, Any]:
    from fedweigh.launch.containers import FLOWER_VERSION, Project, Stack, engine_problem, run

    if problem := engine_problem():
        return {"way": way, "status": f"not run: {problem}"}
    image = f"fedweigh-superexec:{FLOWER_VERSION}"
    if run(["docker", "image", "inspect", image], check=False).returncode != 0:
        return {"way": way, "status": f"not run: no image {image} (deploy/build-images.sh -a)"}
    project = Project(scratch / f"{way}-project")
    project.prepare()
    dataset = Path(setting.run_config["dataset"])
    shutil.copytree(dataset, project.data / dataset.name)
    stack = Stack(project, way.replace("-", ""), CONTAINER_WAYS[way])
    try:
        stack.bring_up()
        config = {**setting.run_config, "dataset": f"/app/data/{dataset.name}", "output-dir": "/app/outputs"}
        started = time.monotonic()
        folder = stack.completed({**config, "run-name": way}, timeout=1800)
        wall = time.monotonic() - started
    except RuntimeError as err:
        return {"way": way, "status": "failed", "details": str(err)[-2000:]}
    finally:
        stack.down()
    return _summary(way, read_metrics(folder), wall, {"hosts": "containers", "tls": True, "node_auth": True})


def _compared(ways: list[dict[str, Any]]) -> bool:
    """Add each deployed way's ratio to the simulation (the first way); whether all ended with the same accuracy."""
    base = ways[0] if ways[0]["status"] == "ok" else None
    for way in ways[1:]:
        if base is not None and way["status"] == "ok":
            way["round_ratio_vs_simulation"] = round(way["round_seconds"] / base["round_seconds"], 2)
            way["extra_seconds_per_round_vs_simulation"] = round(way["round_seconds"] - base["round_seconds"], 3)
    return len({way["final_accuracy"] for way in ways if way["status"] == "ok"}) == 1


def deployment(
    sim: Any, nodes: int = 2, rounds: int = 6, output_dir: Path | None = None, containers: bool = False
) -> dict[str, Any]:
    """The same run simulated and deployed each of the :data:`DEPLOYED_WAYS` (and :data:`CONTAINER_WAYS`)."""
    setting = deployment_setting(nodes, rounds)
    with tempfile.TemporaryDirectory(dir=output_dir) as folder:
        scratch = Path(folder)
        ways = [_simulated(sim, setting, scratch), *(_deployed(setting, way, scratch) for way in DEPLOYED_WAYS)]
        report = {
            "setting": setting.name,
            "run_config": setting.run_config,
            "nodes": nodes,
            "rounds": rounds,
            "same_final_accuracy": _compared(ways),
            "ways": ways,
        }
        if containers:
            from fedweigh.launch.containers import SUPERNODES

            in_compose = deployment_setting(len(SUPERNODES), rounds)
            (scratch / "compose").mkdir()
            boxed = [_simulated(sim, in_compose, scratch / "compose")]
            boxed += [_in_containers(in_compose, way, scratch) for way in CONTAINER_WAYS]
            report["containers"] = {
                "setting": in_compose.name,
                "run_config": in_compose.run_config,
                "nodes": len(SUPERNODES),
                "same_final_accuracy": _compared(boxed),
                "ways": boxed,
            }
    return report
