"""A real Flower deployment on one machine: hosts as network namespaces.

Used by ``tests/test_deployment.py`` and the deployment benchmark
(``fedweigh benchmark deployment``); it works from a checkout of the
repository (the app folder, ``deploy/``'s scripts). Every Flower component runs as its own
process, exactly as on separate machines: a SuperLink (with TLS and SuperNode
authentication), SuperNodes that each hold one partition (their Runtime API,
between a SuperNode and its ClientApps, on TLS too), and an operator host
from which ``flwr`` registers nodes and submits runs. Misconfigured parties
can be started as well: a plaintext SuperNode, a SuperNode that does not
trust the CA, a rogue SuperLink with a certificate for another host.

Hosts
    With root and ``ip netns``, each host is a network namespace with one
    interface (``eth0``, 10.231.0.x/24) whose veth peer sits on a bridge in a
    "switch" namespace of its own. Nothing is added to the machine's own
    namespace; no namespace has a route anywhere else, so traffic stays on the
    addresses made here. Where namespaces are not permitted, every host is
    127.0.0.1 and the hosts differ by port only (:func:`plan_topology`).

Processes
    Started with ``ip netns exec <host> ...`` (which execs, so the pid is the
    Flower process itself), each in its own session, logged to a file, and
    stopped by pid together with everything it started
    (:class:`fedweigh.launch.ProcessTree`). A process below one of them (the
    ``flwr-serverapp`` a SuperLink's SuperExec starts for a run) is found by
    its command line (:meth:`FlowerProcess.running`).

Waiting
    Nothing here sleeps to let something happen: every wait polls a log, a
    file or the CLI until a condition holds or a timeout expires
    (:func:`poll_until`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from fedweigh.launch.commands import parse_run_id, parse_run_status, simulation_env
from fedweigh.launch.flwr_cli import FLWR_CLI
from fedweigh.launch.processes import ProcessTree, descendants, free_port
from fedweigh.launch.runconfig import build_run_config_arg

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SUBNET = "10.231.0"
SUPERLINK_PORT = 9093  # inside its own namespace; any free port on loopback
SUPERNODE_RUNTIME_PORT = 9094  # Flower's default; one per node on loopback
CONNECTION = "federation"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
T = TypeVar("T")


def poll_until(condition: Callable[[], T], timeout: float, what: str, every: float = 0.2) -> T:
    """Call ``condition`` until it returns something truthy (returned), or raise after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout:.0f}s")
        time.sleep(every)
    return result


