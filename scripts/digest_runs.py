"""Digests of every strategy's results, to check that a refactor computes bit-identical models.

Runs each strategy (and two combinations) for the tests' quick run, in
process (the real ServerApp and ClientApp, ``tests/loopback.py``), and prints
per run a digest of ``model.pt`` and of ``metrics.jsonl`` without its timing
fields. Run it on two checkouts and compare::

    git worktree add /tmp/before <commit>
    PYTHONPATH=/tmp/before .venv/bin/python scripts/digest_runs.py /tmp/before > before.txt
    .venv/bin/python scripts/digest_runs.py . > after.txt
    diff before.txt after.txt && echo identical
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path


def main(root: Path) -> None:
    sys.path[:0] = [str(root), str(root / "tests")]
    import torch
    from conftest import QUICK_RUN, STRATEGY_OPTIONS
    from loopback import run_in_process

    from fedweigh.methods.registry import METHODS
    from fedweigh.results import read_metrics, without_timing

    out = Path(tempfile.mkdtemp())
    cases = [(name, {}) for name in sorted(METHODS)]
    cases += [("fedprox", {"aggregation": "dac"}), ("flood", {"delay-std": 1.5, "max-staleness": 3})]
    for index, (name, extra) in enumerate(cases):
        config = {**QUICK_RUN, "strategy": name, **STRATEGY_OPTIONS.get(name, {}), **extra}
        folder = run_in_process({**config, "output-dir": str(out), "run-name": f"run-{index}"}, num_nodes=6)
        model = torch.load(folder / "model.pt")
        tensors = hashlib.sha256()
        for key in sorted(model):
            tensors.update(key.encode())
            tensors.update(model[key].numpy().tobytes())
        rows = json.dumps(without_timing(read_metrics(folder)), sort_keys=True).encode()
        print(name, extra, tensors.hexdigest()[:16], hashlib.sha256(rows).hexdigest()[:16], flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve())
