"""Federation overhead on a GPU, where a round's work takes milliseconds and Flower's share shows.

Each case runs as a simulation and as the bare loop (:func:`.overhead.federation_overhead`):

* the FedOUI CIFAR-10 setting, 60 rounds, one ClientApp actor holding the
  whole GPU (the clients train one after another, as in the bare loop), with
  the event-driven hand-off, with the ClientApp in the simulation's own
  process (``simulation-backend = "in-process"``) and with Flower's 0.1 s
  polling;
* the same with the CIFAR ResNet-18 (11.2 M parameters, 45 MB a message),
  20 rounds, with one actor holding the GPU, in-process, and with five
  actors sharing it (0.2 GPU each), so that a round's five clients train at
  once.

Then the pretrained models' client step on the GPU (:mod:`.finetuning`,
batch :data:`GPU_BATCH`). Each case runs once: the lease of a GPU is short.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from fedweigh.benchmarks.common import BenchmarkError, Setting, fedoui_cifar10, resnet18_cifar10
from fedweigh.benchmarks.finetuning import finetuning_cost
from fedweigh.benchmarks.overhead import federation_overhead

__all__ = ["GPU_BATCH", "SHARED_GPU", "gpu_cases", "gpu_overhead"]

GPU_BATCH = 32
"""Batch of the pretrained models' timed step on the GPU (the CPU benchmark uses 8)."""
SHARED_GPU = 0.2
"""GPU share of each ClientApp actor in the shared case: five actors, a round's five clients at once."""


def gpu_cases(quick: bool) -> list[tuple[Setting, float]]:
    """The settings and each one's GPU share per ClientApp actor."""
    few, many = (3, 3) if quick else (20, 60)
    fedoui = fedoui_cifar10(many)
    resnet = resnet18_cifar10(few)
    # the in-process backend right after Ray's: the comparison a short lease should reach first
    return [
        (fedoui, 1.0),
        (fedoui.in_process(), 1.0),
        (resnet, 1.0),
        (resnet.in_process(), 1.0),
        (resnet, SHARED_GPU),
        (fedoui.polling(), 1.0),
    ]


def client_cpus(gpu_share: float, cpus: int) -> int:
    """CPUs per actor: all of them for a whole GPU (one actor), else the machine's share of each actor.

    >>> client_cpus(1.0, 16), client_cpus(0.2, 16), client_cpus(0.2, 2)
    (16, 3, 1)
    """
    return cpus if gpu_share >= 1 else max(1, int(cpus * gpu_share))


def gpu_overhead(sim: Any, quick: bool, progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every case of :func:`gpu_cases` on ``sim`` and the fine-tuning step on the GPU.

    ``progress`` receives the report so far after each case (a GPU lease may
    end before the last one).
    """
    import torch

    if not torch.cuda.is_available():
        raise BenchmarkError(
            "the gpu-overhead benchmark needs a CUDA GPU, and torch sees none (torch.cuda.is_available() is False); "
            "on a CPU, run `fedweigh benchmark overhead`"
        )
    cpus = os.cpu_count() or 1
    settings: list[dict[str, Any]] = []
    for setting, share in gpu_cases(quick):
        settings.append(
            federation_overhead(setting, sim, gpus_per_client=share, cpus_per_client=client_cpus(share, cpus))
        )
        if progress is not None:
            progress({"settings": settings})
    return {"settings": settings, "fine_tuning": finetuning_cost(quick, device="cuda", batch_size=GPU_BATCH)}
