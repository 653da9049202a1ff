"""The Flower commands fedweigh runs: ``flower-superlink``, ``flwr run``, and what they print.

Builders of the command lines (:func:`superlink_command`,
:func:`flwr_run_command`, :func:`build_federation_config`), the environment
they run in (:func:`simulation_env`), and readers of their output
(:func:`parse_run_id`, :func:`parse_run_status`, :func:`superlink_is_up`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedweigh.allocator import PROCESS_ENV
from fedweigh.launch.flwr_cli import FLWR_CLI
from fedweigh.launch.runconfig import build_run_config_arg
from fedweigh.settings import IN_PROCESS_BACKEND

DEFAULT_NUM_SUPERNODES = 10
FINISHED = "finished"
COMPLETED = "finished:completed"

# Env vars that pin BLAS/OpenMP/torch intra-op threads to one per process.
THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
"""Terminal colour codes, removed before reading Flower's output."""
_RUN_STARTED = re.compile(r"Successfully started run (\d+)")


def executable(name: str) -> str:
    """Prefer the executable next to this interpreter, then PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    return shutil.which(name) or name


def build_federation_config(
    num_supernodes: int = DEFAULT_NUM_SUPERNODES,
    cpus_per_client: int = 1,
    gpus_per_client: float = 0.0,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """Build the ``--federation-config`` string (keys: ``flwr federation
    simulation-config --help``)."""
    if int(num_supernodes) < 1:
        raise ValueError("num-supernodes must be >= 1")
    if int(cpus_per_client) < 1:
        raise ValueError("client-resources-num-cpus must be an int >= 1")
    if float(gpus_per_client) < 0:
        raise ValueError("client-resources-num-gpus must be >= 0")
    cfg: dict[str, Any] = {
        "num-supernodes": int(num_supernodes),
        "client-resources-num-cpus": int(cpus_per_client),
        "client-resources-num-gpus": float(gpus_per_client),
    }
    cfg.update(extra or {})
    return build_run_config_arg(cfg)


def engine_backend(run_config: Mapping[str, Any]) -> dict[str, str]:
    """The federation config's ``backend`` for a run config (its defaults included): ``{}`` for Ray's.

    A run with ``simulation-backend = "in-process"`` names that backend to
    Flower's simulation as well, so that Flower neither asks for Ray nor
    checks that it is installed (Flower 1.41 checks only for ``"ray"`` and
    builds its Ray backend whatever the name; fedweigh's engine hand-off then
    builds the in-process one, ``fedweigh/flower/engine.py``). A machine
    without Ray, such as the lent GPU machines, runs in-process so.
    """
    if run_config.get("simulation-backend") == IN_PROCESS_BACKEND:
        return {"backend": IN_PROCESS_BACKEND}
    return {}


def superlink_command(port: int, database: str | os.PathLike[str] | None = None, host: str = "127.0.0.1") -> list[str]:
    """``flower-superlink`` command for a simulation SuperLink without ``uv sync``."""
    cmd = [
        executable("flower-superlink"),
        "--insecure",
        "--simulation",
        "--disable-runtime-dependency-installation",
        "--host",
        host,
        "--port",
        str(port),
    ]
    if database:
        cmd += ["--database", str(database)]
    return cmd


def flwr_run_command(
    app_dir: Path,
    connection: str,
    federation_config: str,
    run_config: Mapping[str, Any] | str,
    stream: bool = True,
) -> list[str]:
    """``flwr run <app> <connection> --federation-config ... --run-config ... --stream``.

    Flower's CLI, started as :data:`~fedweigh.launch.flwr_cli.FLWR_CLI`: the
    same FAB, built without walking the project's virtual environment.
    """
    cmd = [*FLWR_CLI, "run", str(app_dir), connection]
    cmd += ["--federation-config", federation_config]
    run_cfg = run_config if isinstance(run_config, str) else build_run_config_arg(run_config)
    if run_cfg:
        cmd += ["--run-config", run_cfg]
    if stream:
        cmd.append("--stream")
    return cmd


def simulation_env(flwr_home: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for the SuperLink and the ``flwr`` CLI calls.

    Sets ``FLWR_HOME``, forces no runtime dependency installation, disables the
    (offline-hostile) update check and telemetry unless set, pins numeric libraries to
    one thread per process unless set (Ray workers inherit this), gives every thread
    of a process glibc's main malloc arena unless set (:data:`fedweigh.allocator.PROCESS_ENV`), and puts this
    interpreter's ``bin`` dir first on ``PATH`` so the SuperLink finds the same
    ``flower-superexec``/``flwr-simulation`` executables, and starts Ray's workers
    at normal priority (``RAY_worker_niceness=0``) unless set.
    """
    env = dict(os.environ if base is None else base)
    env["FLWR_HOME"] = str(flwr_home)
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    for var in THREAD_ENV_VARS:
        env.setdefault(var, "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    for var, value in PROCESS_ENV.items():  # glibc's malloc: every thread keeps its freed memory (allocator.py)
        env.setdefault(var, value)
    # Ray starts its workers (the ClientApp actors, where all local training runs) at
    # niceness 15, below the ServerApp's process and anything else on the machine; on a
    # busy machine that starved training (measured 1.2-1.6x slower per round, see
    # docs/benchmarks.md). Ray's own job manager sets 0 the same way.
    env.setdefault("RAY_worker_niceness", "0")
    bin_dir = str(Path(sys.executable).parent)
    path = env.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        env["PATH"] = bin_dir + (os.pathsep + path if path else "")
    return env


def parse_run_id(line: str) -> int | None:
    """Run id from ``flwr run`` output (``Successfully started run <id>``)."""
    m = _RUN_STARTED.search(ANSI.sub("", line))
    return int(m.group(1)) if m else None


def parse_run_status(text: str, run_id: int | None = None) -> tuple[str | None, str]:
    """``(status, details)`` from ``flwr ls --run-id N --format json`` output.

    ``flwr ls`` exits 0 even on errors and reports ``"success": false`` instead;
    then ``(None, error-message)`` is returned.
    """
    text = ANSI.sub("", text)
    start = text.find("{")
    if start < 0:
        return None, text.strip()
    try:
        data = json.loads(text[start:])
    except json.JSONDecodeError:
        return None, text.strip()
    if not data.get("success", False):
        return None, str(data.get("error-message", "")).strip()
    for run in data.get("runs", []):
        if run_id is None or str(run.get("run-id")) == str(run_id):
            details = str(run.get("status-details", ""))
            return str(run.get("status")), "" if details == "N/A" else details
    return None, f"run {run_id} not listed"


def superlink_is_up(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    """True if a SuperLink's HTTP API answers ``/health`` on ``host:port``."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=timeout) as r:
            return 200 <= r.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False
