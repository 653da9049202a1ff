"""A simulation that attaches to an existing Ray cluster instead of starting its own.

The cluster: a head started with ``ray start --head`` and a second node
started with ``ray start --address <head>``, both on this machine, both with
``--block`` so that each node's processes stay below one pid we stop at the
end (``ray stop`` would stop every Ray on the machine, other people's too).

Flower 1.41's Ray backend calls ``ray.init()`` without an address, so the
``RAY_ADDRESS`` environment variable of the SuperLink (inherited by the
simulation process it starts) is what attaches it to the cluster.

Client resources: every virtual client asks for 1 CPU and half a GPU. The
head has no GPU and the second node declares one (Ray's GPUs are logical
resources, so no device is needed to schedule against it), so Flower's
actor pool holds exactly min(2 CPUs / 1, 1 GPU / 0.5) = 2 ClientApp actors,
all on the second node. A local Ray started by the simulation would have no
GPU at all and the run would fail with an empty actor pool.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO
from virtual_federation import free_port

from fedweigh.launch import LocalSimulation, ProcessTree, build_federation_config, simulation_env
from fedweigh.results import read_metrics

RAY = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"  # this interpreter's Ray
OBJECT_STORE_BYTES = 80_000_000  # per node; the default (30% of RAM) is far more than a test needs


class RayNode:
    """One ``ray start --block`` process: a Ray node whose processes all stay below it."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        with log.open("wb") as out:
            self.popen = subprocess.Popen(
                [RAY, "start", "--block", *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self.tree = ProcessTree(self.popen.pid, self.popen)
        self.titles: set[tuple[int, str]] = set()  # (pid, command line) of every process seen below it

    def wait_started(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while "Ray runtime started" not in self.log.read_text(errors="replace"):
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Ray node did not start:\n{self.log.read_text(errors='replace')}")
            time.sleep(0.2)

    def observe(self) -> None:
        """Remember the command lines of the processes now running below this node."""
        self.tree.refresh()
        for pid, _ in self.tree.known:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                continue
            self.titles.add((pid, cmdline))

    def actor_pids(self, name: str) -> set[int]:
        return {pid for pid, cmdline in self.titles if cmdline.startswith(f"ray::{name}")}

    def stop(self) -> list[int]:
        """SIGTERM ``ray start --block`` (it stops its node), then SIGKILL leftovers."""
        return self.tree.terminate(grace=15.0, settle=5.0)


class Watcher(threading.Thread):
    """Calls ``observe()`` on each node every half second until stopped."""

    def __init__(self, nodes: list[RayNode]) -> None:
        super().__init__(daemon=True)
        self.nodes = nodes
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            for node in self.nodes:
                node.observe()


def ports(*names: str) -> list[str]:
    """``--name <free port>`` for each name: this cluster shares no port with another Ray."""
    return [arg for name in names for arg in (f"--{name}", str(free_port()))]


@pytest.fixture(scope="module")
def ray_cluster():
    temp = Path(tempfile.mkdtemp(prefix="fwray", dir="/tmp"))  # short: Ray's socket paths are limited
    env = {**simulation_env(temp / "flwr"), "RAY_USAGE_STATS_ENABLED": "0"}
    port = free_port()
    common = ["--node-ip-address", "127.0.0.1", "--object-store-memory", str(OBJECT_STORE_BYTES)]
    common += ["--disable-usage-stats"]
    node_ports = ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port")
    node_ports += ("dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port")
    nodes: list[RayNode] = []
    try:
        head = RayNode(
            [
                "--head",
                "--port",
                str(port),
                "--num-cpus",
                "1",
                "--num-gpus",
                "0",
                "--include-dashboard",
                "false",
                "--temp-dir",
                str(temp / "ray"),
                *common,
                *ports(*node_ports, "ray-client-server-port"),
            ],
            temp / "head.log",
            env,
        )
        nodes.append(head)
        head.wait_started()
        worker = RayNode(
            ["--address", f"127.0.0.1:{port}", "--num-cpus", "2", "--num-gpus", "1", *common, *ports(*node_ports)],
            temp / "worker.log",
            env,
        )
        nodes.append(worker)
        worker.wait_started()
        yield {"address": f"127.0.0.1:{port}", "head": head, "worker": worker, "temp": temp}
    finally:
        for node in reversed(nodes):
            node.stop()
        alive = []
        for node in nodes:
            table = node.tree.refresh()
            alive += [pid for pid, _ in ProcessTree._living({node.tree.root, *node.tree.known}, table)]
        shutil.rmtree(temp, ignore_errors=True)
        assert not alive, f"Ray processes left behind: {alive}"


def test_documented_fractional_gpu_request_reaches_flower():
    config = build_federation_config(num_supernodes=100, cpus_per_client=2, gpus_per_client=0.25)
    assert config == "num-supernodes=100 client-resources-num-cpus=2 client-resources-num-gpus=0.25"
    with pytest.raises(ValueError, match="client-resources-num-gpus"):
        build_federation_config(gpus_per_client=-0.5)


def test_flower_packs_clients_per_gpu_as_documented(monkeypatch):
    """docs/deployment.md: 0.25 GPU per client puts 4 clients on each GPU."""
    import ray
    from flwr.simulation.ray_transport.ray_actor import pool_size_from_resources

    nodes = [{"Resources": {"CPU": 16.0, "GPU": 2.0}}, {"Resources": {"CPU": 4.0}}]  # a GPU box, a CPU box
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    assert pool_size_from_resources({"num_cpus": 2, "num_gpus": 0.25}) == 8  # 2 GPUs x 4; the CPU box hosts none
    assert pool_size_from_resources({"num_cpus": 2, "num_gpus": 0.0}) == 8 + 2  # CPU only: both boxes


def test_simulation_runs_on_the_second_node_of_an_existing_cluster(ray_cluster, tmp_path):
    head, worker = ray_cluster["head"], ray_cluster["worker"]
    simulation = LocalSimulation(REPO, port=free_port(), flwr_home=tmp_path / "flwr-home")
    simulation.env["RAY_ADDRESS"] = ray_cluster["address"]  # what attaches Flower to the cluster
    watcher = Watcher([head, worker])
    watcher.start()
    try:
        with simulation:
            outcome = simulation.run(
                {"strategy": "fedavg", "num-server-rounds": 2, "output-dir": str(tmp_path), "run-name": "ray"},
                num_supernodes=4,
                cpus_per_client=1,
                gpus_per_client=0.5,
                echo=False,
                log_path=tmp_path / "run.log",
            )
    finally:
        watcher.done.set()
        watcher.join()
    log = (tmp_path / "run.log").read_text()
    assert outcome.ok, f"{outcome.status} {outcome.details}\n{log[-3000:]}"
    assert [row["round"] for row in read_metrics(tmp_path / "ray")] == [1, 2]
    assert len(worker.actor_pids("ClientAppActor")) == 2  # min(2 CPUs / 1, 1 GPU / 0.5)
    assert head.actor_pids("ClientAppActor") == set()  # the head has no GPU to give
    logged = {int(pid) for pid in re.findall(r"ClientAppActor pid=(\d+)", log)}
    assert logged <= worker.actor_pids("ClientAppActor")


def test_shared_ray_cluster_serves_every_run_and_is_stopped_with_the_superlink(tmp_path):
    """The experiment runner's mode: one Ray head for all runs; each run still gets its own actors."""
    simulation = LocalSimulation(REPO, port=free_port(), flwr_home=tmp_path / "flwr-home", shared_ray=True)
    actors: dict[int, str] = {}  # pid -> command line of each ClientApp actor seen below the head
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.3):
            if simulation.ray is None or simulation.ray.tree is None:
                continue
            simulation.ray.tree.refresh()
            for pid, _ in simulation.ray.tree.known:
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if cmdline.startswith("ray::ClientAppActor"):
                    actors[pid] = cmdline

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    outcomes, per_run = [], []
    try:
        with simulation:
            head = simulation.ray
            assert head is not None and simulation.env["RAY_ADDRESS"] == head.address
            # Not recorded as the machine's current cluster: a later ray.init() without an address
            # (Flower's own per-run cluster) must not try to join it, running or stopped.
            current = Path("/tmp/ray/ray_current_cluster")
            assert not current.is_file() or f":{head.port}" not in current.read_text()
            head_tree = head.tree
            for index in range(2):
                before = set(actors)
                config = {"num-server-rounds": 1, "output-dir": str(tmp_path), "run-name": f"r{index}"}
                outcomes.append(
                    simulation.run(
                        config,
                        num_supernodes=2,
                        echo=False,
                        log_path=tmp_path / f"run{index}.log",
                    )
                )
                per_run.append(set(actors) - before)
    finally:
        stop.set()
        watcher.join()
    assert all(outcome.ok for outcome in outcomes), [(o.status, o.details) for o in outcomes]
    assert all(actors_of_run for actors_of_run in per_run), "every run's ClientApps ran on the shared cluster"
    assert not per_run[0] & per_run[1], "a run's actors are its own, never reused by the next run"
    assert simulation.ray is None and "RAY_ADDRESS" not in simulation.env
    alive = ProcessTree._living(head_tree.known, head_tree.refresh())
    assert not alive, f"the shared cluster left processes behind: {alive}"
