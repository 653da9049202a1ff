"""Feddle's server cost: its round against FedBuff's, its step alone, and the atlas's memory.

Three measurements (``fedweigh benchmark feddle-cost``):

* **rounds**: the experiment's setting (Fashion-MNIST, the Feddle CNN, 500
  clients, 10 per round, delays N(20), Adam clients; see
  ``experiments/feddle_fmnist.toml``) run as a simulation with FedBuff and
  with Feddle-ID; the median round time of rounds 2 and later, and their
  ratio (the target: Feddle within 1.5x of FedBuff);
* **server step**: Feddle's and FedBuff's server update alone, in this
  process, on a full atlas of synthetic updates of the same CNN, with
  1,000 server images and 2 or 10 passes over them per round.

"FedBuff" here is Feddle's fallback step alone (``fedbuff.buffer-size = 0``,
:class:`~fedweigh.methods.feddle.update.FallbackStep`): what Feddle adds to it is
the search, which is what is measured. Nguyen et al.'s buffered FedBuff adds
each update to one sum and steps once per K updates: no dearer.
* **memory**: the atlas holds M updates of the trainable parameters in
  float32, ``4 M d`` bytes: the paper's models, M = 2 x clients per round.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import Any

import numpy as np
import torch

from fedweigh.benchmarks.common import Setting, dataset_folder, run_timed

__all__ = ["atlas_memory", "feddle_cost", "fmnist_async", "server_step_seconds"]

LORA_RANK = 4
VIT_LAYERS, VIT_WIDTH = 12, 768
"""ViT-B/16: 12 blocks of width 768; LoRA on the query, key, value and output projections of each."""


def fmnist_async(rounds: int = 12) -> Setting:
    """The Feddle experiment's setting (FedBuff: Feddle's fallback step alone), asynchronous, ``rounds`` rounds."""
    return Setting(
        "feddle-fmnist",
        {
            "strategy": "fedbuff",
            "fedbuff.buffer-size": 0,  # Feddle's fallback step alone: what Feddle adds is the search
            "fedbuff.staleness-scaling": False,
            "dataset": dataset_folder("fashion_mnist"),
            "partitioner": "dirichlet",
            "dirichlet-alpha": 0.1,
            "min-partition-size": 10,
            "partition-top-up": True,
            "model": "feddle-cnn",
            "fraction-train": 0.02,
            "min-train-nodes": 10,
            "local-epochs": 1,
            "batch-size": 32,
            "optimizer": "adam",
            "learning-rate": 0.001,
            "augment": False,
            "delay-std": 20.0,
            "max-staleness": 100,
            "test-holdout": 1000,
            "server-data-size": 1000,
            "feddle.search-epochs": 2,
            "num-server-rounds": rounds,
        },
        num_supernodes=500,
    )


def vit_lora_trainable(num_classes: int = 10) -> int:
    """Trainable parameters of ViT-B/16 with rank-4 LoRA on q, k, v, o and a new head (spec §6)."""
    lora = VIT_LAYERS * 4 * 2 * VIT_WIDTH * LORA_RANK
    return lora + VIT_WIDTH * num_classes + num_classes


def atlas_memory() -> list[dict[str, Any]]:
    """``4 M d`` bytes for the paper's models; d counted from the models built here (ViT: from its shape)."""
    from fedweigh.models import build_model

    def trainable(name: str, channels: int, size: int) -> int:
        with torch.device("meta"):
            model = build_model(name, 10, channels, size)
        return sum(p.numel() for p in model.parameters() if p.requires_grad)

    models = [
        ("feddle-cnn (Fashion-MNIST, 28x28)", trainable("feddle-cnn", 1, 28), 10),
        ("resnet18 (CIFAR-10, 10 classes)", trainable("resnet18", 3, 32), 10),
        ("ViT-B/16 + LoRA r=4 (q, k, v, o) + head", vit_lora_trainable(10), 50),
    ]
    rows = []
    for name, size, per_round in models:
        atlas = 2 * per_round
        rows.append(
            {
                "model": name,
                "trainable_parameters": size,
                "clients_per_round": per_round,
                "atlas_size": atlas,
                "model_mb": round(4 * size / 2**20, 2),
                "atlas_mb": round(4 * size * atlas / 2**20, 1),
            }
        )
    return rows


