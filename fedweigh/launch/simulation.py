"""Local simulations: runs submitted with ``flwr run`` to a local SuperLink.

Why not plain ``flwr run .``?  With Flower 1.41 the default ``:local:``
connection auto-starts a SuperLink *with* runtime dependency installation,
which ``uv sync``s the whole app (torch included) into a fresh per-run
environment. :class:`LocalSimulation` starts its own SuperLink without it
(:class:`~fedweigh.launch.superlink.LocalSuperLink`) and submits runs with
``flwr run <app> <connection> --stream``, one at a time, each streamed,
waited for and summarised (:class:`RunOutcome`).

The run config is not checked here: its callers check it once, before they
start anything (:func:`fedweigh.preflight.check_run`), and the ServerApp
checks it again, since plain ``flwr run`` may start it too.

From Python (one SuperLink, many runs)::

    with LocalSimulation(app_dir) as sim:
        for seed in (1, 2, 3):
            outcome = sim.run({"seed": seed, "run-name": f"fedavg-s{seed}"})
            print(outcome.status, outcome.results_dir, outcome.summary())
"""

from __future__ import annotations

import collections
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedweigh.launch.commands import (
    ANSI,
    COMPLETED,
    DEFAULT_NUM_SUPERNODES,
    build_federation_config,
    engine_backend,
    flwr_run_command,
    parse_run_id,
)
from fedweigh.launch.processes import sigint_ignored
from fedweigh.launch.runconfig import load_app_config, prepare_run_config, results_dir_for
from fedweigh.launch.superlink import STATUS_WAIT_AFTER_STREAM, LocalSuperLink
from fedweigh.run_folder import MODEL_FILE, SUMMARY_FILE

_FIRST_ROUND = re.compile(r"\[ROUND 1\b")
_MTIME_SLACK = 1.0
"""Seconds a file's modification time may lag the clock (file systems store coarse times)."""


@dataclass
class RunOutcome:
    """What happened to one ``flwr run``."""

    run_id: int | None
    status: str  # e.g. "finished:completed", "finished:failed", "not-started"
    results_dir: Path | None
    run_config: dict[str, Any] = field(default_factory=dict)
    details: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    submitted: float = 0.0  # wall time (time.time()) of the submission: older files are another run's

    @property
    def ok(self) -> bool:
        return self.status == COMPLETED

    def _written_by_this_run(self, name: str) -> Path | None:
        """``<results_dir>/<name>`` if this run wrote it (not a file an earlier run left in a resumed folder)."""
        if self.results_dir is None:
            return None
        path = self.results_dir / name
        try:
            return path if path.stat().st_mtime >= self.submitted - _MTIME_SLACK else None
        except OSError:
            return None

    def results_complete(self, num_rounds: int) -> bool:
        """This run wrote its final model and a summary of all ``num_rounds`` rounds.

        True also for a run whose process was killed after writing them, which
        the SuperLink then reports as failed (no heartbeat).
        """
        summary = self.summary()
        return (
            summary is not None
            and summary.get("rounds") == num_rounds
            and self._written_by_this_run(MODEL_FILE) is not None
        )

    @property
    def run_name(self) -> str | None:
        name = self.run_config.get("run-name")
        return str(name) if name else None

    def summary(self) -> dict[str, Any] | None:
        """Contents of ``<results_dir>/summary.json`` if this run wrote it (not an earlier run in the same folder)."""
        path = self._written_by_this_run(SUMMARY_FILE)
        if path is None:
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None


