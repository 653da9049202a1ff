"""UFL's client cost against a FedAvg client, for every paper model.

A FedAvg client trains one local epoch. A UFL client first runs N MC-dropout
passes over all its samples on the received model (the ``ufl`` client step),
then trains the same epoch with per-sample loss weights. This benchmark times
both with the real code (``UFLStep``, ``train_locally``) on random images of
each model's natural input size, for the cheap path (the layers before the
first dropout computed once) and the naive reference (N full passes).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from fedweigh.client.steps import StepContext
from fedweigh.client.training import train_locally
from fedweigh.data.description import DatasetInfo
from fedweigh.data.tensors import ImageTensors
from fedweigh.data.transforms import BatchTransform
from fedweigh.methods.catalog import STEPS
from fedweigh.methods.ufl.client import UFLStep
from fedweigh.models import build_model, on_device
from fedweigh.protocol import TrainRecipe, table_entries
from fedweigh.settings import validate

TARGET_RATIO = 1.5
HEAVY_MODELS = frozenset({"vgg9", "resnet8", "resnet18"})
"""Timed once (tens of seconds a client on one CPU thread); the others are the fastest of three."""

# model: (channels, image size, samples per client)
PAPER_MODELS: dict[str, tuple[int, int, int]] = {
    "mlp": (1, 8, 256),
    "lenet5": (1, 28, 512),
    "fashion-cnn": (1, 28, 512),
    "fedoui-cnn": (3, 32, 512),
    "vgg9": (3, 32, 256),
    "resnet8": (3, 32, 128),
    "resnet18": (3, 32, 128),
}


def _client_data(channels: int, size: int, samples: int, seed: int) -> tuple[ImageTensors, BatchTransform]:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (samples, channels, size, size), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 10, (samples,), generator=generator)
    info = DatasetInfo(
        num_classes=10,
        in_channels=channels,
        image_size=size,
        mean=(0.5,) * channels,
        std=(0.25,) * channels,
        augment="none",
        image_column="image",
        label_column="label",
    )
    return ImageTensors(images, labels), BatchTransform(info, augment=False)


def _seconds(function: Any) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def _fresh_model(model_name: str, device: torch.device) -> torch.nn.Module:
    """The model as a ClientApp holds it on ``device`` (:func:`fedweigh.models.on_device`)."""
    channels, size, _ = PAPER_MODELS[model_name]
    return on_device(build_model(model_name, num_classes=10, in_channels=channels, image_size=size), device)


def _ufl_step(
    model: torch.nn.Module,
    data: ImageTensors,
    transform: BatchTransform,
    device: torch.device,
    passes: int,
    cheap: bool,
) -> Any:
    """The ``ufl`` client step on ``model``; returns its loss weighting."""
    settings = validate({"ufl.mc-passes": passes, "ufl.cheap-path": cheap})
    config = table_entries(STEPS["ufl"].options, settings.ufl)
    context = StepContext(
        model, data, transform, device, seed=3, run_seed=1, partition_id=0, server_round=1, config=config
    )
    weighting, _ = UFLStep().before_training(context)
    return weighting


def _measure_once(
    model_name: str, data: ImageTensors, transform: BatchTransform, recipe: TrainRecipe, mc_passes: int
) -> dict[str, float]:
    """One timing of each client: FedAvg's epoch; UFL's MC step (cheap, naive) and its weighted epoch."""
    device = torch.device("cpu")
    seconds: dict[str, float] = {}
    for label, cheap in (("fedavg", None), ("ufl", True), ("ufl_naive", False)):
        torch.manual_seed(0)
        model = _fresh_model(model_name, device)
        generator = torch.Generator().manual_seed(1)
        weighting = None
        if cheap is not None:
            started = time.perf_counter()
            weighting = _ufl_step(model, data, transform, device, mc_passes, cheap)
            seconds[f"{label}_mc_seconds"] = time.perf_counter() - started
        seconds[f"{label}_train_seconds"] = _seconds(
            lambda model=model, generator=generator, weighting=weighting: train_locally(
                model, data, recipe, transform, device, generator, weighting
            )
        )
    return seconds


def client_costs(
    model_name: str, *, mc_passes: int = 10, batch_size: int = 64, samples: int | None = None, repeats: int = 1
) -> dict:
    """Seconds of a FedAvg client and of a UFL client (cheap and naive MC) for one model.

    Each quantity is the fastest of ``repeats`` timings (the machine's other
    work only ever adds time).
    """
    channels, size, default_samples = PAPER_MODELS[model_name]
    data, transform = _client_data(channels, size, samples or default_samples, seed=0)
    recipe = TrainRecipe(local_epochs=1, batch_size=batch_size, learning_rate=0.01, momentum=0.9)
    device = torch.device("cpu")
    # First-call costs (allocator, oneDNN kernels for each batch shape) of every path, paid once per
    # ClientApp process in a federation, are paid here before anything is timed.
    warm_up = _fresh_model(model_name, device)
    train_locally(warm_up, data, recipe, transform, device, torch.Generator().manual_seed(0))
    for cheap in (True, False):
        _ufl_step(warm_up, data, transform, device, mc_passes, cheap)
    timings = [_measure_once(model_name, data, transform, recipe, mc_passes) for _ in range(max(1, repeats))]
    best = {key: min(timing[key] for timing in timings) for key in timings[0]}
    result: dict[str, Any] = {"model": model_name, "samples": len(data), "mc_passes": mc_passes, "repeats": repeats}
    result["fedavg_seconds"] = best["fedavg_train_seconds"]
    for label in ("ufl", "ufl_naive"):
        result[f"{label}_mc_seconds"] = best[f"{label}_mc_seconds"]
        result[f"{label}_seconds"] = best[f"{label}_mc_seconds"] + best[f"{label}_train_seconds"]
    result["ufl_train_seconds"] = best["ufl_train_seconds"]
    result["ratio"] = result["ufl_seconds"] / result["fedavg_seconds"]
    result["mc_ratio"] = result["ufl_mc_seconds"] / result["fedavg_seconds"]
    result["naive_ratio"] = result["ufl_naive_seconds"] / result["fedavg_seconds"]
    result["within_target"] = result["ratio"] <= TARGET_RATIO
    return result


def ufl_cost(models: tuple[str, ...] = tuple(PAPER_MODELS), *, quick: bool = False) -> dict[str, Any]:
    """The benchmark report: one row per model."""
    torch.set_num_threads(1)
    rows = [
        client_costs(name, samples=64 if quick else None, repeats=1 if quick or name in HEAVY_MODELS else 3)
        for name in models
    ]
    return {"target_ratio": TARGET_RATIO, "models": rows}
