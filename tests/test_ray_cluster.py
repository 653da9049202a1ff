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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REPO

from fedweigh.launch.commands import build_federation_config, simulation_env
from fedweigh.launch.processes import ProcessTree, free_port, free_port_options
from fedweigh.launch.ray import NODE_PORTS, RayHead, RayNode
from fedweigh.launch.simulation import LocalSimulation
from fedweigh.results import read_metrics

OBJECT_STORE_BYTES = 80_000_000  # per node; the default (30% of RAM) is far more than a test needs


class Observer:
    """The command lines of every process seen below a Ray node."""

    def __init__(self, node: RayNode) -> None:
        self.node = node
        self.titles: set[tuple[int, str]] = set()  # (pid, command line)

    def observe(self) -> None:
        """Remember the command lines of the processes now running below the node."""
        tree = self.node.tree
        if tree is None:
            return
        tree.refresh()
        for pid, _ in tree.known:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                continue
            self.titles.add((pid, cmdline))

    def actor_pids(self, name: str) -> set[int]:
        return {pid for pid, cmdline in self.titles if cmdline.startswith(f"ray::{name}")}

    def raylet_worker_ports(self) -> list[tuple[str, str]]:
        """(min, max) worker port of each raylet seen below the node."""
        found = []
        for _, cmdline in self.titles:
            if "/raylet/raylet " in cmdline:
                low = re.search(r"--min_worker_port=(\d+)", cmdline)
                high = re.search(r"--max_worker_port=(\d+)", cmdline)
                found.append((low and low.group(1), high and high.group(1)))
        return found


class Watcher(threading.Thread):
    """Calls ``observe()`` on each observer every half second until stopped."""

    def __init__(self, observers: list[Observer]) -> None:
        super().__init__(daemon=True)
        self.observers = observers
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            for observer in self.observers:
                observer.observe()

    def stop(self) -> None:
        self.done.set()
        self.join()
        for observer in self.observers:
            observer.observe()


@pytest.fixture(scope="module")
def ray_cluster():
    temp = Path(tempfile.mkdtemp(prefix="fwray", dir="/tmp"))  # short: Ray's socket paths are limited
    env = {**simulation_env(temp / "flwr"), "RAY_USAGE_STATS_ENABLED": "0"}
    port = free_port()
    common = ["--node-ip-address", "127.0.0.1", "--object-store-memory", str(OBJECT_STORE_BYTES)]
    common += ["--disable-usage-stats"]
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
                *free_port_options(*NODE_PORTS, "ray-client-server-port"),
            ],
            temp / "head.log",
            env,
        )
        nodes.append(head)
        head.start()
        worker = RayNode(
            [
                "--address",
                f"127.0.0.1:{port}",
                "--num-cpus",
                "2",
                "--num-gpus",
                "1",
                *common,
                *free_port_options(*NODE_PORTS),
            ],
            temp / "worker.log",
            env,
        )
        nodes.append(worker)
        worker.start()
        yield {"address": f"127.0.0.1:{port}", "head": head, "worker": worker, "temp": temp}
    finally:
        trees = [node.tree for node in nodes if node.tree is not None]
        for node in reversed(nodes):
            node.stop()
        alive = []
        for tree in trees:
            alive += [pid for pid, _ in ProcessTree._living({tree.root, *tree.known}, tree.refresh())]
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


@pytest.mark.xdist_group("ray-cluster")
def test_simulation_runs_on_the_second_node_of_an_existing_cluster(ray_cluster, tmp_path):
    head, worker = ray_cluster["head"], ray_cluster["worker"]
    simulation = LocalSimulation(REPO, port=free_port(), flwr_home=tmp_path / "flwr-home")
    simulation.env["RAY_ADDRESS"] = ray_cluster["address"]  # what attaches Flower to the cluster
    on_head, on_worker = Observer(head), Observer(worker)
    watcher = Watcher([on_head, on_worker])
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
        watcher.stop()
    log = (tmp_path / "run.log").read_text()
    assert outcome.ok, f"{outcome.status} {outcome.details}\n{log[-3000:]}"
    assert [row["round"] for row in read_metrics(tmp_path / "ray")] == [1, 2]
    assert len(on_worker.actor_pids("ClientAppActor")) == 2  # min(2 CPUs / 1, 1 GPU / 0.5)
    assert on_head.actor_pids("ClientAppActor") == set()  # the head has no GPU to give
    logged = {int(pid) for pid in re.findall(r"ClientAppActor pid=(\d+)", log)}
    assert logged <= on_worker.actor_pids("ClientAppActor")
    # Two nodes on one machine: neither counts worker ports from Ray's 10002 (see the test below).
    assert on_head.raylet_worker_ports() == on_worker.raylet_worker_ports() == [("0", "0")]