class LocalSimulation(LocalSuperLink):
    """A :class:`~fedweigh.launch.superlink.LocalSuperLink` that submits runs and waits for them."""

    def run(self, *args: Any, submit_attempts: int = 3, **kwargs: Any) -> RunOutcome:
        """Submit one run and block until it has finished (see :meth:`_run_once`).

        A submission that never gets a run id (``flwr run`` failed before the
        SuperLink accepted it, e.g. a busy machine timing out the CLI) is tried
        again, up to ``submit_attempts`` times; a run that started is never
        re-submitted.
        """
        outcome = self._run_once(*args, **kwargs)
        for attempt in range(2, submit_attempts + 1):
            if outcome.status != "not-started":
                break
            self._say(
                f"`flwr run` did not start a run ({outcome.details}); submitting again ({attempt}/{submit_attempts})"
            )
            time.sleep(2.0)
            outcome = self._run_once(*args, **kwargs)
        return outcome

    def _run_once(
        self,
        run_config: Mapping[str, Any] | None = None,
        num_supernodes: int = DEFAULT_NUM_SUPERNODES,
        cpus_per_client: int = 1,
        gpus_per_client: float = 0.0,
        *,
        federation_config: Mapping[str, Any] | None = None,
        app_dir: str | os.PathLike[str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        stream: bool = True,
        echo: bool = True,
        log_path: str | os.PathLike[str] | None = None,
        wait_timeout: float | None = STATUS_WAIT_AFTER_STREAM,
        on_line: Callable[[str], None] | None = None,
    ) -> RunOutcome:
        """Submit one run and block until it has finished.

        ``run_config`` holds overrides of ``[tool.flwr.app.config]`` (flattened keys;
        values as Python objects), checked by the caller.  Relative ``output-dir``/``dataset`` paths are
        resolved against ``cwd`` (default: the current directory).  The streamed run
        log is echoed to stdout (``echo``) and/or appended to ``log_path``, and
        each line (ANSI colours removed) is passed to ``on_line`` (e.g. to show progress).
        On ``KeyboardInterrupt`` the run is stopped with ``flwr stop`` and the
        interrupt is re-raised.
        """
        app = Path(app_dir).expanduser().resolve() if app_dir else self.app_dir
        base = Path(cwd).resolve() if cwd else Path.cwd()
        defaults = load_app_config(app)
        cfg = prepare_run_config(dict(run_config or {}), defaults, base)
        results_dir = results_dir_for(cfg)
        backend = engine_backend({**defaults, **cfg})
        fed = build_federation_config(
            num_supernodes, cpus_per_client, gpus_per_client, {**backend, **(federation_config or {})}
        )
        cmd = flwr_run_command(app, self.connection, fed, cfg, stream=stream)
        self._say("$ " + shlex.join(cmd))

        timings: dict[str, float] = {}
        run_id: int | None = None
        submitted = time.time()
        t0 = time.monotonic()
        log_fh = Path(log_path).open("a", encoding="utf-8") if log_path else None  # noqa: SIM115
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            text=True,
            errors="replace",
            bufsize=1,
        )

        last_lines: collections.deque[str] = collections.deque(maxlen=5)

        def handle(line: str) -> None:
            nonlocal run_id
            last_lines.append(ANSI.sub("", line))
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
            if log_fh:
                log_fh.write(ANSI.sub("", line))
            if on_line is not None:
                on_line(ANSI.sub("", line))
            if self.tree is not None:
                self.tree.maybe_refresh()
            if run_id is None and (rid := parse_run_id(line)) is not None:
                run_id = rid
                self.active_runs.add(rid)
                timings["submit_s"] = time.monotonic() - t0
            elif "first_round_s" not in timings and _FIRST_ROUND.search(line):
                timings["first_round_s"] = time.monotonic() - t0

        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                handle(line)
            rc = proc.wait()
            timings["stream_s"] = time.monotonic() - t0
            if run_id is None:
                self._say(f"`flwr run` exited with code {rc} without starting a run")
                tail = " | ".join(line.strip() for line in last_lines if line.strip())
                return RunOutcome(
                    None, "not-started", results_dir, cfg, f"flwr run rc={rc}: {tail}", timings, submitted
                )
            status, details = self.wait_for_run(run_id, wait_timeout)
            timings["total_s"] = time.monotonic() - t0
            self.settle()
            timings["settled_s"] = time.monotonic() - t0
        except KeyboardInterrupt:
            with sigint_ignored():
                self._say("interrupted")
                if proc.poll() is None:
                    proc.terminate()
                try:
                    rest, _ = proc.communicate(timeout=5)
                    for line in (rest or "").splitlines(keepends=True):
                        handle(line)
                except (subprocess.TimeoutExpired, ValueError, OSError):
                    proc.kill()
                if run_id is not None:
                    self.stop_runs([run_id])
            raise
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if log_fh:
                log_fh.close()
        return RunOutcome(run_id, status, results_dir, cfg, details, timings, submitted)
