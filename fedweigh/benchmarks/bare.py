"""The same federated training without Flower: one process, a plain loop.

It uses the very pieces the apps use (settings, data partitions, models,
:func:`~fedweigh.client.training.train_locally`, the seeded client sampling,
the clients' seeds, :func:`~fedweigh.strategies.averaging.weighted_average`
and central evaluation), so for FedAvg it computes bit for bit what the
simulation computes: only the federation machinery is missing. Client steps
are not run, so only strategies without them (FedAvg, FedProx, uniform)
are supported.

Run as ``python -m fedweigh.benchmarks.bare '<run-config JSON>' <num-partitions>``
it prints one JSON object with its timings and accuracies.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["bare_federated_run", "train_client"]


def train_client(model: Any, data: Any, recipe: Any, transform: Any, device: Any, seed: int) -> Any:
    """One client's local training as the ClientApp seeds it: torch's global seed and the batch order's generator."""
    import torch

    from fedweigh.client.training import seed_torch, train_locally

    seed_torch(seed, device)
    return train_locally(model, data, recipe, transform, device, torch.Generator().manual_seed(seed))


def bare_federated_run(run_config: Mapping[str, Any], num_partitions: int) -> dict[str, Any]:
    """Train as the simulation would, in this process; return timings (seconds) and accuracies.

    Parameters
    ----------
    run_config : Mapping
        The full flat run config (the app's defaults with overrides applied).
    num_partitions : int
        Number of clients (the simulation's SuperNodes).
    """
    started = time.perf_counter()
    import numpy as np
    import torch

    from fedweigh.client.training import evaluate
    from fedweigh.client_app import client_seed
    from fedweigh.components import batch_transform, configure_torch, data_spec, new_model, resolve_device
    from fedweigh.data.federated import load_partition, load_test_split
    from fedweigh.models import on_device
    from fedweigh.preflight import check_run
    from fedweigh.protocol import CLIENT_STEPS, TRAIN_LOSS, TrainRecipe
    from fedweigh.rules.base import RoundSignals
    from fedweigh.strategies.averaging import weighted_average
    from fedweigh.strategies.build import build_strategy
    from fedweigh.strategies.sampling import sample_partitions, sample_size

    imported = time.perf_counter()
    configure_torch()
    settings = check_run(run_config, num_partitions)  # the ServerApp's checks, the data split's included
    strategy = build_strategy(settings)
    if strategy.recipe.get(CLIENT_STEPS):
        raise ValueError(f"strategy {settings.strategy!r} runs client steps; the bare loop supports none")
    device = resolve_device(settings.device)
    spec = data_spec(settings, num_partitions)
    transform = batch_transform(settings)
    test = load_test_split(spec)
    global_model = on_device(new_model(settings), device)
    client_model = on_device(new_model(settings), device)
    setup_done = time.perf_counter()

    rounds: list[dict[str, float]] = []
    accuracies: list[float] = []
    for server_round in range(1, settings.num_server_rounds + 1):
        t0 = time.perf_counter()
        size = sample_size(num_partitions, settings.fraction_train, settings.min_train_nodes)
        chosen = sample_partitions(settings.seed, server_round, range(num_partitions), size, settings.client_sampling)
        global_state = {k: v.detach().clone() for k, v in global_model.state_dict().items()}
        recipe = TrainRecipe.from_config({**strategy.recipe, **strategy.round_values(server_round)})
        models, counts, losses = [], [], []
        data_seconds = train_seconds = train_cpu_seconds = 0.0
        for partition in chosen:  # the simulation sums replies in partition order too
            t_data = time.perf_counter()
            data = load_partition(spec, partition)
            data_seconds += time.perf_counter() - t_data
            client_model.load_state_dict(global_state)
            stats = train_client(
                client_model, data, recipe, transform, device, client_seed(settings.seed, server_round, partition)
            )
            train_seconds += stats.seconds
            train_cpu_seconds += stats.cpu_seconds
            models.append({k: v.detach().cpu().numpy().copy() for k, v in client_model.state_dict().items()})
            counts.append(stats.num_examples)
            losses.append(stats.train_loss)
        t_aggregate = time.perf_counter()
        outcome = strategy.rule(RoundSignals(np.asarray(counts, dtype=np.float64), {TRAIN_LOSS: np.asarray(losses)}))
        averaged = weighted_average(models, outcome.weights)
        global_model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in averaged.items()})
        t_evaluate = time.perf_counter()
        result = evaluate(global_model, test, transform, device, settings.eval_batch_size)
        t_end = time.perf_counter()
        accuracies.append(result.accuracy)
        rounds.append(
            {
                "seconds": t_end - t0,
                "data_seconds": data_seconds,
                "train_seconds": train_seconds,
                "train_cpu_seconds": train_cpu_seconds,
                "aggregate_seconds": t_evaluate - t_aggregate,
                "evaluate_seconds": t_end - t_evaluate,
            }
        )
    return {
        "import_seconds": imported - started,
        "setup_seconds": setup_done - imported,
        "loop_seconds": time.perf_counter() - setup_done,
        "total_seconds": time.perf_counter() - started,
        "rounds": rounds,
        "accuracies": accuracies,
        "torch_threads": torch.get_num_threads(),
    }


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    print(json.dumps(bare_federated_run(config, int(sys.argv[2]))))
