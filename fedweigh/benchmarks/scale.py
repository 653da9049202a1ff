"""Scale: 100, 1,000 and 10,000 virtual clients, 10 per round, on one machine.

Each client holds the same amount of data in both federations (an IID split
of a subset of MNIST with ``samples_per_client`` images each), so a round
does the same work; what may grow with the number of clients is the
federation's own cost: the simulation engine's per-node bookkeeping, the
one-time query that tells the server each node's partition
(:class:`~fedweigh.strategies.sampling.NodeDirectory`), and memory.

Measured: the peak summed PSS (proportional set size) of the SuperLink's process tree (SuperLink,
SuperExec, the simulation process, Ray and its actors) while the run goes,
the mean round time (rounds 2..T), and the start-up from the simulation
process start to the server being ready (which holds the node query and
the data check), with the node query's own time (the ServerApp logs it) and
the data check's (timed again in this process).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedweigh.benchmarks.common import MemorySampler, Setting, dataset_folder, run_timed, simulation_roots

__all__ = ["revisit_share", "scale", "scale_setting", "time_partition_check"]


SAMPLES_PER_CLIENT = 5
"""Images per client at every size: 10,000 clients of 5 fit MNIST's 60,000 training images."""


def scale_setting(
    num_clients: int, per_round: int = 10, samples_per_client: int = SAMPLES_PER_CLIENT, rounds: int = 4
) -> Setting:
    """MNIST, IID, ``samples_per_client`` images per client, ``per_round`` clients per round."""
    return Setting(
        f"mnist-iid-{num_clients}",
        {
            "strategy": "fedavg",
            "dataset": dataset_folder("mnist"),
            "model": "lenet5",
            "partitioner": "iid",
            "train-subset": num_clients * samples_per_client,
            "test-subset": 1000,
            "fraction-train": per_round / num_clients,
            "min-train-nodes": 2,
            "augment": False,
            "num-server-rounds": rounds,
        },
        num_supernodes=num_clients,
    )


def time_partition_check(setting: Setting) -> float:
    """Seconds the ServerApp's data check (partition sizes of every client) takes, in this process."""
    from fedweigh.benchmarks.common import APP_DIR
    from fedweigh.components import data_spec
    from fedweigh.data.federated import clear_caches, partition_sizes
    from fedweigh.launch.runconfig import load_app_config
    from fedweigh.preflight import parse_settings

    spec = data_spec(parse_settings({**load_app_config(APP_DIR), **setting.run_config}), setting.num_supernodes)
    partition_sizes(spec)  # warm: the dataset load is not what scales
    started = time.perf_counter()
    partition_sizes(spec)
    seconds = time.perf_counter() - started
    clear_caches()
    return seconds


def revisit_share(sampled: list[list[int]]) -> float:
    """Share of the rounds' client trainings whose client had trained before in the run.

    A revisited client's data is already decoded in the actor's cache, so a
    small federation trains faster per round for a reason that is not the
    federation's own cost (with 100 clients, 10 a round for 30 rounds, 68 %).
    """
    seen: set[int] = set()
    revisits = total = 0
    for clients in sampled:
        for client in clients:
            total += 1
            revisits += client in seen
            seen.add(client)
    return round(revisits / total, 3) if total else 0.0


def scale(
    sim: Any, sizes: tuple[int, ...] = (100, 1000, 10000), rounds: int = 30, output_dir: Path | None = None
) -> dict[str, Any]:
    """Run the same per-round work with each number of clients; memory and time per size.

    Against the smallest size: the ratio of peak memory and of round time,
    the memory each extra virtual client costs, and the start-up each extra
    client adds.
    """
    if sim.process is None:
        raise RuntimeError("the scale benchmark needs a SuperLink it started itself (to measure its processes)")
    rows = []
    with tempfile.TemporaryDirectory(dir=output_dir) as scratch:
        for size in sizes:
            setting = scale_setting(size, rounds=rounds)
            config = {**setting.run_config, "output-dir": scratch, "run-name": f"scale-{size}"}
            with MemorySampler(simulation_roots(sim), interval=0.25) as memory:
                started = time.monotonic()
                timed = run_timed(sim, config, setting.num_supernodes, cpus_per_client=1)
            if not timed.ok:
                rows.append({"clients": size, "status": timed.status})
                continue
            rounds_seconds = timed.round_seconds()
            marks = timed.marks
            rows.append(
                {
                    "clients": size,
                    "status": "ok",
                    "per_round": int(len(timed.rows[0]["sampled"])) if timed.rows else None,
                    "revisit_share": revisit_share([row["sampled"] for row in timed.rows]),
                    "peak_pss_mb": round(memory.peak_between(started) / 2**20, 1),
                    "peak_processes": max((n for _, _, n in memory.samples), default=0),
                    "round_seconds": round(float(np.mean(rounds_seconds[1:] or rounds_seconds)), 3),
                    "round_seconds_std": round(float(np.std(rounds_seconds[1:] or rounds_seconds)), 3),
                    "rounds": [round(r, 3) for r in rounds_seconds],
                    "startup_seconds": round(marks["server_ready"] - marks["simulation_started"], 2)
                    if "server_ready" in marks and "simulation_started" in marks
                    else None,
                    "wall_seconds": round(timed.wall_seconds, 2),
                    "node_query_seconds": round(sum(seconds for _, seconds in timed.node_queries), 2),
                    "partition_check_seconds": round(time_partition_check(setting), 3),
                }
            )
    base = next((row for row in rows if row["status"] == "ok"), None)
    for row in rows:
        if base is None or row["status"] != "ok" or row is base:
            continue
        extra = row["clients"] - base["clients"]
        row["memory_ratio"] = round(row["peak_pss_mb"] / base["peak_pss_mb"], 3)
        row["round_ratio"] = round(row["round_seconds"] / base["round_seconds"], 3)
        row["kb_per_extra_client"] = round((row["peak_pss_mb"] - base["peak_pss_mb"]) * 1024 / extra, 2)
        if row["startup_seconds"] is not None and base["startup_seconds"] is not None:
            row["startup_ms_per_extra_client"] = round(
                (row["startup_seconds"] - base["startup_seconds"]) * 1000 / extra, 3
            )
    return {"sizes": list(sizes), "samples_per_client": SAMPLES_PER_CLIENT, "clients": rows}
