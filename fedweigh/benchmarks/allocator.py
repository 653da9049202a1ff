"""The same local training in a plain process and in a Ray worker, with glibc's default malloc and with
:func:`fedweigh.allocator.keep_freed_memory` (``fedweigh benchmark allocator``).

Each case is a fresh process (malloc's thresholds are per process and stick):
a plain Python process started for the case, or a new Ray actor. Every case
trains the clients of the FedOUI CIFAR-10 benchmark setting, round by round
with the simulation's sampling and client seeds, from the same initial model,
``repeats`` times over; it reports the training seconds of each pass and the
page faults (minor faults) the passes caused. No Flower message is involved:
this isolates what the process itself does to the same PyTorch work.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
from typing import Any

__all__ = ["CASES", "allocator_cost", "train_passes"]

# (process, keep freed memory)
CASES = (("plain", False), ("plain", True), ("ray", False), ("ray", True))


def train_passes(rounds: int, repeats: int, keep: bool) -> dict[str, Any]:
    """Train the setting's sampled clients for ``rounds`` rounds, ``repeats`` times, in this process."""
    import torch

    from fedweigh.allocator import keep_freed_memory
    from fedweigh.benchmarks.bare import train_client
    from fedweigh.benchmarks.common import APP_DIR, fedoui_cifar10
    from fedweigh.client_app import client_seed
    from fedweigh.components import batch_transform, data_spec, new_model, resolve_device
    from fedweigh.data.federated import load_partition
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
    model = on_device(new_model(settings), device)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    size = sample_size(setting.num_supernodes, settings.fraction_train, settings.min_train_nodes)
    plan = [
        (r, p, load_partition(spec, p))
        for r in range(1, rounds + 1)
        for p in sample_partitions(settings.seed, r, range(setting.num_supernodes), size, settings.client_sampling)
    ]
    seconds, faults = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        total = 0.0
        for server_round, partition, data in plan:
            model.load_state_dict(initial)
            recipe = TrainRecipe.from_config({**strategy.recipe, **strategy.round_values(server_round)})
            seed = client_seed(settings.seed, server_round, partition)
            total += train_client(model, data, recipe, transform, device, seed).seconds
        seconds.append(round(total, 3))
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return {"train_seconds": seconds, "minor_faults": faults, "thresholds_set": applied}


class _Worker:
    """A Ray actor running :func:`train_passes` in its own worker process."""

    def run(self, rounds: int, repeats: int, keep: bool) -> dict[str, Any]:
        return train_passes(rounds, repeats, keep)


def _plain(rounds: int, repeats: int, keep: bool) -> dict[str, Any]:
    command = [sys.executable, "-m", "fedweigh.benchmarks.allocator", str(rounds), str(repeats)]
    done = subprocess.run([*command, *(["--keep"] if keep else [])], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def allocator_cost(rounds: int = 20, repeats: int = 3) -> dict[str, Any]:
    """Every case of :data:`CASES`; the ratios compare each case's median pass with the plain default's."""
    import ray

    results = []
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        worker = ray.remote(num_cpus=1)(_Worker)
        for process, keep in CASES:
            if process == "plain":
                measured = _plain(rounds, repeats, keep)
            else:
                actor = worker.remote()  # a new worker process for each case
                measured = ray.get(actor.run.remote(rounds, repeats, keep))
                ray.kill(actor)
            results.append({"process": process, "keep_freed_memory": keep, **measured})
    finally:
        ray.shutdown()
    reference = statistics.median(results[0]["train_seconds"])
    for result in results:
        result["median_train_seconds"] = statistics.median(result["train_seconds"])
        result["median_minor_faults"] = statistics.median(result["minor_faults"])
        result["vs_plain_default"] = round(result["median_train_seconds"] / reference, 3)
    return {"setting": "fedoui-cifar10", "rounds": rounds, "repeats": repeats, "cases": results}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one plain-process case of the allocator benchmark")
    parser.add_argument("rounds", type=int)
    parser.add_argument("repeats", type=int)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    print(json.dumps(train_passes(args.rounds, args.repeats, args.keep)))
