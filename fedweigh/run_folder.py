"""A run's folder: the names of the files in it, and what it holds, read without PyTorch.

Every run writes one folder, ``<output-dir>/<run-name>/`` (:mod:`fedweigh.results`
writes it). This module names its files and answers the questions asked
before a run starts, by the launcher as much as by the ServerApp: does a
folder already hold a run (:func:`run_files`), and with which settings was
it made (:func:`recorded_settings`)? It imports neither PyTorch nor Flower, so
``fedweigh simulate`` asks them before it loads anything heavy.

Example
-------
>>> import tempfile, pathlib
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> run_files(folder)
[]
>>> _ = (folder / METRICS_FILE).write_text("")
>>> run_files(folder)
['metrics.jsonl']
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fedweigh.settings import flatten

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_FILE = "checkpoint.pt"
MODEL_FILE = "model.pt"
SUMMARY_FILE = "summary.json"
RESUMES_FILE = "resumes.jsonl"
"""One line per resumption of the run (``resume-from``): after which round, when, the federation's size, and the
settings that differ from ``config.json``'s (which stays as the run's first segment wrote it)."""

ROUNDS_NOT_AGGREGATED = "rounds_not_aggregated"
"""summary.json: the rounds whose global model stayed as it was (no valid reply in time, too few, or a
non-finite aggregate; each round's ``left_out`` in metrics.jsonl says why)."""

RUN_FILES = (CONFIG_FILE, METRICS_FILE, CHECKPOINT_FILE, MODEL_FILE, SUMMARY_FILE, RESUMES_FILE)
"""The files a run writes in its folder: a folder holding any of them holds a run."""

SET_ASIDE_PREFIX = "set-aside-"
"""Name of the sub-folder (``set-aside-<UTC time>``) that :func:`set_aside` moves a run's files into."""


def run_files(folder: str | os.PathLike[str]) -> list[str]:
    """The run files (:data:`RUN_FILES`) ``folder`` holds, in that order; empty when it holds no run."""
    folder = Path(folder)
    return [name for name in RUN_FILES if (folder / name).exists()]


def read_config(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's ``config.json`` as written (settings, instruction, versions); None when missing or unreadable."""
    try:
        config = json.loads((Path(folder) / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def recorded_settings(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The settings the run in ``folder`` was made with, as flat run-config keys; None without a readable config."""
    config = read_config(folder)
    settings = config.get("settings") if config else None
    return flatten(settings) if isinstance(settings, dict) else None


def recorded_partitions(folder: str | os.PathLike[str]) -> int | None:
    """The number of partitions the run in ``folder`` was split into (None when its config does not say)."""
    config = read_config(folder) or {}
    value = config.get("num_partitions")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def set_aside(folder: str | os.PathLike[str], now: datetime | None = None) -> Path | None:
    """Move the run files of ``folder`` into a new ``set-aside-<UTC time>`` sub-folder; return it (None: none).

    For a caller that starts a run over in its own folder (the experiment
    runner, after an attempt that left no usable checkpoint): nothing is
    deleted, and the folder no longer holds a run.
    """
    folder = Path(folder)
    names = run_files(folder)
    if not names:
        return None
    stamp = f"{(now or datetime.now(UTC)).astimezone(UTC):%Y%m%dT%H%M%SZ}"
    target, n = folder / f"{SET_ASIDE_PREFIX}{stamp}", 1
    while target.exists():
        n += 1
        target = folder / f"{SET_ASIDE_PREFIX}{stamp}-{n}"
    target.mkdir()
    for name in names:
        (folder / name).rename(target / name)
    return target


RESUME_MAY_CHANGE = frozenset(
    {
        # the run's place: a resumed run continues in the folder it resumes
        "output-dir",
        "run-name",
        "resume-from",
        # more rounds (preflight checks that they go beyond the checkpoint's)
        "num-server-rounds",
        # where and how often the rounds are shown
        "tracking",
        "tensorboard-dir",
        "tracking-uri",
        "tracking-experiment",
        "evaluate-every",
        "eval-batch-size",
        "final-uncertainty",
        # how long a round may wait, and where and how the work runs
        "round-timeout",
        "device",
        "simulation-backend",
        "event-driven-simulation",
    }
)
"""The settings a resumed run (``resume-from``) may give other values than the run it continues.

Every other setting shapes the run (the model and its options, the data and
its split, the strategy, rule and their options, the seed, the training
recipe, asynchrony, faults, ...) and must equal the checkpoint's run's, or
the resumed run would silently be another run. ``num-server-rounds`` may
grow; a strategy whose schedule spans the rounds (``center``) then follows
the new schedule after the resumption.
"""


def shaping_differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, recorded value, current value)`` for every setting outside :data:`RESUME_MAY_CHANGE` that differs.

    Both are flat run configs (dotted keys, as :func:`flatten` gives);
    values are compared as JSON stores them (tuples as lists, infinities as
    null). A key on one side only is not compared: a setting a newer version
    added keeps the behaviour of the version that wrote the run at its default.

    >>> shaping_differences({"seed": 7, "run-name": "x"}, {"seed": 1, "run-name": "y"})
    [('seed', 7, 1)]
    """

    def stored(value: Any) -> Any:
        if isinstance(value, tuple | list):
            return [stored(item) for item in value]
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value

    return [
        (key, recorded[key], current[key])
        for key in sorted(set(recorded) & set(current) - RESUME_MAY_CHANGE)
        if stored(recorded[key]) != stored(current[key])
    ]
