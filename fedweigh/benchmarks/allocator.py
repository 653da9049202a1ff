"""The same local training and central evaluation in a plain process, in a thread and in a Ray worker, with
glibc's default malloc and with fedweigh's settings (``fedweigh benchmark allocator``).

Each case is a fresh process (malloc's thresholds are per process and stick):
a plain Python process started for the case, or a new Ray actor. Every case
trains the clients of the FedOUI CIFAR-10 benchmark setting, round by round
with the simulation's sampling and client seeds, from the same initial model,
and after each round evaluates the model on the setting's test images as the
ServerApp does, ``repeats`` times over; it reports the seconds of each pass
and the page faults (minor faults) the passes caused. No Flower message is
involved: this isolates what the process itself does to the same PyTorch work.

The ``thread`` cases run the passes in a thread other than the process's
main one, where a simulation runs its ServerApp and the in-process backend
its ClientApp; ``arena`` ``"1"`` starts the process with
``MALLOC_ARENA_MAX=1`` (:data:`fedweigh.allocator.PROCESS_ENV`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, NamedTuple

__all__ = ["CASES", "Case", "allocator_cost", "train_passes"]


class Case(NamedTuple):
    """One process of the benchmark."""

    process: str  # "plain" (a Python process) or "ray" (a Ray actor's worker process)
    keep_freed_memory: bool  # fedweigh's malloc thresholds (fedweigh.allocator.keep_freed_memory)
    thread: bool  # the passes in a thread other than the main one
    arena: str  # "default" or "1": MALLOC_ARENA_MAX in the process's environment


CASES = (
    Case("plain", False, False, "default"),
    Case("plain", True, False, "default"),
    Case("ray", False, False, "default"),
    Case("ray", True, False, "default"),
    Case("plain", True, True, "default"),
    Case("plain", True, True, "1"),
)


def train_passes(rounds: int, repeats: int, keep: bool, thread: bool = False) -> dict[str, Any]:
    """Train the setting's sampled clients and evaluate, ``rounds`` rounds, ``repeats`` times, in this process."""
    if thread:
        result: list[dict[str, Any]] = []
        worker = threading.Thread(target=lambda: result.append(train_passes(rounds, repeats, keep)))
        worker.start()
        worker.join()
        return result[0]
    import torch

    from fedweigh.allocator import keep_freed_memory
    from fedweigh.benchmarks.bare import train_client
    from fedweigh.benchmarks.common import APP_DIR, fedoui_cifar10
    from fedweigh.client.training import evaluate
    from fedweigh.client_app import client_seed
    from fedweigh.components import batch_transform, data_spec, new_model, resolve_device
    from fedweigh.data.federated import load_partition, load_test_split
    from fedweigh.launch.runconfig import load_app_config
    from fedweigh.models import on_device
    from fedweigh.preflight import parse_settings
    from fedweigh.protocol import TrainRecipe
    from fedweigh.strategies.build import build_strategy
    from fedweigh.strategies.sampling import sample_partitions, sample_size

    torch.set_num_threads(1)  # as configure_torch, without its allocator step
    applied = keep_freed_memory() if keep else {}
    setting = fedoui_cifar10(rounds)
    settings = parse_settings({**load_app_config(APP_DIR), **setting.run_config})
    strategy = build_strategy(settings)
    device = resolve_device(settings.device)
    spec = data_spec(settings, setting.num_supernodes)
    transform = batch_transform(settings)
    test = load_test_split(spec)
    model = on_device(new_model(settings), device)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    size = sample_size(setting.num_supernodes, settings.fraction_train, settings.min_train_nodes)
    partitions, sampling = range(setting.num_supernodes), settings.client_sampling
    plan = [
        (r, [(p, load_partition(spec, p)) for p in sample_partitions(settings.seed, r, partitions, size, sampling)])
        for r in range(1, rounds + 1)
    ]
    seconds, faults, eval_seconds, eval_faults = [], [], [], []
    for _ in range(repeats):
        train_pass = eval_pass = 0.0
        faulted = eval_faulted = 0
        for server_round, clients in plan:
            recipe = TrainRecipe.from_config({**strategy.recipe, **strategy.round_values(server_round)})
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for partition, data in clients:
                model.load_state_dict(initial)
                seed = client_seed(settings.seed, server_round, partition)
                train_pass += train_client(model, data, recipe, transform, device, seed).seconds
            started, middle = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            evaluate(model, test, transform, device, settings.eval_batch_size)  # as the ServerApp, once a round
            eval_pass += time.perf_counter() - started
            after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            faulted, eval_faulted = faulted + middle - before, eval_faulted + after - middle
        seconds.append(round(train_pass, 3))
        faults.append(faulted)
        eval_seconds.append(round(eval_pass, 3))
        eval_faults.append(eval_faulted)
    return {
        "train_seconds": seconds,
        "minor_faults": faults,
        "evaluate_seconds": eval_seconds,
        "evaluate_minor_faults": eval_faults,
        "thresholds_set": applied,
        "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX"),
        "main_thread": threading.current_thread() is threading.main_thread(),
    }


class _Worker:
    """A Ray actor running :func:`train_passes` in its own worker process."""

    def run(self, rounds: int, repeats: int, keep: bool) -> dict[str, Any]:
        return train_passes(rounds, repeats, keep)


def _plain(rounds: int, repeats: int, case: Case) -> dict[str, Any]:
    command = [sys.executable, "-m", "fedweigh.benchmarks.allocator", str(rounds), str(repeats)]
    command += [*(["--keep"] if case.keep_freed_memory else []), *(["--thread"] if case.thread else [])]
    env = {key: value for key, value in os.environ.items() if key != "MALLOC_ARENA_MAX"}
    if case.arena != "default":
        env["MALLOC_ARENA_MAX"] = case.arena
    done = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def allocator_cost(rounds: int = 20, repeats: int = 3) -> dict[str, Any]:
    """Every case of :data:`CASES`; the ratios compare each case's median pass with the plain default's."""
    import ray

    results = []
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        worker = ray.remote(num_cpus=1)(_Worker)
        for case in CASES:
            if case.process == "plain":
                measured = _plain(rounds, repeats, case)
            else:
                actor = worker.remote()  # a new worker process for each case
                measured = ray.get(actor.run.remote(rounds, repeats, case.keep_freed_memory))
                ray.kill(actor)
            results.append({**case._asdict(), **measured})
    finally:
        ray.shutdown()
    reference = statistics.median(results[0]["train_seconds"])
    evaluation_reference = statistics.median(results[0]["evaluate_seconds"])
    for result in results:
        for key in ("train_seconds", "minor_faults", "evaluate_seconds", "evaluate_minor_faults"):
            result[f"median_{key}"] = statistics.median(result[key])
        result["vs_plain_default"] = round(result["median_train_seconds"] / reference, 3)
        result["evaluate_vs_plain_default"] = round(result["median_evaluate_seconds"] / evaluation_reference, 3)
    return {"setting": "fedoui-cifar10", "rounds": rounds, "repeats": repeats, "cases": results}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one plain-process case of the allocator benchmark")
    parser.add_argument("rounds", type=int)
    parser.add_argument("repeats", type=int)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--thread", action="store_true", help="run the passes in a thread other than the main one")
    args = parser.parse_args()
    print(json.dumps(train_passes(args.rounds, args.repeats, args.keep, args.thread)))
