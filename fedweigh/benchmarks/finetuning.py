"""The cost of the pretrained models: what trains, what travels, a client step's time and memory.

For ViT-B/16 (LoRA and full fine-tuning) and the ImageNet ResNet-18 (full
and head-only), at 3 x 224 x 224 and 10 classes:

* trainable parameters, and the bytes of one client message (the tensors that
  travel: their raw size, and their size as Flower serialises them, ``.npy``
  headers included), against full fine-tuning of the same model;
* the time of one client training step (forward, backward, SGD step) on
  a batch of 8 random images, on the CPU with one thread (the project's
  clients run one thread each), mean and std over the timed steps after one
  warm-up step;
* the peak resident memory of the process that built the model and ran the
  steps (each case in a fresh process, so that peaks do not mix).

On a GPU (``device="cuda"``, the ``gpu-overhead`` benchmark) the same steps
run there, with a larger batch, timed between synchronisations, and the
peak memory is the GPU memory torch allocated.

Weights are random: pretrained values change neither the shapes nor the
cost. ``--quick`` times one step per case.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

__all__ = ["CASES", "finetuning_cost", "measure"]

CASES: tuple[tuple[str, str], ...] = (
    ("vit-b16", "lora"),
    ("vit-b16", "full"),
    ("resnet18-imagenet", "full"),
    ("resnet18-imagenet", "head"),
)
BATCH_SIZE = 8
IMAGE_SIZE = 224
NUM_CLASSES = 10


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def measure(
    model_name: str, mode: str, steps: int, batch_size: int = BATCH_SIZE, device: str = "cpu"
) -> dict[str, Any]:
    """One case, in this process: parameters, message bytes, step times, peak memory (on ``device``)."""
    import torch
    from flwr.app import ArrayRecord

    from fedweigh.models import build_model
    from fedweigh.models.finetuning import FineTuning, apply_fine_tuning, exchanged_state, trainable_count

    torch.set_num_threads(1)
    torch.manual_seed(0)
    on_gpu = device == "cuda"
    model = apply_fine_tuning(build_model(model_name, NUM_CLASSES, 3, IMAGE_SIZE), FineTuning(mode=mode))
    after_build = _rss_mb()
    travelling = exchanged_state(model)
    raw = sum(t.numel() * t.element_size() for t in travelling.values())
    serialised = sum(len(array.data) for array in ArrayRecord(travelling).values())
    whole = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    model.to(device)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01, momentum=0.9)
    images = torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE, device=device)
    labels = torch.randint(0, NUM_CLASSES, (batch_size,), device=device)
    model.train()
    times = []
    for step in range(steps + 1):
        if on_gpu:
            torch.cuda.synchronize()
        started = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if on_gpu:
            torch.cuda.synchronize()
        if step:  # the first step warms up the allocator and the kernels
            times.append(time.perf_counter() - started)
    return {
        "model": model_name,
        "fine_tuning": mode,
        "parameters": sum(p.numel() for p in model.parameters()),
        "trainable_parameters": trainable_count(model),
        "message_bytes": raw,
        "message_bytes_serialised": serialised,
        "state_bytes": whole,
        "step_seconds_mean": statistics.fmean(times),
        "step_seconds_std": statistics.stdev(times) if len(times) > 1 else 0.0,
        "steps_timed": len(times),
        "batch_size": batch_size,
        "device": device,
        "rss_after_build_mb": round(after_build, 1),
        "peak_rss_mb": round(_rss_mb(), 1),
        "peak_gpu_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1) if on_gpu else None,
    }


def _in_fresh_process(model_name: str, mode: str, steps: int, batch_size: int, device: str) -> dict[str, Any]:
    code = (
        "import json, sys; from fedweigh.benchmarks.finetuning import measure; "
        f"print(json.dumps(measure({model_name!r}, {mode!r}, {steps}, {batch_size}, {device!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"fine-tuning benchmark of {model_name} ({mode}) failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def finetuning_cost(quick: bool, device: str = "cpu", batch_size: int = BATCH_SIZE) -> dict[str, Any]:
    """Every case of :data:`CASES`, each in its own process; ratios against the model's full fine-tuning."""
    steps = 1 if quick else 5 if device == "cpu" else 20
    rows = [_in_fresh_process(name, mode, steps, batch_size, device) for name, mode in CASES]
    full = {row["model"]: row["message_bytes"] for row in rows if row["fine_tuning"] == "full"}
    for row in rows:
        row["fewer_bytes_than_full"] = round(full[row["model"]] / row["message_bytes"], 1)
    return {
        "batch_size": batch_size,
        "device": device,
        "image_size": IMAGE_SIZE,
        "num_classes": NUM_CLASSES,
        "threads": 1,
        "cases": rows,
    }
