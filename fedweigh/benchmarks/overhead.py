"""Federation overhead: a FedAvg simulation against the same training in a bare loop.

Both sides train the same clients, in the same order, with the same seeds,
partitions, model, local steps, batch size, one torch thread and central
evaluation after every round; the simulation runs one ClientApp at a time
(``client-resources-num-cpus`` = all CPUs, so Ray starts one actor), exactly
like the loop. For FedAvg both compute the same numbers (checked:
``same_accuracies``), so the difference in wall time is the cost of the
federation machinery:

* **start-up**: the ``flwr run`` CLI, the simulation process, importing the
  apps, starting Ray and its actor, learning each node's partition, and
  loading the data in the ServerApp and in the actor (the bare loop loads it
  once);
* **per round**: messages to and from the clients (serialising the model,
  Ray's object store, the SuperLink's 0.1 s polling), validation and
  bookkeeping in the strategy, checkpoints.

The report gives the ratio of the whole runs (what a user waits for), the
ratio of the mean round time (start-up excluded) and where the time went:
wall-clock phases of each side, and the CPU seconds each process of the
simulation used (the ClientApp's actor, the simulation process, Ray's
daemons, the SuperLink), against the bare loop's CPU seconds.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedweigh.benchmarks.common import APP_DIR, CpuSampler, Setting, run_timed, simulation_roots
from fedweigh.benchmarks.ray_floor import ray_round_trip
from fedweigh.protocol import CLIENT_SECONDS, TRAIN_CPU_SECONDS
from fedweigh.results import EVALUATE_SECONDS, WAIT_SECONDS

__all__ = [
    "INLINE_LIMIT_ENV",
    "TARGET_RATIO",
    "federation_overhead",
    "round_breakdown",
    "rounds_to_target",
    "run_bare",
    "vanilla_peer",
    "warm_data_cache",
]

TARGET_RATIO = 1.3

INLINE_LIMIT_ENV = {"RAY_max_direct_call_object_size": str(8 * 2**20)}
"""Ray's limit for passing an argument or result inside the call instead of through its object store (100 KiB
by default), raised to 8 MiB: the Ray floor is measured with both."""


def warm_data_cache(run_config: Mapping[str, Any], num_partitions: int) -> None:
    """Build the dataset's Arrow cache once, so that neither side pays for it."""
    from fedweigh.components import data_spec
    from fedweigh.data.federated import clear_caches, load_test_split, partition_sizes
    from fedweigh.preflight import parse_settings

    spec = data_spec(parse_settings(run_config), num_partitions)
    partition_sizes(spec)
    load_test_split(spec)
    clear_caches()


