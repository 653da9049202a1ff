"""Two fedweigh commands on one port: a SuperLink another live process will stop is never reused.

The claim is an ``flock`` the kernel drops when its holder exits, so the tests
hold it from a child process (the real situation: a second experiment started
while the first one runs) and synchronise on the child's lines, not on sleeps.
"""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from fedweigh.launch.claim import CLAIM_DIR_ENV, PortClaim, available_port, claim_for
from fedweigh.launch.processes import free_port
from fedweigh.launch.runconfig import SimulationError
from fedweigh.launch.superlink import LocalSuperLink, choose_port

REPO = Path(__file__).resolve().parents[1]

HOLD = """
import sys
from fedweigh.launch.claim import PortClaim
claim = PortClaim(int(sys.argv[1]))
print("held" if claim.acquire() else "taken", flush=True)
sys.stdin.read()  # hold until the test closes stdin
"""


@pytest.fixture(autouse=True)
def claim_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Claims of these tests live in a folder of their own (children inherit it)."""
    root = tmp_path / "claims"
    root.mkdir()
    monkeypatch.setenv(CLAIM_DIR_ENV, str(root))
    return root


class Holder:
    """A child process holding the claim on ``port`` until :meth:`release`."""

    def __init__(self, port: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert self.proc.stdout is not None
        self.state = self.proc.stdout.readline().strip()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0


@pytest.fixture
def holder() -> Iterator[Holder]:
    held = Holder(free_port())
    assert held.state == "held"
    try:
        yield held
    finally:
        if held.proc.poll() is None:
            held.release()


class Health(BaseHTTPRequestHandler):
    """Answers ``/health`` as a SuperLink's HTTP API does."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def answering() -> Iterator[int]:
    """A port where something answers a SuperLink's health check."""
    server = HTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def claim_on(port: int) -> Holder:
    held = Holder(port)
    assert held.state == "held"
    return held


def test_a_claim_excludes_other_processes_and_ends_with_its_holder(holder: Holder) -> None:
    port = int(holder.proc.args[-1])
    claim = PortClaim(port)
    assert not claim.acquire()
    assert claim.holder() == holder.pid
    holder.release()  # the holder exits: the kernel drops its lock
    assert claim.holder() is None
    assert claim.acquire()
    assert Holder(port).state == "taken"  # now we hold it against the next process
    claim.release()
    assert Holder(port).state == "held"


def test_a_superlink_another_process_owns_is_refused_before_anything_is_registered(
    answering: int, tmp_path: Path
) -> None:
    held = claim_on(answering)
    try:
        link = LocalSuperLink(REPO, port=answering, flwr_home=tmp_path / "home", connection="second")
        with pytest.raises(SimulationError) as err:
            link.start()
        message = str(err.value)
        assert f"port {answering}" in message
        assert f"pid {held.pid}" in message
        assert "--port" in message
        suggested = int(message.split("--port; ")[1].split()[0])
        assert suggested != answering
        assert not (tmp_path / "home" / "config.toml").exists()  # no connection points at it
        assert not link.started_superlink
    finally:
        held.release()


def test_an_unclaimed_superlink_is_reused_and_left_unclaimed(answering: int, tmp_path: Path) -> None:
    """A SuperLink kept running (--keep-superlink) or started by hand: anyone may use it."""
    link = LocalSuperLink(REPO, port=answering, flwr_home=tmp_path / "home", connection="kept")
    link.start()
    assert not link.started_superlink
    assert "127.0.0.1:" + str(answering) in (tmp_path / "home" / "config.toml").read_text()
    assert PortClaim(answering).holder() is None  # a reuser does not claim what it will not stop
    link.stop()  # stops nothing it did not start
    assert Holder(answering).state == "held"


def test_a_port_given_is_kept_and_a_default_port_in_use_is_passed_over(holder: Holder) -> None:
    taken = int(holder.proc.args[-1])
    assert choose_port(taken) == taken  # --port given: used as given (start() then says why not)
    out = io.StringIO()
    picked = choose_port(None, default=taken, out=out)
    assert picked != taken
    assert f"port {taken} belongs to another fedweigh process's SuperLink; using {picked}" in out.getvalue()
    claim_for(picked).release()
    holder.release()
    assert choose_port(None, default=taken) == taken
    claim_for(taken).release()


def test_a_port_picked_is_claimed_at_once_and_handed_to_the_launcher(answering: int, tmp_path: Path) -> None:
    """Two commands started at the same moment must not both pick the default port."""
    first = choose_port(None, default=answering)
    second = choose_port(None, default=answering)  # as another command would, before the first starts
    assert first == answering  # nobody owned it: an unclaimed SuperLink there is reused, as before
    assert second != first
    assert Holder(first).state == "taken"  # claimed from the moment it was picked
    claim_for(second).release()
    link = LocalSuperLink(REPO, port=first, flwr_home=tmp_path / "home", connection="picked")
    link.start()  # takes the claim over instead of tripping on it
    assert not link.started_superlink
    assert Holder(first).state == "held"  # reusing, it let the claim go


def test_the_next_free_port_skips_claimed_and_answering_ports(answering: int) -> None:
    base = answering - 1
    held = claim_on(base)
    try:
        port = available_port(base, is_up=lambda p: p == answering)  # base+1 answers: skipped too
        assert port not in (base, answering)
        assert PortClaim(port).holder() is None
    finally:
        held.release()


@pytest.mark.xdist_group("simulation")
def test_the_shared_simulation_superlink_is_refused_to_a_second_launcher(
    shared_simulation: LocalSuperLink, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real case: a SuperLink this test session started and will stop."""
    monkeypatch.delenv(CLAIM_DIR_ENV)  # the session's SuperLink claimed its port where every launcher looks
    port = shared_simulation.port
    assert shared_simulation.started_superlink
    second = LocalSuperLink(REPO, port=port, flwr_home=tmp_path / "home", connection="second")
    with pytest.raises(SimulationError, match=f"port {port}: its SuperLink belongs to another fedweigh process"):
        second.start()