def command_line(pid: int) -> list[str]:
    """The argv of process ``pid`` (empty if it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


# --------------------------------------------------------------------------------------
# Topology: pure planning
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Host:
    """One machine of the federation.

    Attributes
    ----------
    name : str
        ``superlink``, ``operator``, ``supernode-1``, ...
    address : str
        Its IP address (127.0.0.1 on loopback).
    namespace : str | None
        Its network namespace, or None when it shares the machine's loopback.
    """

    name: str
    address: str
    namespace: str | None = None

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """The command that runs ``argv`` on this host."""
        argv = [str(arg) for arg in argv]
        return ["ip", "netns", "exec", self.namespace, *argv] if self.namespace else argv


@dataclass(frozen=True)
class Topology:
    """Hosts, the SuperLink's port and each SuperNode's Runtime API port."""

    hosts: dict[str, Host]
    superlink_port: int
    runtime_ports: dict[str, int]
    switch: str | None  # namespace holding the bridge; None on loopback

    @property
    def isolated(self) -> bool:
        return self.switch is not None

    @property
    def superlink_address(self) -> str:
        return f"{self.hosts['superlink'].address}:{self.superlink_port}"


def plan_topology(supernodes: Sequence[str], isolated: bool, tag: str, port=free_port) -> Topology:
    """Addresses and ports for the SuperLink, the operator and ``supernodes``.

    Isolated: ``superlink`` is 10.231.0.1, ``operator`` .2, the SuperNodes .10
    onwards, each in namespace ``fw<tag>-<name>``; ports are Flower's usual
    ones since every host has its own. On loopback every host is 127.0.0.1
    and every listening port is a free one.
    """
    if len(supernodes) > 200:
        raise ValueError(f"at most 200 SuperNodes fit in {SUBNET}.0/24, got {len(supernodes)}")
    names = ["superlink", "operator", *supernodes]
    if len(set(names)) != len(names):
        raise ValueError(f"host names must be unique, got {names}")
    if isolated:
        octets = {"superlink": 1, "operator": 2} | {name: 10 + i for i, name in enumerate(supernodes)}
        hosts = {name: Host(name, f"{SUBNET}.{octets[name]}", f"fw{tag}-{name}") for name in names}
        return Topology(hosts, SUPERLINK_PORT, dict.fromkeys(supernodes, SUPERNODE_RUNTIME_PORT), f"fw{tag}-switch")
    hosts = {name: Host(name, "127.0.0.1") for name in names}
    return Topology(hosts, port(), {name: port() for name in supernodes}, None)


# --------------------------------------------------------------------------------------
# The network
# --------------------------------------------------------------------------------------


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def namespaces_permitted() -> tuple[bool, str]:
    """Whether this process may create network namespaces and veth pairs (and why not)."""
    probe = f"fwprobe{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", "") or str(err)
        return False, f"`ip netns add` failed: {detail.strip()}"
    try:
        _ip("-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
        return True, ""
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", "") or str(err)
        return False, f"veth pairs are not permitted: {detail.strip()}"
    finally:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            _ip("netns", "del", probe)


class VirtualNetwork:
    """The namespaces, bridge and veth pairs of an isolated :class:`Topology`."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.created: list[str] = []

    def create(self) -> None:
        switch = self.topology.switch
        if switch is None:
            return
        _ip("netns", "add", switch)
        self.created.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for index, host in enumerate(self.topology.hosts.values()):
            assert host.namespace is not None
            _ip("netns", "add", host.namespace)
            self.created.append(host.namespace)
            port = f"port{index}"
            # Both ends are born inside their namespaces: the machine's own never sees them.
            _ip("link", "add", "eth0", "netns", host.namespace, "type", "veth", "peer", "name", port, "netns", switch)
            _ip("-n", switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.namespace, "link", "set", "eth0", "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")  # each SuperNode's Runtime API

    def destroy(self) -> list[str]:
        """Delete every namespace made here (their interfaces go with them); returns failures."""
        failed = []
        for namespace in reversed(self.created):
            try:
                _ip("netns", "del", namespace)
            except (OSError, subprocess.SubprocessError):
                failed.append(namespace)
        self.created = failed
        return failed


# --------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------


@dataclass
class FlowerProcess:
    """One started process, its log and the processes it starts in turn."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    tree: ProcessTree

    def text(self) -> str:
        return _ANSI.sub("", self.log.read_text(errors="replace")) if self.log.exists() else ""

    def wait_for(self, pattern: str, timeout: float, since: int = 0) -> re.Match[str]:
        """Wait until ``pattern`` appears in the log after offset ``since``."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while True:
            self.tree.maybe_refresh()
            if match := regex.search(self.text(), since):
                return match
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.popen.returncode}) before /{pattern}/:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: no /{pattern}/ after {timeout:.0f}s:\n{self.tail()}")
            time.sleep(0.2)

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired as err:
            raise TimeoutError(f"{self.name} still running after {timeout:.0f}s:\n{self.tail()}") from err

    def running(self, program: str) -> list[int]:
        """Live processes below this one that run ``program`` (e.g. ``flwr-serverapp``), by pid.

        A console script runs as ``python /path/bin/<program> ...``: the program is
        the first or second word of its command line.
        """
        table = self.tree.refresh()
        below = ProcessTree._living(descendants(self.popen.pid, table), table)
        return sorted(pid for pid, _ in below if program in [Path(arg).name for arg in command_line(pid)[:2]])

    def crash(self) -> list[int]:
        """SIGKILL the process and all it started, as a power cut would; returns the pids."""
        table = self.tree.refresh()
        victims = sorted(ProcessTree._living({self.tree.root, *self.tree.known}, table))  # pid and start time
        for pid, _ in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.popen.wait(timeout=10)
        return [pid for pid, _ in victims]

    def stop(self, grace: float = 5.0) -> list[int]:
        """SIGTERM, then SIGKILL what is left after ``grace`` s; returns the pids that needed SIGKILL."""
        killed = self.tree.terminate(grace=grace, settle=3.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)
        return killed

    def tail(self, lines: int = 25) -> str:
        return "\n".join(self.text().splitlines()[-lines:])


