"""Aggregation: the strategy base against Flower's FedAvg on the same replies.

K client replies of a ResNet-18-sized model (fedweigh's CIFAR ResNet-18,
11.2 M parameters, 45 MB per model) are aggregated with sample-count
weights, at two levels, each side doing the same work:

* ``strategy``: ``WeightedFedAvg.aggregate_train`` (reply checks, the rule,
  the average, the round record) against Flower's
  ``FedAvg.aggregate_train`` (reply checks, the average, the metrics), from
  reply Messages to the new ArrayRecord;
* ``arrays``: :func:`~fedweigh.arrays.decode` +
  :func:`~fedweigh.strategies.averaging.weighted_average` +
  :func:`~fedweigh.arrays.encode` against Flower's
  ``aggregate_arrayrecords``, both from ArrayRecords (serialised bytes) to an
  ArrayRecord: decoding included on both sides.

The arithmetic alone is also given, on arrays decoded beforehand:
``weighted_average`` (a fused multiply-add into one accumulator per tensor)
against the NumPy pattern Flower's ``aggregate_arrayrecords`` uses
(``value * weight`` into a temporary, then ``+=``).

Each case runs in a fresh process, so that its peak memory (Linux
``VmHWM``, reset after the replies are built) is its own. To keep memory
sane the K replies cycle through ``min(K, 10)`` distinct models (every reply
is still decoded on its own by both sides).

``python -m fedweigh.benchmarks.aggregation <K> <side> <level> <repeat>``
runs one case and prints JSON.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fedweigh.protocol import ARRAYS, METRICS, NUM_EXAMPLES, PARTITION_ID, TRAIN_LOSS

__all__ = ["aggregation", "run_case"]

DISTINCT_MODELS = 10


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _replies(k: int, model: str) -> tuple[list[Any], Any]:
    """K reply Messages (and the global model ArrayRecord) as the server receives them."""
    import numpy as np
    import torch
    from flwr.app import ArrayRecord, Message, Metadata, MetricRecord, RecordDict
    from flwr.app.message.message import make_message
    from flwr.supercore.task_identity import TaskIdentity

    from fedweigh.models import build_model

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    torch.manual_seed(0)
    base = build_model(model, num_classes=10, in_channels=3, image_size=32).state_dict()
    records = []
    for index in range(min(k, DISTINCT_MODELS)):
        noisy = {
            name: (t + 0.01 * (index + 1) * torch.randn_like(t)) if t.is_floating_point() else t.clone()
            for name, t in base.items()
        }
        records.append(ArrayRecord(noisy))
    replies: list[Message] = []
    rng = np.random.default_rng(0)
    for node in range(1, k + 1):
        metadata = Metadata(
            run_id=1,
            message_id=f"reply-{node}",
            src_node_id=node,
            dst_node_id=0,
            reply_to_message_id=f"instruction-{node}",
            group_id="1",
            created_at=time.time(),
            ttl=3600,
            message_type="train",
        )
        metrics = MetricRecord(
            {
                NUM_EXAMPLES: int(rng.integers(50, 500)),
                TRAIN_LOSS: float(rng.uniform(0.5, 2.0)),
                PARTITION_ID: node,
            }
        )
        content = RecordDict({ARRAYS: records[(node - 1) % len(records)], METRICS: metrics})
        replies.append(make_message(metadata=metadata, content=content))
    return replies, ArrayRecord(base)


def run_case(k: int, side: str, level: str, repeat: int = 3, model: str = "resnet18") -> dict[str, Any]:
    """Time one (K, side, level) case in this process; see the module docstring."""
    import numpy as np
    from flwr.serverapp.strategy import FedAvg
    from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

    from fedweigh.arrays import decode, encode
    from fedweigh.rules.base import SampleCountRule
    from fedweigh.strategies.averaging import weighted_average
    from fedweigh.strategies.base import WeightedFedAvg

    replies, global_arrays = _replies(k, model)
    contents = [reply.content for reply in replies]
    counts = np.array([float(c[METRICS][NUM_EXAMPLES]) for c in contents])

    if side == "fedweigh" and level == "strategy":
        strategy = WeightedFedAvg(SampleCountRule(), {}, seed=1)

        def work() -> Any:
            strategy.global_models[1] = decode(global_arrays)  # set by configure_train in a real round
            strategy.records.clear()
            return strategy.aggregate_train(1, replies)[0]
    elif side == "flower" and level == "strategy":
        strategy = FedAvg()

        def work() -> Any:
            return strategy.aggregate_train(1, replies)[0]
    elif side == "fedweigh" and level == "arrays":

        def work() -> Any:
            models = [decode(content[ARRAYS]) for content in contents]
            return encode(weighted_average(models, counts / counts.sum()))
    elif side == "flower" and level == "arrays":

        def work() -> Any:
            return aggregate_arrayrecords(contents, NUM_EXAMPLES)
    elif side == "fedweigh" and level == "arithmetic":
        decoded = [decode(content[ARRAYS]) for content in contents]

        def work() -> Any:
            return weighted_average(decoded, counts / counts.sum())
    elif side == "flower" and level == "arithmetic":
        decoded = [{key: value.numpy() for key, value in content[ARRAYS].items()} for content in contents]
        factors = counts / counts.sum()

        def work() -> Any:
            total: dict[str, np.ndarray] = {}
            for model, factor in zip(decoded, factors, strict=True):
                for key, value in model.items():
                    if key in total:
                        total[key] += value * factor
                    else:
                        total[key] = value * factor
            return total
    else:
        raise ValueError(f"unknown case side={side!r} level={level!r}")

    import logging

    flower = logging.getLogger("flwr")
    level = flower.level
    flower.setLevel(logging.ERROR)  # FedAvg warns about settings; not measured
    try:
        gc.collect()
        baseline_kb = _status_kb("VmRSS")
        peak_reset = _reset_peak()
        seconds = []
        result = work()  # warm-up (first touch of the output buffers)
        del result
        for _ in range(repeat):
            gc.collect()
            started = time.perf_counter()
            result = work()
            seconds.append(time.perf_counter() - started)
            del result
    finally:
        flower.setLevel(level)  # the caller's logging as it was (a test process runs more than this)
    return {
        "k": k,
        "side": side,
        "level": level,
        "seconds": [round(s, 4) for s in seconds],
        "best_seconds": round(min(seconds), 4),
        "extra_peak_mb": round((_status_kb("VmHWM") - baseline_kb) / 1024, 1) if peak_reset else None,
        "parameters": int(sum(a.numpy().size for a in global_arrays.values())),
    }


CASES = (
    ("fedweigh", "strategy"),
    ("flower", "strategy"),
    ("fedweigh", "arrays"),
    ("flower", "arrays"),
    ("fedweigh", "arithmetic"),
    ("flower", "arithmetic"),
)


def aggregation(ks: tuple[int, ...] = (10, 100), repeat: int = 3) -> dict[str, Any]:
    """Every case for every K, each in a fresh process; with speed-ups per K and level."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cases: list[dict[str, Any]] = []
    for k in ks:
        for side, level in CASES:
            done = subprocess.run(
                [sys.executable, "-m", "fedweigh.benchmarks.aggregation", str(k), side, level, str(repeat)],
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"aggregation case K={k} {side} {level} failed:\n{done.stderr[-3000:]}")
            cases.append(json.loads(done.stdout.strip().splitlines()[-1]))
    summary = []
    for k in ks:
        best = {(c["side"], c["level"]): c["best_seconds"] for c in cases if c["k"] == k}
        peak = {(c["side"], c["level"]): c["extra_peak_mb"] for c in cases if c["k"] == k}
        summary.append(
            {
                "k": k,
                "strategy_fedweigh_s": best[("fedweigh", "strategy")],
                "strategy_flower_s": best[("flower", "strategy")],
                "strategy_speedup": round(best[("flower", "strategy")] / best[("fedweigh", "strategy")], 2),
                "arrays_fedweigh_s": best[("fedweigh", "arrays")],
                "arrays_flower_s": best[("flower", "arrays")],
                "arrays_speedup": round(best[("flower", "arrays")] / best[("fedweigh", "arrays")], 2),
                "arithmetic_fedweigh_s": best[("fedweigh", "arithmetic")],
                "arithmetic_flower_s": best[("flower", "arithmetic")],
                "arithmetic_speedup": round(best[("flower", "arithmetic")] / best[("fedweigh", "arithmetic")], 2),
                "strategy_extra_peak_mb_fedweigh": peak[("fedweigh", "strategy")],
                "strategy_extra_peak_mb_flower": peak[("flower", "strategy")],
            }
        )
    return {"model": "resnet18", "cases": cases, "summary": summary}


if __name__ == "__main__":
    k_arg, side_arg, level_arg, repeat_arg = sys.argv[1:5]
    print(json.dumps(run_case(int(k_arg), side_arg, level_arg, int(repeat_arg))))
