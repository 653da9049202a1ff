"""Processes fedweigh starts, and everything they start in turn.

A SuperLink starts a SuperExec, which starts a ``flwr-simulation`` process per
run, which starts Ray and its actors; a deployment's SuperNodes start
ClientApp processes. :class:`ProcessTree` remembers every process ever seen
below a root, so that all of them can be stopped, orphans included;
:func:`process_table` and :func:`descendants` read the machine's processes
(``/proc``, or ``ps`` elsewhere).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

ProcessTable = dict[int, tuple[int, str, str]]
"""pid -> (parent pid, start-time token, state)."""


def process_table() -> ProcessTable:
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


def descendants(root: int, table: Mapping[int, tuple[int, str, str]]) -> set[tuple[int, str]]:
    """Every process below ``root`` in ``table``, as ``(pid, start-time token)``."""
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
        table = process_table()
        self.root: Proc = (root, table[root][1]) if root in table else (root, "")
        self.popen = popen  # if root is our child: reaped promptly on refresh
        self.known: set[Proc] = set()
        self._last = 0.0
        self.refresh(table)

    def refresh(self, table: dict[int, tuple[int, str, str]] | None = None) -> dict[int, tuple[int, str, str]]:
        if self.popen is not None:
            self.popen.poll()  # a zombie parent still "exists" for Flower's pid monitor
        table = process_table() if table is None else table
        if not self.root[1] and self.root[0] in table:
            self.root = (self.root[0], table[self.root[0]][1])
        for pid, start in self.known | {self.root}:
            if pid in table and table[pid][1] == start:
                self.known.update(descendants(pid, table))
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
        return {(p, s) for p, s in self._living(descendants(pid, table), table) if p not in direct}

    def orphans(self, table: Mapping[int, tuple[int, str, str]]) -> set[Proc]:
        """Remembered processes still alive but no longer below the root."""
        below = descendants(self.root[0], table) if self.root_alive(table) else set()
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


GUARDIAN_RELEASE = b"release"
"""What a launcher tells its service's guardian when it needs it no more (it stopped or keeps the service)."""


class Guardian:
    """A process that stops ``root``'s process tree if this process dies before :meth:`release` (SIGKILL too).

    See :mod:`fedweigh.launch.guardian`. The guardian runs in a session of
    its own (a Ctrl-C in the terminal does not reach it) and reads commands
    from a pipe that only this process holds open.
    """

    def __init__(self, root: int) -> None:
        self.process: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-m", "fedweigh.launch.guardian", str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def release(self, timeout: float = 10.0) -> None:
        """Let the guardian go without touching the service (idempotent)."""
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(OSError):  # a guardian that is gone already
            assert process.stdin is not None
            process.stdin.write(GUARDIAN_RELEASE + b"\n")
            process.stdin.close()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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


def port_is_bindable(port: int) -> bool:
    """True if nothing listens on ``port`` (on 127.0.0.1) at the moment."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_options(*names: str) -> list[str]:
    """``--<name> <free port>`` for each name (``ray start`` options), so a node shares no port with another."""
    return [arg for name in names for arg in (f"--{name}", str(free_port()))]


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Ignore Ctrl-C during cleanup so a second one cannot leave orphans behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return ""