def server_step_seconds(search_epochs: int, repeat: int = 5, dataset: str | None = None) -> dict[str, float]:
    """Median seconds of one server step, Feddle-ID and its fallback alone, on a full atlas of synthetic CNN updates."""
    from fedweigh.components import configure_torch, server_and_test_data
    from fedweigh.methods.feddle.update import FallbackStep, FeddleUpdate
    from fedweigh.preflight import parse_settings
    from fedweigh.strategies.updates import RoundUpdate

    config = {
        "dataset": dataset or dataset_folder("fashion_mnist"),
        "model": "feddle-cnn",
        "strategy": "feddle",
        "server-data": "id",
        "server-data-size": 100 if dataset == "digits" else 1000,
        "feddle.search-epochs": search_epochs,
        "device": "cpu",
    }
    configure_torch()  # one thread, as the ServerApp runs
    settings = parse_settings(config)
    server, _ = server_and_test_data(settings, num_partitions=1)
    timings: dict[str, float] = {}
    for name, update in (
        ("feddle", FeddleUpdate.build(settings, server)),
        ("fedbuff", FallbackStep.build(settings, None)),
    ):
        model = update.model
        base = {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}
        rng = np.random.default_rng(0)
        seconds = []
        for server_round in range(1, repeat + 3):
            replies = [
                {k: (v + 0.01 * rng.standard_normal(v.shape)).astype(v.dtype) for k, v in base.items()}
                for _ in range(10)
            ]
            step = RoundUpdate(
                server_round=server_round,
                global_model=base,
                models=replies,
                model_rounds=[server_round] * 10,
                weights=np.full(10, 0.1),
                num_examples=np.full(10, 100.0),
                partitions=list(range(10)),
                clients_per_round=10,
            )
            started = time.perf_counter()
            update(step)
            if server_round > 2:  # the atlas is full (20) from round 2 on
                seconds.append(time.perf_counter() - started)
        timings[name] = round(statistics.median(seconds), 4)
    timings["search_steps"] = search_epochs * -(-len(server) // 64)  # ceil(|D_S| / 64) batches per pass
    timings["ratio"] = round(timings["feddle"] / timings["fedbuff"], 2)
    return timings


def _timed_row(name: str, timed: Any) -> dict[str, Any]:
    rounds = timed.round_seconds()
    return {
        "strategy": name,
        "status": timed.status,
        "round_seconds": round(statistics.median(rounds[1:] or rounds), 3) if rounds else None,
        "rounds": [round(r, 3) for r in rounds],
        "final_accuracy": timed.accuracies()[-1] if timed.rows else None,
    }


def feddle_cost(sim: Any, quick: bool) -> dict[str, Any]:
    """All three measurements (``quick``: the digits, a few rounds)."""
    report: dict[str, Any] = {"memory": atlas_memory()}
    digits = "digits" if quick else None
    report["server_step"] = [
        {"search_epochs": epochs, **server_step_seconds(epochs, repeat=2 if quick else 5, dataset=digits)}
        for epochs in ((2,) if quick else (2, 10))
    ]
    if sim is None:
        return report
    setting = fmnist_async(4 if quick else 12)
    config = dict(setting.run_config)
    supernodes = setting.num_supernodes
    if quick:
        config.update(
            {
                "dataset": "digits",
                "model": "mlp",
                "fraction-train": 0.2,
                "min-train-nodes": 2,
                "test-holdout": 60,
                "server-data-size": 60,
                "partition-top-up": False,
                "min-partition-size": 0,
            }
        )
        supernodes = 10
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, extra in (("fedbuff", {}), ("feddle", {"server-data": "id"})):
            run = {**config, "strategy": name, **extra, "output-dir": scratch, "run-name": f"cost-{name}"}
            rows.append(_timed_row(name, run_timed(sim, run, supernodes)))
    fedbuff, feddle = rows
    if fedbuff["round_seconds"] and feddle["round_seconds"]:
        feddle["vs_fedbuff"] = round(feddle["round_seconds"] / fedbuff["round_seconds"], 3)
    report["rounds"] = {"setting": setting.name if not quick else "digits (quick)", "strategies": rows}
    return report
