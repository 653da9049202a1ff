"""A local simulation SuperLink that fedweigh starts, watches and stops.

:class:`LocalSuperLink` starts ``flower-superlink --simulation
--disable-runtime-dependency-installation`` on a port of its own (unless one
already answers there), registers it as a connection, asks it for the status
of runs, stops runs, and at the end stops it and every process below it (its
SuperExec, each run's ``flwr-simulation`` process, Ray), Ctrl-C included.
With ``shared_ray=True`` it also starts one Ray cluster for all its runs
(:class:`~fedweigh.launch.ray.RayHead`). Submitting runs is
:class:`~fedweigh.launch.simulation.LocalSimulation`'s job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self, TextIO

from fedweigh.launch.claim import available_port, claim_for, reserve_port
from fedweigh.launch.commands import (
    FINISHED,
    executable,
    parse_run_status,
    simulation_env,
    superlink_command,
    superlink_is_up,
)
from fedweigh.launch.connection import DEFAULT_CONNECTION, resolve_flwr_home, write_connection
from fedweigh.launch.processes import Guardian, ProcessTree, sigint_ignored, spawn_logged, tail
from fedweigh.launch.ray import RayHead
from fedweigh.launch.runconfig import SimulationError

# Flower's own managed local SuperLink uses 39091 (HTTP API) and 39093; stay clear.
DEFAULT_PORT = int(os.environ.get("FEDWEIGH_SUPERLINK_PORT", "39191"))
SUPERLINK_STARTUP_TIMEOUT = 60.0
STATUS_POLL_INTERVAL = 1.0
STATUS_WAIT_AFTER_STREAM = 120.0


def port_help(default: int, what: str = "the SuperLink") -> str:
    """The ``--port`` help of a command that starts a local SuperLink (see :func:`choose_port`)."""
    taken = "another fedweigh process owns the SuperLink there"
    return f"port of {what} (default: {default}, or the next free one if {taken})"


def choose_port(given: int | None, default: int = DEFAULT_PORT, out: TextIO | None = None) -> int:
    """The port a command's SuperLink uses: ``--port`` if given, else ``default``.

    With no ``--port``, a default port whose SuperLink another fedweigh process
    owns is passed over for the next free one (said on ``out``), so two
    experiments started side by side do not share, and stop, one SuperLink. The
    port chosen is claimed at once, for the :class:`LocalSuperLink` that follows.
    """
    if given is not None:
        return int(given)
    port = reserve_port(default)
    if port != default:
        print(
            f"[fedweigh] port {default} belongs to another fedweigh process's SuperLink; using {port}",
            file=out or sys.stderr,
            flush=True,
        )
    return port


class LocalSuperLink:
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
        ray_nodes: int = 1,
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
        self.ray_nodes = ray_nodes  # nodes of the shared cluster, all on this machine
        self.ray: RayHead | None = None  # the shared Ray cluster we started
        self.claim = claim_for(self.port)  # held while we will stop the SuperLink we started
        self.guardian: Guardian | None = None  # stops the SuperLink we started if we die first

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
        """Register the connection and start the SuperLink unless one answers.

        A SuperLink that answers is reused only if no other live fedweigh process
        claims it (it would stop it, with our runs, when its own runs end): then
        this raises :class:`SimulationError` before anything is submitted.
        """
        if not self.claim.acquire():
            holder = self.claim.holder()
            raise SimulationError(
                f"port {self.port}: its SuperLink belongs to another fedweigh process"
                + (f" (pid {holder})" if holder else "")
                + ", which stops it when its own runs end, and runs sent there would end with them. "
                f"Give this command a port of its own (--port; {available_port(self.port)} is free), "
                "or leave --port out to have one picked"
            )
        write_connection(self.flwr_home, self.connection, self.address)
        if superlink_is_up(self.port):
            self.claim.release()  # not ours to stop: a SuperLink kept running, or not fedweigh's
            self._say(
                f"reusing the SuperLink already answering on {self.address} "
                "(its environment, e.g. OMP_NUM_THREADS, is whatever it was started with)"
            )
            return
        try:
            self._start_process()
        except BaseException:
            self.claim.release()
            raise
        if self.keep_superlink:
            self.claim.release()  # we will not stop it, so others may reuse it

    def _start_process(self) -> None:
        if self.shared_ray and not self.keep_superlink and not self.env.get("RAY_ADDRESS"):
            self.ray = RayHead(self.env, self.flwr_home / f"ray-{self.port}.log", nodes=self.ray_nodes)
            self.ray.start()
            self.env["RAY_ADDRESS"] = self.ray.address
            nodes = f" ({self.ray_nodes} nodes)" if self.ray_nodes > 1 else ""
            self._say(f"shared Ray cluster{nodes} up on {self.ray.address} in {self.ray.startup_seconds:.1f}s")
        cmd = superlink_command(self.port, self.database)
        self._say(f"starting SuperLink: {' '.join(cmd)} (log: {self.log_path})")
        t0 = time.monotonic()
        with self.log_path.open("ab") as log:
            log.write(f"\n===== fedweigh: {datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ} {' '.join(cmd)}\n".encode())
            log.flush()
            self.process = spawn_logged(cmd, log, self.env)
        self.pid_path.write_text(f"{self.process.pid}\n")
        self.tree = ProcessTree(self.process.pid, self.process)
        # stops the SuperLink and all below it should this process die without stopping them (SIGKILL)
        self.guardian = None if self.keep_superlink else Guardian(self.process.pid)
        deadline = t0 + self.startup_timeout
        while not superlink_is_up(self.port):
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                self.tree = None
                self.pid_path.unlink(missing_ok=True)
                self._release_guardian()
                self._stop_ray()
                raise SimulationError(
                    f"flower-superlink exited with code {code}; see {self.log_path}:\n" + tail(self.log_path)
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
        with sigint_ignored():
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
        self._release_guardian()
        self._stop_ray()
        self.claim.release()
        self.stop_seconds = time.monotonic() - t0
        extra = f" (had to SIGKILL {killed})" if killed else ""
        self._say(f"SuperLink (pid {pid}) stopped in {self.stop_seconds:.1f}s{extra}")

    def _release_guardian(self) -> None:
        if self.guardian is not None:
            self.guardian.release()
            self.guardian = None

    def _stop_ray(self) -> None:
        if self.ray is None:
            return
        if killed := self.ray.stop():
            self._say(f"shared Ray cluster stopped (had to SIGKILL {killed})")
        self.ray = None
        self.env.pop("RAY_ADDRESS", None)

    # -- runs on it ----------------------------------------------------------------------
    def _flwr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [executable("flwr"), *args],
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