def run_bare(run_config: Mapping[str, Any], num_partitions: int) -> dict[str, Any]:
    """The bare loop in a fresh Python process (its start-up and imports counted)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    started = time.monotonic()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-m", "fedweigh.benchmarks.bare", json.dumps(dict(run_config)), str(num_partitions)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    wall = time.monotonic() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"bare loop failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_seconds"] = wall
    result["cpu_seconds"] = round(
        (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime), 2
    )
    return result


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def round_breakdown(timed: Any, bare_rounds: list[Mapping[str, float]]) -> dict[str, Any]:
    """Where a round's time goes on each side: mean seconds per round over rounds 2..T.

    Simulation (``timed``, a :class:`~fedweigh.benchmarks.common.TimedRun`):

    * ``training``: the clients' ``train-seconds``;
    * ``training_cpu``: the CPU time the training thread used meanwhile
      (``train-cpu-seconds``): training less this is time it waited, for a
      core or for the GIL, rather than computed;
    * ``client_other``: the rest of the ClientApp's train handler
      (``client-seconds`` less training: the model loaded from the message,
      data looked up, the reply's arrays built);
    * ``transport``: the server's wait for the replies less the handlers,
      i.e. Flower and Ray carrying each message to the ClientApp and its reply
      back (exact with one ClientApp actor, which handles the round's
      messages one after the other);
    * ``evaluation``: the central evaluation (the model loaded and tested);
    * ``server_other``: the rest of the round, outside that wait (sampling,
      instructions, reply checks, aggregation, recording, checkpoint).

    Bare loop: ``training`` and ``training_cpu`` (measured alike); ``client_other`` (per client: the cached
    partition, loading the global model, copying the result);
    ``evaluation``; ``server_other`` (sampling and aggregation).
    ``difference`` is simulation less bare.
    """
    rows = timed.rows[1:]
    seconds = timed.round_seconds()[1:]
    waits = timed.round_field(WAIT_SECONDS)[1:]
    handlers = timed.summed(CLIENT_SECONDS)[1:]
    training = timed.train_seconds()[1:]
    training_cpu = timed.summed(TRAIN_CPU_SECONDS)[1:]
    evaluation = timed.round_field(EVALUATE_SECONDS)[1:]
    sim = {
        "training": _mean(training),
        "training_cpu": _mean(training_cpu),
        "client_other": _mean([h - t for h, t in zip(handlers, training, strict=True)]),
        "transport": _mean([w - h for w, h in zip(waits, handlers, strict=True)]),
        "evaluation": _mean(evaluation),
        "server_other": _mean([s - w - e for s, w, e in zip(seconds, waits, evaluation, strict=True)]),
        "round": _mean(seconds),
    }
    later = bare_rounds[1:]
    bare = {
        "training": _mean([r["train_seconds"] for r in later]),
        "training_cpu": _mean([r["train_cpu_seconds"] for r in later]),
        "client_other": _mean(
            [r["seconds"] - r["train_seconds"] - r["aggregate_seconds"] - r["evaluate_seconds"] for r in later]
        ),
        "transport": 0.0,
        "evaluation": _mean([r["evaluate_seconds"] for r in later]),
        "server_other": _mean([r["aggregate_seconds"] for r in later]),
        "round": _mean([r["seconds"] for r in later]),
    }
    messages = _mean([len(row.get("clients", [])) for row in rows]) or 0.0
    message_bytes = _mean([float(c.get("bytes_sent", 0)) for row in rows for c in row.get("clients", [])]) or 0.0

    def rounded(part: dict[str, float | None]) -> dict[str, float | None]:
        return {key: None if value is None else round(value, 4) for key, value in part.items()}

    difference = {
        key: None if sim[key] is None or bare[key] is None else sim[key] - bare[key]  # type: ignore[operator]
        for key in sim
    }
    transport = sim["transport"]
    per_message = round(1e3 * transport / messages, 2) if transport is not None and messages else None
    return {
        "simulation": rounded(sim),
        "bare": rounded(bare),
        "difference": rounded(difference),
        "messages_per_round": round(messages, 2),
        "message_bytes": int(message_bytes),
        "transport_ms_per_message": per_message,
    }


def rounds_to_target(
    sim_fixed: float, sim_round: float | None, bare_fixed: float, bare_round: float | None, target: float = TARGET_RATIO
) -> float | None:
    """Rounds T after which (sim_fixed + T sim_round) / (bare_fixed + T bare_round) <= ``target``; None: never.

    >>> rounds_to_target(10.0, 1.0, 2.0, 1.0, target=1.5)  # 10 + T <= 1.5 (2 + T)  <=>  T >= 14
    14.0
    >>> rounds_to_target(1.0, 1.0, 2.0, 1.0) is None, rounds_to_target(1.0, 2.0, 2.0, 1.0)
    (False, None)
    """
    if not sim_round or not bare_round:
        return None
    margin = target * bare_round - sim_round
    if margin <= 0:
        return None
    return max(0.0, (sim_fixed - target * bare_fixed) / margin)


@functools.cache
def _ray_floor(nbytes: int) -> dict[str, Any]:
    """A Ray actor call carrying ``nbytes`` each way, with Ray's defaults and with the inline limit raised.

    Measured once per size in a benchmark run (the settings share their model's size).
    """
    return {"default": ray_round_trip(nbytes), "inline_8mib": ray_round_trip(nbytes, env=INLINE_LIMIT_ENV)}


def federation_overhead(
    setting: Setting,
    sim: Any,
    output_dir: Path | None = None,
    repeats: int = 1,
    gpus_per_client: float = 0.0,
    cpus_per_client: int | None = None,
    ray_floor: bool = True,
) -> dict[str, Any]:
    """Time ``setting`` as a simulation on ``sim`` and as a bare loop; compare.

    With ``repeats`` > 1 each side runs that many times in the order
    bare, simulation, simulation, bare, ... (so a machine getting busier or
    quieter affects both alike) and each side's fastest run is compared.
    ``cpus_per_client`` (default: all CPUs, hence one ClientApp actor) and
    ``gpus_per_client`` are the simulation's client resources: with a GPU
    share below 1 and CPUs to spare, Ray runs as many actors at once as
    both allow. ``ray_floor`` adds a Ray actor's round trip for the
    setting's message size (two Ray starts; a smoke run leaves it out).

    Returns
    -------
    dict
        ``ratio`` (simulation wall / bare-loop wall, both from process start),
        ``round_ratio`` (mean round time, rounds 2..T), the extra fixed
        seconds and the rounds after which the ratio falls to
        :data:`TARGET_RATIO`, the phases of each side, the CPU seconds of
        each, and ``same_accuracies``.
    """
    from fedweigh.launch.runconfig import load_app_config

    defaults = load_app_config(APP_DIR)
    full = {**defaults, **setting.run_config}
    warm_data_cache(full, setting.num_supernodes)
    bares: list[dict[str, Any]] = []
    sims: list[tuple[Any, dict[str, float]]] = []
    cpus = cpus_per_client or os.cpu_count() or 1

    def simulate(index: int) -> None:
        with tempfile.TemporaryDirectory(dir=output_dir) as scratch:
            run_config = {**setting.run_config, "output-dir": scratch, "run-name": f"overhead-{setting.name}-{index}"}
            with CpuSampler(simulation_roots(sim)) as cpu:
                timed = run_timed(
                    sim, run_config, setting.num_supernodes, cpus_per_client=cpus, gpus_per_client=gpus_per_client
                )
        if not timed.ok:
            raise RuntimeError(f"the simulation of {setting.name} ended {timed.status}")
        sims.append((timed, cpu.by_name()))

    for index in range(repeats):
        if index % 2 == 0:
            bares.append(run_bare(full, setting.num_supernodes))
            simulate(index)
        else:
            simulate(index)
            bares.append(run_bare(full, setting.num_supernodes))
    bare = min(bares, key=lambda b: b["process_seconds"])
    timed, cpu_by_process = min(sims, key=lambda pair: pair[0].wall_seconds)

    sim_rounds = timed.round_seconds()
    bare_rounds = [r["seconds"] for r in bare["rounds"]]
    sim_train = timed.train_seconds()
    bare_train = [r["train_seconds"] for r in bare["rounds"]]
    later_sim, later_bare = _mean(sim_rounds[1:]), _mean(bare_rounds[1:])
    phases = timed.phases()
    breakdown = round_breakdown(timed, bare["rounds"])
    floor = _ray_floor(breakdown["message_bytes"]) if ray_floor and breakdown["message_bytes"] else None
    sim_fixed = timed.wall_seconds - sum(sim_rounds)
    bare_fixed = bare["process_seconds"] - sum(bare_rounds)
    return {
        "setting": setting.name,
        "run_config": setting.run_config,
        "num_supernodes": setting.num_supernodes,
        "cpus_per_client": cpus,
        "gpus_per_client": gpus_per_client,
        "rounds": len(sim_rounds),
        "simulation_seconds": round(timed.wall_seconds, 2),
        "bare_seconds": round(bare["process_seconds"], 2),
        "ratio": round(timed.wall_seconds / bare["process_seconds"], 3),
        "target_ratio": TARGET_RATIO,
        "round_seconds_simulation": [round(s, 3) for s in sim_rounds],
        "round_seconds_bare": [round(s, 3) for s in bare_rounds],
        "round_ratio": round(later_sim / later_bare, 3) if later_sim and later_bare else None,
        "per_round_overhead_seconds": round(later_sim - later_bare, 3) if later_sim and later_bare else None,
        "fixed_overhead_seconds": round(sim_fixed - bare_fixed, 2),
        "rounds_to_target": rounds_to_target(sim_fixed, later_sim, bare_fixed, later_bare),
        "train_seconds_per_round_simulation": [round(s, 3) for s in sim_train],
        "train_seconds_per_round_bare": [round(s, 3) for s in bare_train],
        "round_breakdown": breakdown,
        "ray_floor": floor,
        "simulation_phases": phases,
        "bare_phases": {
            "process_start_and_imports": round(
                bare["process_seconds"] - bare["setup_seconds"] - bare["loop_seconds"], 3
            ),
            "data_and_model_setup": round(bare["setup_seconds"], 3),
            "rounds": round(bare["loop_seconds"], 3),
        },
        "first_round_seconds": {"simulation": round(sim_rounds[0], 3), "bare": round(bare_rounds[0], 3)},
        "repeats": repeats,
        "all_walls": {
            "bare": [round(b["process_seconds"], 2) for b in bares],
            "simulation": [round(t.wall_seconds, 2) for t, _ in sims],
        },
        "cpu_seconds": {"bare": bare["cpu_seconds"], "simulation": round(sum(cpu_by_process.values()), 2)},
        "simulation_cpu_seconds_by_process": cpu_by_process,
        "same_accuracies": timed.accuracies() == bare["accuracies"],
        "accuracies": {"simulation": timed.accuracies(), "bare": bare["accuracies"]},
    }


VANILLA_APP = APP_DIR / "benchmarks" / "vanilla_fedavg"
"""The vanilla peer: Flower's FedAvg and a plain ClientApp, no fedweigh import (its pyproject says more)."""


def peer_settings(rounds: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same work for both apps: 5 clients, all of them every round, 750 CIFAR-10 images, the FedOUI CNN.

    All clients train every round, so the two apps' different client sampling cannot make their rounds
    differ in work; no augmentation (the vanilla client has none); central evaluation on 1,000 images.
    """
    from fedweigh.benchmarks.common import dataset_folder

    dataset = dataset_folder("cifar10")
    shared = {"num-server-rounds": rounds, "dataset": dataset, "train-subset": 750, "test-subset": 1000}
    shared |= {"local-epochs": 1, "batch-size": 32, "learning-rate": 0.01, "momentum": 0.9, "seed": 1}
    fedweigh = {
        **shared,
        "strategy": "fedavg",
        "model": "fedoui-cnn",
        "partitioner": "iid",
        "fraction-train": 1.0,
        "min-train-nodes": 5,
        "weight-decay": 0.0,
        "augment": False,
        "eval-batch-size": 256,
    }
    return fedweigh, shared


def vanilla_peer(sim: Any, rounds: int = 30, repeats: int = 2, output_dir: Path | None = None) -> dict[str, Any]:
    """fedweigh's FedAvg against the vanilla Flower app, the same work on the same engine, alternating.

    Returns each side's fastest run: wall seconds (``flwr run`` to finished),
    mean round seconds (rounds 2..T, the ServerApp's own clock), and the
    ratios fedweigh / vanilla.
    """
    from fedweigh.benchmarks.common import run_timed
    from fedweigh.results import read_metrics

    if not (VANILLA_APP / "pyproject.toml").is_file():
        raise RuntimeError(f"the vanilla peer app is missing: {VANILLA_APP} (it ships with the repository)")
    ours_config, vanilla_config = peer_settings(rounds)
    cpus = os.cpu_count() or 1
    ours: list[tuple[float, list[float]]] = []
    theirs: list[tuple[float, list[float]]] = []

    def run_ours(index: int) -> None:
        with tempfile.TemporaryDirectory(dir=output_dir) as scratch:
            config = {**ours_config, "output-dir": scratch, "run-name": f"peer-fedweigh-{index}"}
            timed = run_timed(sim, config, 5, cpus_per_client=cpus)
            if not timed.ok:
                raise RuntimeError(f"fedweigh's side of the peer benchmark ended {timed.status}")
            ours.append((timed.wall_seconds, timed.round_seconds()))

    def run_vanilla(index: int) -> None:
        with tempfile.TemporaryDirectory(dir=output_dir) as scratch:
            config = {**vanilla_config, "output-dir": scratch, "run-name": f"peer-vanilla-{index}"}
            outcome = sim.run(config, num_supernodes=5, cpus_per_client=cpus, app_dir=VANILLA_APP, echo=False)
            if not outcome.ok or outcome.results_dir is None:
                raise RuntimeError(f"the vanilla peer ended {outcome.status}: {outcome.details}")
            rows = read_metrics(outcome.results_dir)
            theirs.append((outcome.timings["total_s"], [row["seconds"] for row in rows]))

    for index in range(repeats):
        first, second = (run_ours, run_vanilla) if index % 2 == 0 else (run_vanilla, run_ours)
        first(index)
        second(index)
    best_ours, best_theirs = min(ours), min(theirs)
    round_ours, round_theirs = _mean(best_ours[1][1:]), _mean(best_theirs[1][1:])
    return {
        "rounds": rounds,
        "fedweigh_seconds": round(best_ours[0], 2),
        "vanilla_seconds": round(best_theirs[0], 2),
        "ratio": round(best_ours[0] / best_theirs[0], 3),
        "fedweigh_round_seconds": round(round_ours, 4) if round_ours else None,
        "vanilla_round_seconds": round(round_theirs, 4) if round_theirs else None,
        "round_ratio": round(round_ours / round_theirs, 3) if round_ours and round_theirs else None,
        "all_walls": {"fedweigh": [round(w, 2) for w, _ in ours], "vanilla": [round(w, 2) for w, _ in theirs]},
        "repeats": repeats,
    }
