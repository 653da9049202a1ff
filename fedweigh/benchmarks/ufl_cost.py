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
from fedweigh.client.training import OptimizerRecipe, train_locally
from fedweigh.data.sources import DatasetInfo
from fedweigh.data.tensors import ImageTensors
from fedweigh.data.transforms import BatchTransform
from fedweigh.models import build_model
from fedweigh.settings import parse_settings
from fedweigh.strategies.ufl import UFLStep, ufl_recipe

TARGET_RATIO = 1.5

# model: (channels, image size, samples per client)
PAPER_MODELS: dict[str, tuple[int, int, int]] = {
    "mlp": (1, 8, 256),
    "lenet5": (1, 28, 256),
    "fashion-cnn": (1, 28, 256),
    "fedoui-cnn": (3, 32, 256),
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


def client_costs(model_name: str, *, mc_passes: int = 10, batch_size: int = 64, samples: int | None = None) -> dict:
    """Seconds of a FedAvg client and of a UFL client (cheap and naive MC) for one model."""
    channels, size, default_samples = PAPER_MODELS[model_name]
    data, transform = _client_data(channels, size, samples or default_samples, seed=0)
    recipe = OptimizerRecipe(local_epochs=1, batch_size=batch_size, learning_rate=0.01, momentum=0.9)
    device = torch.device("cpu")
    result: dict[str, Any] = {"model": model_name, "samples": len(data), "mc_passes": mc_passes}
    warm_up = build_model(model_name, num_classes=10, in_channels=channels, image_size=size)
    train_locally(warm_up, data, recipe, transform, device, torch.Generator().manual_seed(0))  # first-call costs
    for label, cheap in (("fedavg", None), ("ufl", True), ("ufl_naive", False)):
        torch.manual_seed(0)
        model = build_model(model_name, num_classes=10, in_channels=channels, image_size=size)
        generator = torch.Generator().manual_seed(1)
        if cheap is None:
            result["fedavg_seconds"] = _seconds(
                lambda model=model, generator=generator: train_locally(
                    model, data, recipe, transform, device, generator
                )
            )
            continue
        settings = parse_settings({"ufl.mc-passes": mc_passes, "ufl.cheap-path": cheap})
        context = StepContext(model, data, transform, device, seed=3, partition_id=0, server_round=1)
        context.options = ufl_recipe(settings.ufl)
        step = UFLStep()
        started = time.perf_counter()
        weighting, _ = step.before_training(context)
        mc_seconds = time.perf_counter() - started
        train_seconds = _seconds(
            lambda model=model, generator=generator, weighting=weighting: train_locally(
                model, data, recipe, transform, device, generator, weighting
            )
        )
        result[f"{label}_mc_seconds"] = mc_seconds
        result[f"{label}_seconds"] = mc_seconds + train_seconds
    result["ratio"] = result["ufl_seconds"] / result["fedavg_seconds"]
    result["naive_ratio"] = result["ufl_naive_seconds"] / result["fedavg_seconds"]
    result["within_target"] = result["ratio"] <= TARGET_RATIO
    return result


def ufl_cost(models: tuple[str, ...] = tuple(PAPER_MODELS), *, quick: bool = False) -> dict[str, Any]:
    """The benchmark report: one row per model."""
    torch.set_num_threads(1)
    rows = [client_costs(name, samples=64 if quick else None) for name in models]
    return {"target_ratio": TARGET_RATIO, "models": rows}
