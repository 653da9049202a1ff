"""Ray nodes that fedweigh starts: a shared local cluster, or a node of one.

Flower's simulation engine runs the ClientApps as Ray actors; by default each
``flwr run`` starts and stops a Ray cluster of its own. :class:`RayHead`
starts one cluster for many runs (``RAY_ADDRESS``), :class:`RayNode` any node.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from fedweigh.launch.commands import executable
from fedweigh.launch.processes import Guardian, ProcessTree, free_port, free_port_options, spawn_logged, tail
from fedweigh.launch.runconfig import SimulationError

NODE_PORTS = ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port")
NODE_PORTS += ("dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port")
"""The ``ray start`` port options of a node's own listeners; two nodes on one machine need each its own."""

WORKER_PORTS_FROM_OS = ("--min-worker-port", "0", "--max-worker-port", "0")
"""Every worker's and driver's port chosen by the OS, as ``ray.init()`` does.

``ray start`` hands its workers (the ClientApp actors) and drivers (a run's
``flwr-simulation``) ports from 10002 up by default, each node counting on its
own. Two nodes on one machine, such as the clusters of two experiments started
together, then give the same port to two processes at once; the second to bind
it dies ("Failed to start the grpc server ... Address already in use"), and a
run whose driver dies so fails with "No heartbeat received from the task".
"""


class RayNode:
    """One Ray node run by ``ray start --block <argv>``; all its processes stay below that one.

    :meth:`start` returns once the node is up; :meth:`stop` terminates it
    (``ray start --block`` stops its node on SIGTERM) and SIGKILLs leftovers.
    Unless ``argv`` chooses the worker ports, the OS does
    (:data:`WORKER_PORTS_FROM_OS`).
    """

    STARTED = "Ray runtime started"

    def __init__(self, argv: list[str], log_path: Path, env: Mapping[str, str], startup_timeout: float = 120.0) -> None:
        chosen = any(arg.split("=")[0] in ("--min-worker-port", "--worker-port-list") for arg in argv)
        self.argv = list(argv) if chosen else [*argv, *WORKER_PORTS_FROM_OS]
        self.log_path = log_path
        self.env = {**env, "RAY_USAGE_STATS_ENABLED": "0"}
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.tree: ProcessTree | None = None
        self.guardian: Guardian | None = None
        self.startup_seconds: float | None = None

    def start(self) -> None:
        t0 = self._started_at = time.monotonic()
        with self.log_path.open("wb") as log:
            self.process = spawn_logged([executable("ray"), "start", "--block", *self.argv], log, self.env)
        self.tree = ProcessTree(self.process.pid, self.process)
        self.guardian = Guardian(self.process.pid)  # stops the node should this process die first
        while self.STARTED not in self.log_path.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() - t0 > self.startup_timeout:
                self.stop()
                log = tail(self.log_path)
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
        if self.guardian is not None:
            self.guardian.release()
        self.process, self.tree, self.guardian = None, None, None
        return killed


class RayHead(RayNode):
    """A local Ray cluster (a head node, and more nodes if asked) shared by the runs of one SuperLink.

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

    With ``nodes`` > 1 the cluster has that many nodes on this machine, the
    machine's CPUs divided among them (the benchmarks' two-node cluster: the
    scheduling, object transfers and per-node processes of a real cluster,
    without a second host).
    """

    def __init__(self, env: Mapping[str, str], log_path: Path, startup_timeout: float = 120.0, nodes: int = 1) -> None:
        if nodes < 1:
            raise ValueError(f"a Ray cluster needs at least one node, got nodes = {nodes}")
        self.port = free_port()
        # Short: Ray's socket paths live below it and must fit in 107 bytes.
        self.temp_dir = Path(tempfile.mkdtemp(prefix=f"fwray{self.port}-", dir="/tmp"))
        argv = ["--head", "--node-ip-address", "127.0.0.1", "--port", str(self.port)]
        argv += ["--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", str(self.temp_dir)]
        argv += free_port_options("dashboard-agent-listen-port", "ray-client-server-port", "metrics-export-port")
        self.cpus_per_node = max(1, (os.cpu_count() or 1) // nodes) if nodes > 1 else None
        if self.cpus_per_node is not None:
            argv += ["--num-cpus", str(self.cpus_per_node)]
        super().__init__(argv, log_path, env, startup_timeout)
        self.workers = [
            RayNode(
                [
                    "--address",
                    self.address,
                    "--node-ip-address",
                    "127.0.0.1",
                    "--num-cpus",
                    str(self.cpus_per_node),
                    "--disable-usage-stats",
                    *free_port_options(*NODE_PORTS),
                ],
                log_path.with_name(f"{log_path.stem}-node{i}{log_path.suffix}"),
                env,
                startup_timeout,
            )
            for i in range(1, nodes)
        ]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def root_pids(self) -> list[int]:
        """The pid every process of each node runs below (head first)."""
        return [node.process.pid for node in (self, *self.workers) if node.process is not None]

    def start(self) -> None:
        super().start()
        try:
            for worker in self.workers:
                worker.start()
        except SimulationError:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - self._started_at

    def stop(self) -> list[int]:
        killed = [pid for worker in reversed(self.workers) for pid in worker.stop()]
        killed += super().stop()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return killed
