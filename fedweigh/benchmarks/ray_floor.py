"""What one Ray actor call costs that carries a model each way: the floor under a simulated client's round trip.

Flower's Ray backend hands every message to a ClientApp actor as
``actor.run.remote(app_fn, message, cid, context)`` and takes the reply,
a message of the same size, back with ``ray.get``. This module times that
pattern with nothing else in it: a local Ray instance, one actor that
returns a fresh payload of the size it was sent, ``trips`` calls one after
the other. Whatever a simulation spends on a message beyond this is
Flower's or the app's; this much is Ray's.

Run in its own process (it starts and stops its own Ray instance)::

    python -m fedweigh.benchmarks.ray_floor NBYTES [TRIPS]

prints one JSON line; :func:`ray_round_trip` runs it and reads it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

__all__ = ["ray_round_trip"]


def _measure(nbytes: int, trips: int) -> dict[str, Any]:
    import ray

    ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, logging_level="ERROR")
    try:

        @ray.remote(num_cpus=os.cpu_count() or 1)
        class Echo:
            def run(self, app_fn: Any, payload: bytes, cid: str, context: dict[str, Any]) -> tuple[str, bytes, dict]:
                return cid, bytes(len(payload)), context

        def app_fn() -> None:  # stands in for the app loader Flower sends with every message
            return None

        actor = Echo.remote()  # type: ignore[attr-defined]
        payload = os.urandom(nbytes)
        context = {"run_config": {f"key-{i}": i for i in range(100)}, "node_config": {"partition-id": 0}}
        ray.get(actor.run.remote(app_fn, payload, "0", context))  # the actor's start and first call
        seconds = []
        for _ in range(trips):
            started = time.perf_counter()
            ray.get(actor.run.remote(app_fn, payload, "0", context))
            seconds.append(time.perf_counter() - started)
    finally:
        ray.shutdown()
    return {
        "bytes": nbytes,
        "trips": trips,
        "median_ms": round(1e3 * statistics.median(seconds), 2),
        "mean_ms": round(1e3 * statistics.fmean(seconds), 2),
        "min_ms": round(1e3 * min(seconds), 2),
    }


def ray_round_trip(nbytes: int, trips: int = 40, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The round trip of ``nbytes`` each way through a Ray actor, in a fresh process (median, mean, min ms).

    ``env`` is added to the process's environment (for example a Ray
    setting such as ``RAY_max_direct_call_object_size``).
    """
    done = subprocess.run(
        [sys.executable, "-m", "fedweigh.benchmarks.ray_floor", str(nbytes), str(trips)],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the Ray round-trip measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(_measure(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 40)))
