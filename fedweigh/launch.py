"""Launch fedweigh simulations on a SuperLink that we start and stop ourselves.

Why not plain ``flwr run .``?  With Flower 1.41 the default ``:local:`` connection
auto-starts a SuperLink *with* runtime dependency installation, which ``uv sync``s
the whole app (torch included) into a fresh per-run environment.  Here we start
``flower-superlink --simulation --disable-runtime-dependency-installation`` on a
port of our own, register it as a connection in ``$FLWR_HOME/config.toml`` and
submit runs with ``flwr run <app> <connection> --stream``.

Command line::

    fedweigh simulate [--app PATH] [--run-config "k=v k2=v2" ...]
                      [--num-supernodes 10] [--cpus-per-client 1]
                      [--gpus-per-client 0.0] [--port 39191] [--keep-superlink]
    fedweigh stop-superlink [--app PATH] [--port 39191]
    fedweigh experiment run|report FILE ...    (fedweigh.experiments.cli)
    fedweigh benchmark NAME|all ...            (fedweigh.benchmarks.cli)

From Python (one SuperLink, many runs)::

    with LocalSimulation(app_dir) as sim:
        for seed in (1, 2, 3):
            outcome = sim.run({"seed": seed, "run-name": f"fedavg-s{seed}"})
            print(outcome.status, outcome.results_dir, outcome.summary())
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self, TextIO

__all__ = [
    "DEFAULT_CONNECTION",
    "DEFAULT_PORT",
    "LocalSimulation",
    "ProcessTree",
    "RunOutcome",
    "SimulationError",
    "build_federation_config",
    "build_run_config_arg",
    "default_run_name",
    "flwr_run_command",
    "format_toml_value",
    "load_app_config",
    "main",
    "merge_connection",
    "parse_run_config",
    "parse_run_id",
    "parse_run_status",
    "prepare_run_config",
    "resolve_dataset",
    "resolve_flwr_home",
    "resolve_output_dir",
    "results_dir_for",
    "simulation_env",
    "superlink_command",
    "superlink_is_up",
    "terminate_process_tree",
    "wait_for_task_processes",
    "update_connection_text",
    "write_connection",
]

DEFAULT_CONNECTION = "fedweigh-sim"
# Flower's own managed local SuperLink uses 39091 (HTTP API) and 39093; stay clear.
DEFAULT_PORT = int(os.environ.get("FEDWEIGH_SUPERLINK_PORT", "39191"))
DEFAULT_NUM_SUPERNODES = 10
SUPERLINK_STARTUP_TIMEOUT = 60.0
STATUS_POLL_INTERVAL = 1.0
STATUS_WAIT_AFTER_STREAM = 120.0
FINISHED = "finished"
COMPLETED = "finished:completed"

# Flower's default config.toml (flwr.cli.constant.DEFAULT_FLOWER_CONFIG_TOML): used
# when the file does not exist yet, so `flwr` keeps its usual connections.
_DEFAULT_FLOWER_CONFIG_TOML = """[superlink]
default = "local"

[superlink.supergrid]
address = "api.flower.ai"