@pytest.mark.xdist_group("simulation")
def test_shared_ray_cluster_serves_every_run(shared_simulation, tmp_path):
    """The experiment runner's mode: one Ray head for all runs; each run still gets its own actors.

    That the cluster is stopped with its SuperLink, leaving no process behind,
    is asserted when the suite's shared simulation is torn down (conftest).
    """
    simulation = shared_simulation
    head = simulation.ray
    assert head is not None and simulation.env["RAY_ADDRESS"] == head.address
    # Not recorded as the machine's current cluster: a later ray.init() without an address
    # (Flower's own per-run cluster) must not try to join it, running or stopped.
    current = Path("/tmp/ray/ray_current_cluster")
    assert not current.is_file() or f":{head.port}" not in current.read_text()
    outcomes, per_run = [], []
    on_head = Observer(head)
    watcher = Watcher([on_head])
    watcher.start()
    try:
        for index in range(2):
            before = on_head.actor_pids("ClientAppActor")
            config = {"num-server-rounds": 1, "output-dir": str(tmp_path), "run-name": f"r{index}"}
            outcomes.append(simulation.run(config, num_supernodes=2, echo=False, log_path=tmp_path / f"run{index}.log"))
            on_head.observe()
            per_run.append(on_head.actor_pids("ClientAppActor") - before)
    finally:
        watcher.stop()
    assert all(outcome.ok for outcome in outcomes), [(o.status, o.details) for o in outcomes]
    assert all(actors_of_run for actors_of_run in per_run), "every run's ClientApps ran on the shared cluster"
    assert on_head.raylet_worker_ports() == [("0", "0")], "the OS picks the workers' ports, as for ray.init()"
    assert not per_run[0] & per_run[1], "a run's actors are its own, never reused by the next run"


def test_a_stopped_simulation_forgets_its_shared_cluster(tmp_path):
    simulation = LocalSimulation(REPO, port=free_port(), flwr_home=tmp_path / "flwr-home", shared_ray=True)
    with simulation:
        head_tree = simulation.ray.tree
    assert simulation.ray is None and "RAY_ADDRESS" not in simulation.env
    alive = ProcessTree._living(head_tree.known, head_tree.refresh())
    assert not alive, f"the shared cluster left processes behind: {alive}"


DRIVER = """
import sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR")
print("tasks", sum(ray.get([ray.remote(lambda: 1).remote() for _ in range(2)])), flush=True)
"""


def test_two_shared_clusters_started_together_serve_a_driver_each(tmp_path):
    """Two experiments started at the same moment: two shared clusters, a run's driver on each at once.

    With ``ray start``'s default worker ports both clusters handed their first
    driver the same port and one driver died binding it (this test failed 3 of 3
    times on the project machine): in an experiment, a run failing with "No heartbeat
    received from the task" about a minute after it started.
    """
    env = simulation_env(tmp_path / "flwr")
    heads = [RayHead(env, tmp_path / f"ray{i}.log") for i in range(2)]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(RayHead.start, heads))
        drivers = [
            subprocess.Popen(
                [sys.executable, "-c", DRIVER, head.address],
                env=head.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for head in heads
        ]
        outputs = [driver.communicate(timeout=120)[0] for driver in drivers]
        results = [(driver.returncode, output) for driver, output in zip(drivers, outputs, strict=True)]
    finally:
        for head in heads:
            head.stop()
    for rc, output in results:
        assert rc == 0 and "tasks 2" in output, output[:3000]  # the cause comes first, the stack trace after