@dataclass
class RunHandle:
    """A ``flwr run --stream`` in progress."""

    process: FlowerProcess
    run_id: int | None = None
    status: str | None = None
    details: str = ""

    @property
    def log(self) -> str:
        return self.process.text()


@dataclass
class Federation:
    """SuperLink, SuperNodes and an operator on a :class:`Topology`, with TLS and node auth.

    ``workdir`` receives the certificates, keys, one ``FLWR_HOME`` per host and
    one log per process.
    """

    topology: Topology
    workdir: Path
    processes: list[FlowerProcess] = field(default_factory=list)
    supernodes: dict[str, FlowerProcess] = field(default_factory=dict)
    superexecs: dict[str, FlowerProcess] = field(default_factory=dict)  # resident SuperExecs, by host
    node_ids: dict[str, int] = field(default_factory=dict)  # key name -> registered node id

    @property
    def certificates(self) -> Path:
        return self.workdir / "certificates"

    @property
    def keys(self) -> Path:
        return self.workdir / "keys"

    def home(self, host: str) -> Path:
        path = self.workdir / "homes" / host
        path.mkdir(parents=True, exist_ok=True)
        return path

    def env(self, host: str) -> dict[str, str]:
        return simulation_env(self.home(host))

    # -- credentials -------------------------------------------------------------------

    def make_credentials(self, key_names: Sequence[str]) -> None:
        """CA, SuperLink certificate (SANs: ``superlink`` and its address), and per name in
        ``key_names`` a node key pair and a Runtime API certificate (``<name>.crt``)."""
        superlink = self.topology.hosts["superlink"]
        runtime = [arg for name in key_names for arg in ("-s", name)]
        subprocess.run(
            [DEPLOY / "make-certificates.sh", "-o", self.certificates, "-n", "superlink", "-i", superlink.address]
            + runtime,
            check=True,
            capture_output=True,
            timeout=60,
        )
        subprocess.run(
            [DEPLOY / "make-supernode-keys.sh", "-o", self.keys, *key_names],
            check=True,
            capture_output=True,
            timeout=60,
        )

    # -- processes ---------------------------------------------------------------------

    def start(self, name: str, host: str, argv: Sequence[str]) -> FlowerProcess:
        """Start ``argv`` on ``host``, logged to ``logs/<name>.log`` (``<name>.2.log`` on a restart, ...)."""
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log, restarts = logs / f"{name}.log", 1
        while log.exists():
            restarts += 1
            log = logs / f"{name}.{restarts}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                self.topology.hosts[host].wrap(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env(host),
                start_new_session=True,
            )
        process = FlowerProcess(name, popen, log, ProcessTree(popen.pid, popen))
        self.processes.append(process)
        return process

    def start_superlink(self) -> FlowerProcess:
        """The federation's SuperLink: TLS, SuperNode authentication, ServerApps run by its own SuperExec."""
        superlink = self.start(
            "superlink",
            "superlink",
            self._superlink_argv(self.certificates, "superlink", self.topology.superlink_port)
            + ["--disable-runtime-dependency-installation"],
        )
        superlink.wait_for(r"Uvicorn running on https://", timeout=90)
        self._write_connection()
        return superlink

    def start_rogue_superlink(self, host: str, certificates: Path) -> FlowerProcess:
        """A second SuperLink on ``host`` serving ``certificates/server.crt``, at ``rogue_address(host)``.

        It runs no ServerApps (``--isolation process`` and no SuperExec): it only
        has to answer TLS handshakes, e.g. with a certificate issued for another host.
        """
        port = self.topology.runtime_ports[host]  # the port planned for this host's own listener
        rogue = self.start(
            f"rogue-superlink-{host}", host, [*self._superlink_argv(certificates, host, port), "--isolation", "process"]
        )
        rogue.wait_for(r"Uvicorn running on https://", timeout=90)
        return rogue

    def rogue_address(self, host: str) -> str:
        return f"{self.topology.hosts[host].address}:{self.topology.runtime_ports[host]}"

    def _superlink_argv(self, certificates: Path, host: str, port: int) -> list[str | Path | int]:
        return [
            "flower-superlink",
            "--ssl-ca-certfile",
            certificates / "ca.crt",
            "--ssl-certfile",
            certificates / "server.crt",
            "--ssl-keyfile",
            certificates / "server.key",
            "--enable-supernode-auth",
            "--host",
            self.topology.hosts[host].address,
            "--port",
            port,
        ]

    def _write_connection(self) -> None:
        """The operator's ``config.toml``: the SuperLink, trusted through the CA."""
        text = (
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "{self.topology.superlink_address}"\n'
            f'root-certificates = "{self.certificates / "ca.crt"}"\n'
        )
        (self.home("operator") / "config.toml").write_text(text)

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run the ``flwr`` CLI on the operator host."""
        return subprocess.run(
            self.topology.hosts["operator"].wrap(["flwr", *args]),
            capture_output=True,
            text=True,
            env=self.env("operator"),
            timeout=timeout,
            check=False,
        )

    def register(self, key_name: str) -> int:
        """``flwr supernode register <key>.pub``; returns the node id."""
        result = self.flwr("supernode", "register", str(self.keys / f"{key_name}.pub"), CONNECTION, "--format", "json")
        data = json.loads(result.stdout[result.stdout.find("{") :] or "{}")
        if not data.get("success"):
            raise RuntimeError(f"registering {key_name} failed: {result.stdout}{result.stderr}")
        self.node_ids[key_name] = int(data["node-id"])
        return self.node_ids[key_name]

    def node_states(self) -> dict[int, str]:
        """``flwr supernode list``: node id to status (registered, online, offline, ...)."""
        result = self.flwr("supernode", "list", CONNECTION, "--format", "json")
        data = json.loads(result.stdout[result.stdout.find("{") :] or "{}")
        return {int(node["node-id"]): str(node["status"]) for node in data.get("nodes", [])}

    def start_supernode(
        self,
        host: str,
        key_name: str | None,
        node_config: Mapping[str, int | str],
        *,
        trust_ca: bool = True,
        superlink: str | None = None,
        max_retries: int | None = None,
        resident: bool = False,
        prompt: bool = False,
    ) -> FlowerProcess:
        """A SuperNode on ``host``, by default the way every site runs one.

        That is: TLS to the SuperLink, verified with the federation's CA; its
        private key ``key_name``; its Runtime API (to its SuperExec and
        ClientApps, on 127.0.0.1) on TLS with the certificate made for
        ``host``. Variants: ``trust_ca=False`` leaves out the CA (the system's
        CAs verify); ``key_name=None`` starts it in plaintext (``--insecure``,
        no key: Flower refuses a key without TLS, and no Runtime API TLS);
        ``superlink`` points it at another address; ``max_retries`` makes it
        give up connecting after that many retries instead of trying forever;
        ``resident=True`` runs the node with ``--isolation process`` and a
        ``fedweigh-superexec`` beside it on the same host (one long-running
        ClientApp process, :mod:`fedweigh.flower.resident`), in
        ``self.superexecs[host]``; ``prompt=True`` runs ``fedweigh-supernode``
        (:mod:`fedweigh.flower.supernode`: the same SuperNode, asking for its next
        message without Flower's 3 s wait) instead of ``flower-supernode``.
        """
        program = "fedweigh-supernode" if prompt else "flower-supernode"
        argv: list[str | Path | int] = [program, "--superlink", superlink or self.topology.superlink_address]
        if key_name is None:
            argv += ["--insecure"]
        else:
            if trust_ca:
                argv += ["--root-certificates", self.certificates / "ca.crt"]
            argv += ["--auth-supernode-private-key", self.keys / key_name]
            runtime = self.certificates / host  # the Runtime API's certificate, key and CA
            argv += ["--ssl-certfile", f"{runtime}.crt", "--ssl-keyfile", f"{runtime}.key"]
            argv += ["--ssl-ca-certfile", self.certificates / "ca.crt"]
        if max_retries is not None:
            argv += ["--max-retries", max_retries]
        argv += [
            "--node-config",
            " ".join(f"{key}={value}" for key, value in node_config.items()),
            "--isolation",
            "process" if resident else "subprocess",
            "--port",
            self.topology.runtime_ports[host],
        ]
        process = self.start(host, host, argv)
        self.supernodes[host] = process
        if resident:
            superexec: list[str | Path | int] = ["fedweigh-superexec", "--runtime-api-address"]
            superexec += [f"127.0.0.1:{self.topology.runtime_ports[host]}"]
            superexec += ["--insecure"] if key_name is None else ["--root-certificates", self.certificates / "ca.crt"]
            self.superexecs[host] = self.start(f"{host}-superexec", host, superexec)
        return process

    # -- runs --------------------------------------------------------------------------

    def submit(self, run_config: Mapping[str, object], name: str) -> RunHandle:
        """``flwr run <repo> federation --run-config ... --stream`` from the operator host."""
        argv = [*FLWR_CLI, "run", REPO, CONNECTION, "--run-config", build_run_config_arg(run_config), "--stream"]
        process = self.start(f"run-{name}", "operator", argv)
        return RunHandle(process)

    def finish(self, run: RunHandle, timeout: float) -> RunHandle:
        """Wait for the stream to end, then ask the SuperLink for the run's final status."""
        run.process.wait_exit(timeout)
        run.run_id = next((rid for line in run.log.splitlines() if (rid := parse_run_id(line)) is not None), None)
        if run.run_id is None:
            raise RuntimeError(f"flwr run did not start a run:\n{run.process.tail()}")
        deadline = time.monotonic() + 60
        while True:
            result = self.flwr("ls", CONNECTION, "--run-id", str(run.run_id), "--format", "json")
            run.status, run.details = parse_run_status(result.stdout + result.stderr, run.run_id)
            if (run.status or "").startswith("finished") or time.monotonic() > deadline:
                return run
            time.sleep(1.0)

    def stop(self) -> list[str]:
        """Stop every process started here, newest first; returns what needed SIGKILL."""
        forced = []
        for process in reversed(self.processes):
            if killed := process.stop():
                forced.append(f"{process.name}: {killed}")
        return forced

    def leftovers(self) -> list[int]:
        """Pids of processes started here (or by them) that are still alive."""
        alive = []
        for process in self.processes:
            table = process.tree.refresh()
            alive += [pid for pid, _ in ProcessTree._living({process.tree.root, *process.tree.known}, table)]
        return sorted(alive)


@contextlib.contextmanager
def federation_on_hosts(supernodes: Sequence[str], workdir: Path, keys: Sequence[str]) -> Iterator[Federation]:
    """A :class:`Federation` with its SuperLink up: hosts for ``supernodes`` (namespaces where permitted,
    else loopback: ``topology.isolated`` says which), certificates and node keys for ``keys``.

    On exit every process is stopped and every namespace deleted; a process or
    namespace that outlives that raises :class:`RuntimeError`.
    """
    permitted, _ = namespaces_permitted()
    topology = plan_topology(supernodes, isolated=permitted, tag=secrets.token_hex(3))
    network = VirtualNetwork(topology)
    fed = Federation(topology, workdir)
    try:
        network.create()
        fed.make_credentials(keys)
        fed.start_superlink()
        yield fed
    finally:
        fed.stop()
        leftovers = fed.leftovers()
        undeleted = network.destroy()
        if leftovers or undeleted:
            raise RuntimeError(f"left behind: processes {leftovers}, namespaces {undeleted}")