[superlink.local]
address = ":local:"
"""

# Env vars that pin BLAS/OpenMP/torch intra-op threads to one per process.
THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)

# If the app's run config has this key, `run()` fills it with the federation size.
NUM_SUPERNODES_KEY = "num-supernodes"

# Run-config keys holding local paths that are made absolute when they exist
# relative to the current working directory (the apps run in other cwds).
PATH_KEYS_IF_EXISTING = ("dataset", "resume-from")

# flwr.common.config.parse_config_args splits `--run-config` with this pattern.
_KV = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_RUN_STARTED = re.compile(r"Successfully started run (\d+)")
_FIRST_ROUND = re.compile(r"\[ROUND 1\b")


class SimulationError(RuntimeError):
    """Raised when the SuperLink or a run cannot be set up."""


# --------------------------------------------------------------------------------------
# Pure helpers
# --------------------------------------------------------------------------------------


def resolve_flwr_home(app_dir: Path, env: Mapping[str, str] | None = None) -> Path:
    """Return ``$FLWR_HOME`` if set, else ``<app_dir>/.flwr`` (always absolute)."""
    env = os.environ if env is None else env
    if env.get("FLWR_HOME"):
        return Path(env["FLWR_HOME"]).expanduser().resolve()
    return (Path(app_dir).expanduser().resolve() / ".flwr").resolve()


def merge_connection(config: Mapping[str, Any], name: str, address: str, insecure: bool = True) -> dict[str, Any]:
    """Return a copy of a parsed ``config.toml`` with connection ``name`` set.

    Other connections, the ``default`` key and any other top-level tables are kept.
    """
    merged = copy.deepcopy(dict(config))
    superlink = merged.setdefault("superlink", {})
    if not isinstance(superlink, dict):
        raise SimulationError("`superlink` in the Flower config is not a table")
    entry = superlink.get(name)
    entry = dict(entry) if isinstance(entry, dict) else {}
    entry["address"] = address
    entry["insecure"] = insecure
    superlink[name] = entry
    return merged


def update_connection_text(text: str | None, name: str, address: str, insecure: bool = True) -> str | None:
    """Return new ``config.toml`` text with connection ``name``, or None if unchanged.

    ``text=None`` means the file does not exist yet (Flower's default is used as a
    base).  A missing connection is appended as a new table so that comments and
    formatting of the existing file survive; a differing one forces a rewrite.
    """
    if not _BARE_KEY.match(name):
        raise ValueError(f"connection name must match [A-Za-z0-9_-]+: {name!r}")
    base = _DEFAULT_FLOWER_CONFIG_TOML if text is None else text
    try:
        current = tomllib.loads(base)
    except tomllib.TOMLDecodeError as err:
        raise SimulationError(f"Flower config is not valid TOML: {err}") from err
    existing = current.get("superlink", {}).get(name)
    wanted = {"address": address, "insecure": insecure}
    if isinstance(existing, dict) and all(existing.get(k) == v for k, v in wanted.items()):
        return None if text is not None else base

    if existing is None:
        block = (
            f"\n[superlink.{name}]\naddress = {format_toml_value(address)}\ninsecure = {format_toml_value(insecure)}\n"
        )
        candidate = base.rstrip("\n") + "\n" + block
        try:
            if tomllib.loads(candidate) == merge_connection(current, name, address, insecure):
                return candidate
        except tomllib.TOMLDecodeError:
            pass  # e.g. `superlink` is an inline table: fall back to a rewrite

    import tomli_w  # dependency of flwr; only needed for the rare rewrite

    return tomli_w.dumps(merge_connection(current, name, address, insecure))


def format_toml_value(value: Any) -> str:
    """Format a run-config value as a TOML value that ``flwr --run-config`` accepts.

    Flower splits ``--run-config`` on whitespace with the pattern
    ``key=('...'|"..."|\\S+)`` and then parses each value as TOML.  Strings are
    therefore written as TOML literal strings ``'...'`` (no escapes, safe for
    Windows paths and spaces) or, if they contain a single quote, as basic strings.
    """
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()  # numpy scalars
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        if "\n" in value or "\r" in value:
            raise ValueError(f"run-config strings cannot contain newlines: {value!r}")
        if "'" not in value:
            return f"'{value}'"
        if '"' not in value:
            return '"' + value.replace("\\", "\\\\") + '"'
        raise ValueError(f"run-config strings cannot contain both ' and \" (flwr limitation): {value!r}")
    raise TypeError(f"unsupported run-config value type {type(value).__name__}: {value!r}")


def build_run_config_arg(run_config: Mapping[str, Any]) -> str:
    """Build the ``"k1=v1 k2='v 2'"`` string for ``flwr run --run-config``."""
    parts = []
    for key, value in run_config.items():
        if not key or any(c.isspace() for c in key) or "=" in key:
            raise ValueError(f"invalid run-config key: {key!r}")
        parts.append(f"{key}={format_toml_value(value)}")
    return " ".join(parts)


def parse_run_config(args: Iterable[str] | None) -> dict[str, Any]:
    """Parse ``--run-config`` arguments like ``flwr run`` does, a bit more kindly.

    Accepts ``"k=v k2=v2"`` strings (values are TOML) or a single ``.toml`` file;
    keys stay flat (``fedprox.proximal-mu``).  Differences from ``flwr``: a bare word
    that is not valid TOML (``strategy=fedoui``) is taken as a string instead of
    being rejected, and leftover text (``note=a b`` -> ``b``), which ``flwr``
    silently drops, raises ``ValueError``.
    """
    args = [a for a in (args or []) if a and a.strip()]
    if not args:
        return {}
    if len(args) == 1 and args[0].endswith(".toml"):
        with Path(args[0]).expanduser().open("rb") as fh:
            return _flatten(tomllib.load(fh))
    out: dict[str, Any] = {}
    for arg in args:
        if arg.endswith(".toml"):
            raise ValueError("a .toml run-config file cannot be combined with k=v pairs")
        pos = 0
        for m in _KV.finditer(arg):
            junk = arg[pos : m.start()].strip()
            if junk:
                raise ValueError(
                    f"cannot parse {junk!r} in --run-config {arg!r} (quote strings with spaces: key='a b')"
                )
            pos = m.end()
            key, raw = m.group(1), m.group(2)
            try:
                value = tomllib.loads(f"v = {raw}")["v"]
            except tomllib.TOMLDecodeError as err:
                if raw[:1] in "'\"":
                    raise ValueError(f"invalid TOML value for {key!r}: {raw}") from err
                value = raw  # lenient: bare words are strings (flwr would reject)
            if not isinstance(value, bool | int | float | str):
                value = raw  # dates, arrays: flwr run-config values are scalars
            out[key] = value
        junk = arg[pos:].strip()
        if junk:
            raise ValueError(f"cannot parse {junk!r} in --run-config {arg!r}")
    return out


def load_app_config(app_dir: Path) -> dict[str, Any]:
    """Return the flattened ``[tool.flwr.app.config]`` defaults of an app."""
    pyproject = Path(app_dir) / "pyproject.toml"
    try:
        with pyproject.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError as err:
        raise SimulationError(f"no pyproject.toml in {app_dir}") from err
    config = data.get("tool", {}).get("flwr", {}).get("app", {}).get("config", {})
    return _flatten(config)


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        full = f"{prefix}.{key}" if prefix else key
        if isinstance(value, Mapping):
            out.update(_flatten(value, full))
        else:
            out[full] = value
    return out


def resolve_output_dir(value: str | os.PathLike[str] | None, cwd: Path) -> Path:
    """Absolute output dir: relative values are taken against ``cwd``."""
    raw = str(value) if value not in (None, "") else "outputs"
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = Path(cwd) / path
    return Path(os.path.normpath(path))


def resolve_dataset(value: Any, cwd: Path) -> Any:
    """Make a relative path that exists (relative to ``cwd``) absolute.

    Anything else (e.g. a dataset name like ``"digits"`` or a Hugging Face id like
    ``"uoft-cs/cifar10"`` that is not a local folder) is returned unchanged.
    """
    if not isinstance(value, str) or not value:
        return value
    path = Path(value).expanduser()
    if path.is_absolute():
        return str(path) if value.startswith("~") else value
    candidate = Path(cwd) / path
    if candidate.exists():
        return os.path.normpath(candidate)
    return value


def default_run_name(strategy: Any, now: datetime | None = None) -> str:
    """``<strategy>-<UTC timestamp>``, e.g. ``fedavg-20260101T120000Z``."""
    now = now or datetime.now(UTC)
    if now.tzinfo is not None:
        now = now.astimezone(UTC)
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", str(strategy or "run")).strip("._") or "run"
    return f"{name}-{now:%Y%m%dT%H%M%SZ}"


def prepare_run_config(
    overrides: Mapping[str, Any],
    app_defaults: Mapping[str, Any],
    cwd: Path,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Return the run-config overrides to send, with paths and run name filled in.

    - unknown keys raise ``ValueError`` (Flower would only fail inside the run);
    - an int given for a float default is sent as float;
    - ``output-dir`` (if the app has it) is always sent, made absolute against
      ``cwd`` (default ``<cwd>/outputs``);
    - ``run-name`` (if the app has it) defaults to ``<strategy>-<UTC timestamp>``,
      with ``-2``, ``-3``, ... appended if that results folder already exists;
    - ``dataset``/``resume-from`` given as relative paths that exist are made absolute.
    """
    cwd = Path(cwd)
    unknown = sorted(set(overrides) - set(app_defaults))
    if unknown:
        raise ValueError(f"unknown run-config key(s) {unknown}; the app defines {sorted(app_defaults)}")
    cfg: dict[str, Any] = {}
    for key, value in overrides.items():
        default = app_defaults[key]
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        cfg[key] = value

    for key in PATH_KEYS_IF_EXISTING:
        if key in cfg:
            cfg[key] = resolve_dataset(cfg[key], cwd)

    if "output-dir" in app_defaults:
        out = resolve_output_dir(cfg.get("output-dir", app_defaults["output-dir"]), cwd)
        cfg["output-dir"] = str(out)
        if "run-name" in app_defaults and not str(cfg.get("run-name") or ""):
            default_name = str(app_defaults.get("run-name") or "")
            if not default_name:
                strategy = cfg.get("strategy", app_defaults.get("strategy", "run"))
                base = default_run_name(strategy, now)
                default_name, n = base, 1
                while (out / default_name).exists():
                    n += 1
                    default_name = f"{base}-{n}"
            cfg["run-name"] = default_name
    elif "run-name" in app_defaults and not str(cfg.get("run-name") or ""):
        cfg["run-name"] = default_run_name(cfg.get("strategy", app_defaults.get("strategy", "run")), now)
    return cfg


