"""Who owns the local SuperLink on a port: a host-wide claim held while its owner lives.

A :class:`~fedweigh.launch.superlink.LocalSuperLink` that starts a SuperLink
stops it again when its own runs end. A second fedweigh process that found
that SuperLink answering and sent its runs there would lose them mid-run. So
the starter holds a :class:`PortClaim` (an ``flock`` on
``<tmpdir>/fedweigh-superlink-<port>.claim``) for as long as it will stop the
SuperLink; the kernel drops the lock when the process ends, however it ends.
A SuperLink left running on purpose (``--keep-superlink``) is unclaimed, and
anyone may reuse it.

:func:`reserve_port` picks the port for a command given no ``--port`` and claims
it at once, so that two commands started at the same moment cannot pick the
same one; the launcher that follows takes that claim over (:func:`claim_for`).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from fedweigh.launch.commands import superlink_is_up
from fedweigh.launch.processes import port_is_bindable
from fedweigh.launch.runconfig import SimulationError

CLAIM_DIR_ENV = "FEDWEIGH_CLAIM_DIR"  # where the claims live (tests use their own); default: the temp dir
PORT_SEARCH_SPAN = 100
RESERVE_ATTEMPTS = 10


def claim_path(port: int) -> Path:
    """The file whose lock claims ``port`` on this host."""
    root = Path(os.environ.get(CLAIM_DIR_ENV) or tempfile.gettempdir())
    return root / f"fedweigh-superlink-{int(port)}.claim"


class PortClaim:
    """An exclusive, non-blocking claim on one port, held until :meth:`release` or exit."""

    def __init__(self, port: int) -> None:
        self.port = int(port)
        self.path = claim_path(port)
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the claim; False if another live process holds it."""
        if self._fd is not None:
            return True
        fd = _open(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        try:  # the holder's pid, for the message another process shows
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # a file another user created: the lock still counts, the pid is just not shown
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is None:
            return
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def holder(self) -> int | None:
        """The pid that holds the claim (0 if unknown), or None if nobody does."""
        if self._fd is not None:
            return os.getpid()
        if not self.path.exists():
            return None
        if self.acquire():  # nobody held it
            self.release()
            return None
        try:
            return int(self.path.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # created by another user: locking needs no write access
        return os.open(path, os.O_RDONLY)


def available_port(preferred: int, is_up: Callable[[int], bool] = superlink_is_up) -> int:
    """``preferred``, unless another fedweigh process owns the SuperLink there; then the next free port.

    A port counts as free when no process claims it, nothing answers there
    (``is_up``: a SuperLink's health check) and it can be bound. An unclaimed
    SuperLink on ``preferred`` (one kept running) is reused, as before.
    """
    if PortClaim(preferred).holder() is None:
        return preferred
    for port in range(preferred + 1, preferred + 1 + PORT_SEARCH_SPAN):
        if PortClaim(port).holder() is None and not is_up(port) and port_is_bindable(port):
            return port
    raise SimulationError(f"no free port in {preferred + 1}-{preferred + PORT_SEARCH_SPAN} for a SuperLink")


_reserved: dict[int, PortClaim] = {}  # claims reserve_port took, until a launcher takes them over


def reserve_port(preferred: int, is_up: Callable[[int], bool] = superlink_is_up) -> int:
    """:func:`available_port`, claimed for this process before it is returned."""
    for _ in range(RESERVE_ATTEMPTS):
        port = available_port(preferred, is_up)
        claim = PortClaim(port)  # available_port skips ports this process reserved already
        if claim.acquire():  # fails only if another process claimed it since available_port looked
            _reserved[port] = claim
            return port
    raise SimulationError(f"no port near {preferred} stayed free for a SuperLink ({RESERVE_ATTEMPTS} attempts)")


def claim_for(port: int) -> PortClaim:
    """The claim :func:`reserve_port` took on ``port`` (handed over once), else a fresh one."""
    return _reserved.pop(int(port), None) or PortClaim(port)
