"""What writing each round's checkpoint costs the round (``fedweigh benchmark checkpoint``).

The ServerApp writes a checkpoint after every round (:mod:`fedweigh.results`).
For a model's global state (random weights of the model the case names) this
times, on the caller's side, what a round waits for:

* ``numpy, in the round``: the state as numpy arrays through ``torch.save``,
  written, fsync'ed and renamed before the round goes on (checkpoint layout 1);
* ``tensors, in the round``: the same state as tensors sharing the arrays'
  memory (layout 2, :meth:`~fedweigh.results.Checkpoint.save`);
* ``tensors, background``: :class:`~fedweigh.results.CheckpointWriter`, which
  takes a snapshot in the round and encodes and writes in a background thread.

Between two saves the benchmark sleeps for ``gap`` seconds (the rest of a
round), so that a background write has finished, as in a run whose round is
longer than the write. The file lands in ``folder`` (default: a temporary
folder in the current directory, on the disk results go to).
"""

from __future__ import annotations

import io
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["MODELS", "WAYS", "checkpoint_cost"]

MODELS = (("fedoui-cnn", 3, 32), ("resnet18", 3, 32))
WAYS = ("numpy, in the round", "tensors, in the round", "tensors, background")


def _numpy_layout_save(checkpoint: Any, path: Path) -> None:
    """Layout 1: the arrays pickled as numpy arrays, then the same atomic write."""
    import torch

    from fedweigh.results import CHECKPOINT_FORMAT, write_atomically

    payload = {"format": CHECKPOINT_FORMAT, "version": 1, "round": checkpoint.round}
    payload |= {"arrays": checkpoint.arrays, "strategy_state": checkpoint.strategy_state}
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    write_atomically(path, buffer.getvalue())


def _time_saves(save: Callable[[int], None], saves: int, gap: float) -> list[float]:
    seconds = []
    for round_ in range(saves):
        started = time.perf_counter()
        save(round_)
        seconds.append(time.perf_counter() - started)
        time.sleep(gap)
    return seconds


def checkpoint_cost(saves: int = 30, gap: float = 0.1, folder: Path | None = None) -> dict[str, Any]:
    """Median and 90th percentile of the caller's seconds per save, for each model of :data:`MODELS` and way."""
    from fedweigh.models import build_model
    from fedweigh.results import Checkpoint, CheckpointWriter

    rows = []
    for name, channels, size in MODELS:
        state = build_model(name, 10, channels, size).state_dict()
        arrays = {key: tensor.numpy().copy() for key, tensor in state.items()}
        for array in arrays.values():
            array.flags.writeable = False  # as the server's decoded replies are
        megabytes = sum(array.nbytes for array in arrays.values()) / 2**20
        with tempfile.TemporaryDirectory(dir=folder or Path.cwd()) as scratch:
            path = Path(scratch) / "checkpoint.pt"
            writer = CheckpointWriter(path)
            ways: dict[str, Callable[[int], None]] = {
                WAYS[0]: lambda r, a=arrays, p=path: _numpy_layout_save(Checkpoint(r, a, {}), p),
                WAYS[1]: lambda r, a=arrays, p=path: Checkpoint(r, a, {}).save(p),
                WAYS[2]: lambda r, a=arrays, w=writer: w.save(Checkpoint(r, a, {})),
            }
            for way, save in ways.items():
                seconds = _time_saves(save, saves, gap)
                writer.flush()
                rows.append(
                    {
                        "model": name,
                        "state_mb": round(megabytes, 2),
                        "way": way,
                        "median_seconds": statistics.median(seconds),
                        "p90_seconds": sorted(seconds)[int(0.9 * (len(seconds) - 1))],
                    }
                )
            writer.close()
    return {"saves": saves, "gap_seconds": gap, "cases": rows}