def check_settings(run_config: Mapping[str, Any], num_partitions: int | None = None) -> None:
    """Validate the full run config as the apps will (``ValueError`` naming each bad setting).

    With ``num_partitions``, also check that the data splits that many ways,
    so a simulation with more SuperNodes than samples fails before it starts.
    """
    from fedweigh.server_app import check_partitions  # imports torch; only needed here
    from fedweigh.settings import parse_settings

    settings = parse_settings(run_config)
    if num_partitions is not None:
        check_partitions(settings, num_partitions)


def results_dir_for(run_config: Mapping[str, Any]) -> Path | None:
    """``<output-dir>/<run-name>`` of a prepared run config, if both are known."""
    if run_config.get("resume-from"):  # a resumed run continues in its own folder
        return Path(str(run_config["resume-from"]))
    out, name = run_config.get("output-dir"), run_config.get("run-name")
    if not out or not name:
        return None
    return Path(str(out)) / str(name)


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


def superlink_command(port: int, database: str | os.PathLike[str] | None = None, host: str = "127.0.0.1") -> list[str]:
    """``flower-superlink`` command for a simulation SuperLink without ``uv sync``."""
    cmd = [
        _executable("flower-superlink"),
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
    """``flwr run <app> <connection> --federation-config ... --run-config ... --stream``."""
    cmd = [_executable("flwr"), "run", str(app_dir), connection]
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
    one thread per process unless set (Ray workers inherit this), and puts this
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
    m = _RUN_STARTED.search(_ANSI.sub("", line))
    return int(m.group(1)) if m else None


def parse_run_status(text: str, run_id: int | None = None) -> tuple[str | None, str]:
    """``(status, details)`` from ``flwr ls --run-id N --format json`` output.

    ``flwr ls`` exits 0 even on errors and reports ``"success": false`` instead;
    then ``(None, error-message)`` is returned.
    """
    text = _ANSI.sub("", text)
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


# --------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------


def _executable(name: str) -> str:
    """Prefer the executable next to this interpreter, then PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    return shutil.which(name) or name


def _process_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (ppid, start-time token, state) for all processes."""
    table: dict[int, tuple[int, str, str]] = {}
    proc = Path("/proc")
    if proc.is_dir():
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            rest = stat[stat.rfind(")") + 2 :].split()
            # rest[0]=state, rest[1]=ppid, rest[19]=starttime
            if len(rest) > 19:
                table[int(entry.name)] = (int(rest[1]), rest[19], rest[0])
        return table
    out = subprocess.run(
        ["ps", "-A", "-o", "pid=", "-o", "ppid=", "-o", "stat=", "-o", "lstart="],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4:
            table[int(parts[0])] = (int(parts[1]), parts[3].strip(), parts[2][:1])
    return table


def _descendants(root: int, table: Mapping[int, tuple[int, str, str]]) -> set[tuple[int, str]]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[tuple[int, str]] = set()
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.add((pid, table[pid][1]))
        stack.extend(children.get(pid, []))
    return found


def _signal_all(procs: Iterable[tuple[int, str]], sig: signal.Signals) -> None:
    for pid, _ in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


Proc = tuple[int, str]  # (pid, start-time token): survives pid reuse


class ProcessTree:
    """Every process ever seen below ``root`` (a SuperLink), for a clean shutdown.

    The tree is SuperLink -> SuperExec -> ``flwr-simulation`` (one per run) -> Ray's
    gcs_server, raylet (-> agents, ClientApp actors), dashboard, monitors.  When a
    process exits its children are re-parented to init, and Ray leaves its
    DashboardAgent/RuntimeEnvAgent behind when a run is stopped, so processes are
    remembered once seen (``refresh()``) and "orphans" (remembered, alive, no longer
    below ``root``) can be cleaned up.
    """

    def __init__(self, root: int, popen: subprocess.Popen[Any] | None = None) -> None:
        table = _process_table()
        self.root: Proc = (root, table[root][1]) if root in table else (root, "")
        self.popen = popen  # if root is our child: reaped promptly on refresh
        self.known: set[Proc] = set()
        self._last = 0.0
        self.refresh(table)

    def refresh(self, table: dict[int, tuple[int, str, str]] | None = None) -> dict[int, tuple[int, str, str]]:
        if self.popen is not None:
            self.popen.poll()  # a zombie parent still "exists" for Flower's pid monitor
        table = _process_table() if table is None else table
        if not self.root[1] and self.root[0] in table:
            self.root = (self.root[0], table[self.root[0]][1])
        for pid, start in self.known | {self.root}:
            if pid in table and table[pid][1] == start:
                self.known.update(_descendants(pid, table))
        self._last = time.monotonic()
        return table

    def maybe_refresh(self, every: float = 1.0) -> None:
        if time.monotonic() - self._last >= every:
            self.refresh()

    @staticmethod
    def _living(procs: Iterable[Proc], table: Mapping[int, tuple[int, str, str]]) -> set[Proc]:
        return {(p, s) for p, s in procs if p in table and table[p][1] == s and table[p][2] != "Z"}

    def root_alive(self, table: Mapping[int, tuple[int, str, str]]) -> bool:
        return bool(self._living([self.root], table))

    def task_processes(self, table: Mapping[int, tuple[int, str, str]]) -> set[Proc]:
        """Live processes below the root's direct children (SuperExec)."""
        pid = self.root[0]
        if not self.root_alive(table):
            return set()
        direct = {p for p, (ppid, _, _) in table.items() if ppid == pid}
        return {(p, s) for p, s in self._living(_descendants(pid, table), table) if p not in direct}

    def orphans(self, table: Mapping[int, tuple[int, str, str]]) -> set[Proc]:
        """Remembered processes still alive but no longer below the root."""
        below = _descendants(self.root[0], table) if self.root_alive(table) else set()
        return self._living(self.known, table) - below - {self.root}

    def wait_quiet(self, timeout: float = 20.0) -> bool:
        """Wait until no task process runs below the root; True if that happened.

        A finished or stopped run's ``flwr-simulation`` needs a few seconds to shut
        Ray down; terminating the SuperLink before that orphans Ray's processes.
        """
        deadline = time.monotonic() + timeout
        while True:
            table = self.refresh()
            if not self.task_processes(table):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    def _wait_gone(self, procs: Callable[[], set[Proc]], seconds: float) -> set[Proc]:
        deadline = time.monotonic() + seconds
        while True:
            table = self.refresh()
            alive = self._living(procs(), table)
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(0.2)

    def kill(self, procs: set[Proc], term_wait: float = 5.0, retry_term: bool = True) -> list[int]:
        """SIGTERM the tops of ``procs`` (so e.g. ``flwr-simulation`` can shut Ray
        down), then all of them, then SIGKILL what is left.  Returns SIGKILLed pids."""
        if not procs:
            return []
        table = self.refresh()
        left = self._living(procs, table)
        pids = {p for p, _ in left}
        tops = {(p, s) for p, s in left if table[p][0] not in pids}
        _signal_all(tops, signal.SIGTERM)
        left = self._wait_gone(lambda: left, term_wait)
        if left and retry_term:
            _signal_all(left, signal.SIGTERM)
            left = self._wait_gone(lambda: left, 3.0)
        if left:
            _signal_all(left, signal.SIGKILL)
            self._wait_gone(lambda: left, 2.0)
        return sorted(p for p, _ in left)

    def kill_orphans(self) -> list[int]:
        """Clean up processes that left the tree (e.g. Ray agents of a stopped run).

        Their raylet is gone and they do not react to SIGTERM: SIGKILL after 1 s."""
        return self.kill(self.orphans(self.refresh()), term_wait=1.0, retry_term=False)

    def terminate(self, grace: float = 10.0, settle: float = 5.0) -> list[int]:
        """SIGTERM the root (the SuperLink terminates its SuperExec), SIGKILL it after
        ``grace`` s, give the rest ``settle`` s to exit on their own (Flower's task
        processes watch their parent), then ``kill()`` what remains.  Returns SIGKILLed
        pids."""
        table = self.refresh()
        if not self.root_alive(table):
            return self.kill(self._living(self.known, table))
        _signal_all([self.root], signal.SIGTERM)
        killed: list[int] = []
        if self._wait_gone(lambda: {self.root}, grace):
            _signal_all([self.root], signal.SIGKILL)
            killed.append(self.root[0])
            self._wait_gone(lambda: {self.root}, 2.0)
        left = self._wait_gone(lambda: self.known, settle)
        return killed + self.kill(left)


class RayNode:
    """One Ray node run by ``ray start --block <argv>``; all its processes stay below that one.

    :meth:`start` returns once the node is up; :meth:`stop` terminates it
    (``ray start --block`` stops its node on SIGTERM) and SIGKILLs leftovers.
    """

    STARTED = "Ray runtime started"

    def __init__(self, argv: list[str], log_path: Path, env: Mapping[str, str], startup_timeout: float = 120.0) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.env = {**env, "RAY_USAGE_STATS_ENABLED": "0"}
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.tree: ProcessTree | None = None
        self.startup_seconds: float | None = None

    def start(self) -> None:
        t0 = time.monotonic()
        with self.log_path.open("wb") as log:
            self.process = spawn_logged([_executable("ray"), "start", "--block", *self.argv], log, self.env)
        self.tree = ProcessTree(self.process.pid, self.process)
        while self.STARTED not in self.log_path.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() - t0 > self.startup_timeout:
                self.stop()
                log = _tail(self.log_path)
                raise SimulationError(f"the Ray node did not start; see {self.log_path}:\n{log}")
            time.sleep(0.1)
        self.startup_seconds = time.monotonic() - t0

    def stop(self) -> list[int]:
        """Terminate the node; returns the SIGKILLed pids."""
        if self.tree is None:
            return []
        killed = self.tree.terminate(grace=15.0, settle=5.0)
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process, self.tree = None, None
        return killed


class RayHead(RayNode):
    """A local Ray cluster (a head node alone) shared by the runs of one SuperLink.

    Flower 1.41 starts a Ray cluster inside every run's ``flwr-simulation``
    process (``ray.init()``) and shuts it down at the end: about 4-5 s per run
    on the 2-core project machine (docs/benchmarks.md). Started once here and
    handed to the SuperLink as ``RAY_ADDRESS`` (inherited by each run's
    simulation process), every run attaches to it instead; its ClientApp actors
    are still the run's own (they die with the run's driver), so nothing of a
    run leaks into the next. The cluster's resources are Ray's defaults for the
    machine, as with ``ray.init()``. Its ports are free ones and its temporary
    folder its own (Ray's default one, ``/tmp/ray``, would record it as the
    machine's current cluster, which every later ``ray.init()`` without an
    address, Flower's per-run one included, would then try to join, even once
    it is stopped), so it does not collide with another Ray on the machine.
    """

    def __init__(self, env: Mapping[str, str], log_path: Path, startup_timeout: float = 120.0) -> None:
        self.port = free_port()
        # Short: Ray's socket paths live below it and must fit in 107 bytes.
        self.temp_dir = Path(tempfile.mkdtemp(prefix=f"fwray{self.port}-", dir="/tmp"))
        argv = ["--head", "--node-ip-address", "127.0.0.1", "--port", str(self.port)]
        argv += ["--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", str(self.temp_dir)]
        argv += free_port_options("dashboard-agent-listen-port", "ray-client-server-port", "metrics-export-port")
        super().__init__(argv, log_path, env, startup_timeout)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> list[int]:
        killed = super().stop()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return killed


def spawn_logged(cmd: list[str], log: Any, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start a long-lived service with its output in ``log``, in its own session.

    Its own session: a Ctrl-C in the terminal reaches us, not the service, so we
    can stop runs and services in order.
    """
    return subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=dict(env), start_new_session=True
    )


def free_port() -> int:
    """A TCP port nobody listens on at the moment (on 127.0.0.1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_options(*names: str) -> list[str]:
    """``--<name> <free port>`` for each name (``ray start`` options), so a node shares no port with another."""
    return [arg for name in names for arg in (f"--{name}", str(free_port()))]


def terminate_process_tree(pid: int, grace: float = 10.0, popen: subprocess.Popen[Any] | None = None) -> list[int]:
    """Stop a SuperLink and everything below it; returns the SIGKILLed pids."""
    return ProcessTree(pid, popen).terminate(grace)


def wait_for_task_processes(pid: int, timeout: float = 20.0) -> bool:
    """Wait until the runs' processes below a SuperLink have exited."""
    return ProcessTree(pid).wait_quiet(timeout)


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Ignore Ctrl-C during cleanup so a second one cannot leave orphans behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def superlink_is_up(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    """True if a SuperLink's HTTP API answers ``/health`` on ``host:port``."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=timeout) as r:
            return 200 <= r.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def write_connection(flwr_home: Path, name: str, address: str, insecure: bool = True) -> Path:
    """Create/update connection ``name`` in ``<flwr_home>/config.toml``."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    text = path.read_text(encoding="utf-8") if path.exists() else None
    new = update_connection_text(text, name, address, insecure)
    if new is not None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(new, encoding="utf-8")
        tmp.replace(path)
    return path


# --------------------------------------------------------------------------------------
# LocalSimulation
# --------------------------------------------------------------------------------------


@dataclass
class RunOutcome:
    """What happened to one ``flwr run``."""

    run_id: int | None
    status: str  # e.g. "finished:completed", "finished:failed", "not-started"
    results_dir: Path | None
    run_config: dict[str, Any] = field(default_factory=dict)
    details: str = ""
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == COMPLETED

    @property
    def run_name(self) -> str | None:
        name = self.run_config.get("run-name")
        return str(name) if name else None

    def summary(self) -> dict[str, Any] | None:
        """Contents of ``<results_dir>/summary.json`` if it exists."""
        if self.results_dir is None:
            return None
        path = self.results_dir / "summary.json"
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None


class LocalSimulation:
    """A simulation SuperLink (started on demand) plus ``flwr`` CLI calls against it.

    Use as a context manager; ``stop()`` only stops a SuperLink this object started,
    and not at all when ``keep_superlink=True``.

    With ``shared_ray=True`` (the experiment runner, the benchmarks) a SuperLink
    this object starts gets one :class:`RayHead` for all its runs instead of
    Flower's cluster per run; ignored when the SuperLink is kept or already
    running, or when ``RAY_ADDRESS`` names a cluster already.
    """

    def __init__(
        self,
        app_dir: str | os.PathLike[str] | None = None,
        *,
        port: int = DEFAULT_PORT,
        connection: str = DEFAULT_CONNECTION,
        flwr_home: str | os.PathLike[str] | None = None,
        database: str | os.PathLike[str] | None = None,
        keep_superlink: bool = False,
        startup_timeout: float = SUPERLINK_STARTUP_TIMEOUT,
        out: TextIO | None = None,
        shared_ray: bool = False,
    ) -> None:
        self.app_dir = Path(app_dir or Path.cwd()).expanduser().resolve()
        self.port = int(port)
        self.connection = connection
        self.flwr_home = Path(flwr_home).expanduser().resolve() if flwr_home else resolve_flwr_home(self.app_dir)
        self.database = database
        self.keep_superlink = keep_superlink
        self.startup_timeout = startup_timeout
        self.out = out
        self.env = simulation_env(self.flwr_home)
        self.log_path = self.flwr_home / "superlink.log"
        self.pid_path = self.flwr_home / f"superlink-{self.port}.pid"
        self.process: subprocess.Popen[bytes] | None = None
        self.tree: ProcessTree | None = None  # processes below the SuperLink we started
        self.startup_seconds: float | None = None
        self.stop_seconds: float | None = None
        self.active_runs: set[int] = set()  # submitted, not yet seen finished
        self._final: dict[int, tuple[str, str]] = {}  # run id -> (status, details)
        self._control: Any = None  # Control API client, see run_status
        self.shared_ray = shared_ray
        self.ray: RayHead | None = None  # the shared Ray cluster we started

    # -- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def started_superlink(self) -> bool:
        return self.process is not None

    def _say(self, msg: str) -> None:
        print(f"[fedweigh] {msg}", file=self.out or sys.stderr, flush=True)

    def start(self) -> None:
        """Register the connection and start the SuperLink unless one answers."""
        write_connection(self.flwr_home, self.connection, self.address)
        if superlink_is_up(self.port):
            self._say(
                f"reusing the SuperLink already answering on {self.address} "
                "(its environment, e.g. OMP_NUM_THREADS, is whatever it was started with)"
            )
            return
        if self.shared_ray and not self.keep_superlink and not self.env.get("RAY_ADDRESS"):
            self.ray = RayHead(self.env, self.flwr_home / f"ray-{self.port}.log")
            self.ray.start()
            self.env["RAY_ADDRESS"] = self.ray.address
            self._say(f"shared Ray cluster up on {self.ray.address} in {self.ray.startup_seconds:.1f}s")
        cmd = superlink_command(self.port, self.database)
        self._say(f"starting SuperLink: {' '.join(cmd)} (log: {self.log_path})")
        t0 = time.monotonic()
        with self.log_path.open("ab") as log:
            log.write(f"\n===== fedweigh: {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ} {' '.join(cmd)}\n".encode())
            log.flush()
            self.process = spawn_logged(cmd, log, self.env)
        self.pid_path.write_text(f"{self.process.pid}\n")
        self.tree = ProcessTree(self.process.pid, self.process)
        deadline = t0 + self.startup_timeout
        while not superlink_is_up(self.port):
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                self.tree = None
                self.pid_path.unlink(missing_ok=True)
                self._stop_ray()
                raise SimulationError(
                    f"flower-superlink exited with code {code}; see {self.log_path}:\n" + _tail(self.log_path)
                )
            if time.monotonic() > deadline:
                self._stop_process()
                raise SimulationError(f"SuperLink not up after {self.startup_timeout:.0f}s; see {self.log_path}")
            time.sleep(0.1)
        self.startup_seconds = time.monotonic() - t0
        self._say(f"SuperLink up on {self.address} in {self.startup_seconds:.1f}s")

    def stop(self) -> None:
        """Stop the SuperLink we started (and its SuperExec/Ray process tree).

        Runs this object submitted that are still going (e.g. after an exception in
        the caller) are ``flwr stop``-ped first so they shut Ray down cleanly.
        """
        if self.process is None:
            return
        if self.keep_superlink:
            self._say(
                f"keeping SuperLink (pid {self.process.pid}) on {self.address}; stop it "
                f"with `fedweigh stop-superlink --app {self.app_dir} --port {self.port}`"
            )
            return
        with _sigint_ignored():
            self.stop_runs(self.active_runs)
            self._stop_process()

    def stop_runs(self, run_ids: Iterable[int], timeout: float = 30.0) -> None:
        """``flwr stop`` each run and wait (up to ``timeout``) until it has finished."""
        for run_id in list(run_ids):
            self._say(f"stopping run {run_id} (flwr stop)")
            self.stop_run(run_id)
            status, _ = self.wait_for_run(run_id, timeout)
            self._say(f"run {run_id}: {status}")

    def unfinished_runs(self) -> list[int]:
        """Ids of runs on the SuperLink whose status is not ``finished:*``."""
        try:
            res = self._flwr("ls", self.connection, "--format", "json")
            data = json.loads(res.stdout[res.stdout.find("{") :])
        except (subprocess.TimeoutExpired, json.JSONDecodeError, ValueError):
            return []
        return [int(r["run-id"]) for r in data.get("runs", []) if not str(r.get("status", "")).startswith(FINISHED)]

    def settle(self, timeout: float = 30.0) -> None:
        """Wait for finished runs' processes to exit; clean up what Ray leaves behind.

        Called after each run, so the next run does not compete with the previous
        run's Ray shutdown and stopped runs do not leak Ray agents.
        """
        if self.tree is None:
            return
        if not self.tree.wait_quiet(timeout):
            self._say(f"run processes still busy after {timeout:.0f}s")
        if killed := self.tree.kill_orphans():
            self._say(f"cleaned up leftover Ray processes {killed}")

    def _stop_process(self) -> None:
        assert self.process is not None and self.tree is not None
        pid = self.process.pid
        t0 = time.monotonic()
        self.settle()
        killed = self.tree.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None
        self.tree = None
        self.pid_path.unlink(missing_ok=True)
        self._stop_ray()
        self.stop_seconds = time.monotonic() - t0
        extra = f" (had to SIGKILL {killed})" if killed else ""
        self._say(f"SuperLink (pid {pid}) stopped in {self.stop_seconds:.1f}s{extra}")

    def _stop_ray(self) -> None:
        if self.ray is None:
            return
        if killed := self.ray.stop():
            self._say(f"shared Ray cluster stopped (had to SIGKILL {killed})")
        self.ray = None
        self.env.pop("RAY_ADDRESS", None)

    # -- flwr CLI ----------------------------------------------------------------------
    def _flwr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [_executable("flwr"), *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )

    def run_status(self, run_id: int) -> tuple[str | None, str]:
        """``(status, details)`` of a run, e.g. ``("finished:completed", "")``.

        Asked through Flower's Control API client in this process (about 10 ms);
        if that fails for any reason, through ``flwr ls <conn> --run-id N --format
        json`` (about 2 s: the CLI's start-up), which reports errors in its own words.
        """
        try:
            from flwr.proto.control_pb2 import ListRunsRequest

            listed = self._control_client().ListRuns(ListRunsRequest(run_id=run_id)).run_dict.get(run_id)
            if listed is not None:
                state = listed.status
                return (f"{state.status}:{state.sub_status}" if state.sub_status else state.status), state.details
        except Exception:  # noqa: BLE001 - any failure: ask the CLI instead
            pass
        try:
            res = self._flwr("ls", self.connection, "--run-id", str(run_id), "--format", "json")
        except subprocess.TimeoutExpired:
            return None, "flwr ls timed out"
        return parse_run_status(res.stdout + res.stderr, run_id)

    def _control_client(self) -> Any:
        """Flower's Control API client for this SuperLink (created once)."""
        if self._control is None:
            from flwr.supercore.control.control_http_client import ControlHttpClient
            from flwr.supercore.interceptors.http.runtime_version import RuntimeVersionHttpInterceptor

            self._control = ControlHttpClient.from_server_address(
                server_address=self.address,
                insecure=True,
                root_certificates=None,
                interceptors=[RuntimeVersionHttpInterceptor(component_name="flwr CLI")],
            )
        return self._control

    def stop_run(self, run_id: int) -> bool:
        """``flwr stop <run_id> <conn>``; True if the CLI reported success."""
        try:
            res = self._flwr("stop", str(run_id), self.connection, "--format", "json")
        except subprocess.TimeoutExpired:
            return False
        return '"success": true' in res.stdout

    def wait_for_run(self, run_id: int, timeout: float | None = STATUS_WAIT_AFTER_STREAM) -> tuple[str, str]:
        """Poll until the run's status is ``finished:*`` (or ``timeout`` expires)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        status, details = None, ""
        while True:
            if self.tree is not None:
                self.tree.maybe_refresh()
            status, details = self.run_status(run_id)
            if status and status.startswith(FINISHED):
                self.active_runs.discard(run_id)
                self._final[run_id] = (status, details)
                return status, details
            if status is None and run_id in self._final:
                return self._final[run_id]  # seen finished before the SuperLink went
            if status is None and not superlink_is_up(self.port):
                return "unknown", f"SuperLink on {self.address} is down. {details}".strip()
            if deadline is not None and time.monotonic() > deadline:
                return status or "unknown", details
            time.sleep(STATUS_POLL_INTERVAL)

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
        values as Python objects).  If the app defines a ``num-supernodes`` key it is
        set to ``num_supernodes`` unless given.  Relative ``output-dir``/``dataset`` paths are
        resolved against ``cwd`` (default: the current directory).  The streamed run
        log is echoed to stdout (``echo``) and/or appended to ``log_path``, and
        each line (ANSI colours removed) is passed to ``on_line`` (e.g. to show progress).
        On ``KeyboardInterrupt`` the run is stopped with ``flwr stop`` and the
        interrupt is re-raised.
        """
        app = Path(app_dir).expanduser().resolve() if app_dir else self.app_dir
        base = Path(cwd).resolve() if cwd else Path.cwd()
        app_defaults = load_app_config(app)
        overrides = dict(run_config or {})
        if NUM_SUPERNODES_KEY in app_defaults:
            # Let the ServerApp know the federation size (it is not in its Context):
            # simulated nodes register one by one while the ServerApp already runs.
            overrides.setdefault(NUM_SUPERNODES_KEY, int(num_supernodes))
        cfg = prepare_run_config(overrides, app_defaults, base)
        check_settings({**app_defaults, **cfg})
        results_dir = results_dir_for(cfg)
        fed = build_federation_config(num_supernodes, cpus_per_client, gpus_per_client, federation_config)
        cmd = flwr_run_command(app, self.connection, fed, cfg, stream=stream)
        self._say("$ " + " ".join(_shell_quote(c) for c in cmd))

        timings: dict[str, float] = {}
        run_id: int | None = None
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
            last_lines.append(_ANSI.sub("", line))
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
            if log_fh:
                log_fh.write(_ANSI.sub("", line))
            if on_line is not None:
                on_line(_ANSI.sub("", line))
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
                return RunOutcome(None, "not-started", results_dir, cfg, f"flwr run rc={rc}: {tail}", timings)
            status, details = self.wait_for_run(run_id, wait_timeout)
            timings["total_s"] = time.monotonic() - t0
            self.settle()
            timings["settled_s"] = time.monotonic() - t0
        except KeyboardInterrupt:
            with _sigint_ignored():
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
        return RunOutcome(run_id, status, results_dir, cfg, details, timings)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return ""


def _shell_quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedweigh", description="Run fedweigh Flower simulations locally.")
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser(
        "simulate",
        help="run one simulation on a local SuperLink (no `uv sync`)",
        description="Start a local simulation SuperLink (unless one answers on --port), "
        "run the app with `flwr run ... --stream`, wait for it to finish and print "
        "where the results are.",
    )
    sim.add_argument("--app", default=None, help="Flower app dir (default: cwd)")
    sim.add_argument(
        "--run-config",
        "-c",
        action="append",
        default=[],
        metavar='"k=v k2=v2"',
        help="run-config overrides as for `flwr run` (repeatable; values are TOML, "
        "quote strings: name='a b'); or a single .toml file",
    )
    sim.add_argument("--num-supernodes", type=int, default=DEFAULT_NUM_SUPERNODES)
    sim.add_argument("--cpus-per-client", type=int, default=1)
    sim.add_argument("--gpus-per-client", type=float, default=0.0)
    sim.add_argument("--port", type=int, default=DEFAULT_PORT)
    sim.add_argument(
        "--keep-superlink",
        action="store_true",
        help="leave the SuperLink running for later runs",
    )
    sim.add_argument(
        "--database",
        default=None,
        help="SuperLink state database file (default: in memory)",
    )

    stop = sub.add_parser("stop-superlink", help="stop a SuperLink left running by --keep-superlink")
    stop.add_argument("--app", default=None, help="Flower app dir (default: cwd)")
    stop.add_argument("--port", type=int, default=DEFAULT_PORT)

    from fedweigh.benchmarks.cli import add_benchmark_parser
    from fedweigh.experiments.cli import add_experiment_parser

    add_experiment_parser(sub)
    add_benchmark_parser(sub)
    return parser


def _cmd_simulate(args: argparse.Namespace) -> int:
    app = Path(args.app or Path.cwd()).expanduser().resolve()
    if not (app / "pyproject.toml").is_file():
        print(f"fedweigh: no pyproject.toml in {app}", file=sys.stderr)
        return 2
    try:
        overrides = parse_run_config(args.run_config)
        # Validate before starting anything.
        defaults = load_app_config(app)
        check_settings({**defaults, **prepare_run_config(overrides, defaults, Path.cwd())}, args.num_supernodes)
    except (ValueError, SimulationError) as err:
        print(f"fedweigh: {err}", file=sys.stderr)
        return 2

    sim = LocalSimulation(app, port=args.port, database=args.database, keep_superlink=args.keep_superlink)
    t0 = time.monotonic()
    try:
        with sim:
            outcome = sim.run(
                overrides,
                num_supernodes=args.num_supernodes,
                cpus_per_client=args.cpus_per_client,
                gpus_per_client=args.gpus_per_client,
            )
    except KeyboardInterrupt:
        print("fedweigh: interrupted", file=sys.stderr)
        return 130
    except SimulationError as err:
        print(f"fedweigh: {err}", file=sys.stderr)
        return 1

    total = time.monotonic() - t0
    print(f"\nrun {outcome.run_id}: {outcome.status}" + (f" ({outcome.details})" if outcome.details else ""))
    if outcome.results_dir is not None:
        missing = "" if outcome.results_dir.exists() else " (not created)"
        print(f"results: {outcome.results_dir}{missing}")
        summary = outcome.summary()
        if summary is not None and "final_accuracy" in summary:
            print(f"final_accuracy: {summary['final_accuracy']}")
        elif outcome.ok:
            print(f"(no summary.json in {outcome.results_dir})")
    timing = ", ".join(f"{k}={v:.1f}s" for k, v in outcome.timings.items())
    startup = f"superlink_start={sim.startup_seconds:.1f}s, " if sim.startup_seconds else ""
    stop = f", superlink_stop={sim.stop_seconds:.1f}s" if sim.stop_seconds else ""
    print(f"timings: {startup}{timing}{stop}, wall={total:.1f}s")
    return 0 if outcome.ok else 1


def _cmd_stop_superlink(args: argparse.Namespace) -> int:
    app = Path(args.app or Path.cwd()).expanduser().resolve()
    pid_path = resolve_flwr_home(app) / f"superlink-{args.port}.pid"
    try:
        pid = int(pid_path.read_text().strip())
    except (OSError, ValueError):
        print(f"fedweigh: no pid file {pid_path}", file=sys.stderr)
        return 1
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        cmdline = "flower-superlink"  # no /proc (macOS): trust the pid file
    if "flower-superlink" not in cmdline or f"{args.port}" not in cmdline:
        print(
            f"fedweigh: pid {pid} is not our SuperLink; removing {pid_path}",
            file=sys.stderr,
        )
        pid_path.unlink(missing_ok=True)
        return 1
    sim = LocalSimulation(app, port=args.port)
    with _sigint_ignored():
        sim.tree = ProcessTree(pid)  # snapshot while the tree is intact
        sim.stop_runs(sim.unfinished_runs())
        sim.settle()
        killed = sim.tree.terminate()
    pid_path.unlink(missing_ok=True)
    print(f"stopped SuperLink pid {pid}" + (f" (SIGKILLed {killed})" if killed else ""))
    return 0


def _cmd_experiment(args: argparse.Namespace) -> int:
    from fedweigh.experiments.cli import run_command

    return run_command(args)


def _cmd_benchmark(args: argparse.Namespace) -> int:
    from fedweigh.benchmarks.cli import run_command

    return run_command(args)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fedweigh`` console script."""
    args = _build_parser().parse_args(argv)
    # `kill <pid>` stops a run the way Ctrl-C does: the run, the SuperLink and Ray go too.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "simulate": _cmd_simulate,
        "stop-superlink": _cmd_stop_superlink,
        "experiment": _cmd_experiment,
        "benchmark": _cmd_benchmark,
    }
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
