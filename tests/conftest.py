"""Shared test fixtures: offline data, one torch thread, fake Flower messages."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATASETS = REPO.parent / "shared" / "datasets"

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HOME", str(REPO / ".cache" / "huggingface"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402  (after the environment above)
from flwr.app import ArrayRecord, Message, Metadata, MetricRecord, RecordDict  # noqa: E402
from flwr.app.message.message import make_message  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402

torch.set_num_threads(1)
# No wall-clock deadline on property tests: on a loaded 2-core machine one example took 313 ms against the
# default 200 ms and failed a correct test (a timing, not a property).
hypothesis_settings.register_profile("fedweigh", deadline=None)
hypothesis_settings.load_profile("fedweigh")
# Messages built outside a running ServerApp take their sender from here.
TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


@pytest.fixture(autouse=True)
def task_identity():
    """Every test starts with this process's task identity set (messages take their sender from it): a test
    that runs a ClientApp or the engine may leave it cleared or changed."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


def reply(node_id: int, arrays: Mapping[str, np.ndarray] | None, metrics: Mapping, error: str | None = None) -> Message:
    """A training reply as the server would receive it from ``node_id``."""
    metadata = Metadata(
        run_id=1,
        message_id=f"m{node_id}",
        src_node_id=node_id,
        dst_node_id=0,
        reply_to_message_id="",
        group_id="",
        created_at=time.time(),
        ttl=3600,
        message_type="train",
    )
    if error is not None:
        from flwr.app import Error

        return make_message(metadata=metadata, error=Error(code=0, reason=error))
    content = RecordDict({"metrics": MetricRecord(dict(metrics))})
    if arrays is not None:
        content["arrays"] = _named(arrays)
    return make_message(metadata=metadata, content=content)


def _named(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    from flwr.app import Array

    return ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})


class Clock:
    """A fake clock for grids that wait: ``clock()`` reads it, ``clock.sleep(s)`` moves it on at once."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class OfflineGrid(Grid):
    """A Grid outside any run: the calls no test grid needs."""

    def set_run(self, run) -> None:  # pragma: no cover - unused
        pass

    @property
    def run(self):  # pragma: no cover - unused
        return None

    def create_message(self, *args, **kwargs):  # pragma: no cover - unused
        raise NotImplementedError


class FakeGrid(OfflineGrid):
    """A Grid whose nodes answer ``query`` with their partition id.

    ``partitions`` maps node id to partition id. Train messages are answered
    by ``train_handler(message) -> Message`` when given.
    """

    def __init__(self, partitions: Mapping[int, int], train_handler=None) -> None:
        self.partitions = dict(partitions)
        self.train_handler = train_handler
        self.sent: list[Message] = []

    def get_node_ids(self) -> Iterable[int]:
        return list(self.partitions)

    def push_messages(self, messages):  # pragma: no cover - unused
        raise NotImplementedError

    def pull_messages(self, message_ids):  # pragma: no cover - unused
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for message in messages:
            self.sent.append(message)
            node = message.metadata.dst_node_id
            if message.metadata.message_type == "query":
                metrics = {"partition-id": self.partitions[node], "num-partitions": len(self.partitions)}
                replies.append(reply(node, None, metrics))
            elif self.train_handler is not None:
                replies.append(self.train_handler(message))
        return replies


@pytest.fixture
def fake_grid():
    return FakeGrid


@pytest.fixture(scope="session")
def shared_simulation(tmp_path_factory):
    """One local simulation SuperLink with one Ray cluster, for every real ``flwr run`` of the suite.

    The experiment runner's mode (``shared_ray=True``): each run still gets its
    own ClientApp actors; only Ray's start and stop are saved. At the end
    every process of the SuperLink and of the cluster must be gone.
    """
    from fedweigh.launch.processes import ProcessTree, free_port
    from fedweigh.launch.simulation import LocalSimulation

    home = tmp_path_factory.mktemp("flwr-home")
    with (home / "launcher.log").open("a") as log:
        simulation = LocalSimulation(
            REPO, port=free_port(), connection="fedweigh-tests", flwr_home=home, shared_ray=True, out=log
        )
        simulation.start()
        trees = [tree for tree in (simulation.tree, simulation.ray and simulation.ray.tree) if tree is not None]
        try:
            yield simulation
        finally:
            simulation.stop()
            alive = [pid for tree in trees for pid, _ in ProcessTree._living({tree.root, *tree.known}, tree.refresh())]
            assert not alive, f"the shared simulation left processes behind: {alive}"


# Each strategy of fedweigh.methods on digits, with the options it needs (the server's own data) and those that
# give it server state to carry across rounds (FedOUI's window, a small Feddle atlas, FedBuff's buffer, Center's
# optimizer), in runs short enough to repeat: test_resume.py and test_determinism.py compare runs of these.
SERVER_DATA = {"server-data": "id", "server-data-size": 60}
STRATEGY_OPTIONS: dict[str, dict[str, object]] = {
    "fedoui": {"fedoui.window": 3},
    "feddle": {**SERVER_DATA, "feddle.search-epochs": 1, "feddle.atlas-size": 3},
    "fedbuff": {"fedbuff.buffer-size": 3},  # 2 updates a round: a step in rounds 2 and 3, one update left after 2
    "center": {**SERVER_DATA, "center.epochs": 3},
    "fedft": SERVER_DATA,
}
QUICK_RUN = {"num-server-rounds": 3, "fraction-train": 0.5, "local-epochs": 1, "seed": 3}


@pytest.fixture(scope="session")
def in_process_runs(tmp_path_factory):
    """``run(name, config, num_nodes=4, node_seed=0) -> folder``: an in-process run (``loopback``), once per session.

    Test modules comparing runs (a resumed run with an uninterrupted one, two runs of one seed) share the
    uninterrupted runs through it; asking again for a name returns the first run's folder, and asking for a
    name with another config or federation is an error.
    """
    from loopback import run_in_process

    folder = tmp_path_factory.mktemp("shared-runs")
    done: dict[str, tuple[str, Path]] = {}

    def run(name: str, config: Mapping, num_nodes: int = 4, node_seed: int = 0) -> Path:
        key = repr((sorted(config.items()), num_nodes, node_seed))
        if name not in done:
            overrides = {**config, "output-dir": str(folder), "run-name": name}
            done[name] = (key, run_in_process(overrides, num_nodes=num_nodes, node_seed=node_seed))
        assert done[name][0] == key, f"run {name!r} was run with another config"
        return done[name][1]

    return run


GROUPS_LOST = pytest.StashKey[str]()


# What each test does, as a marker (`pytest -m unit` runs in about a minute on 2 cores; pyproject.toml names
# them): a test marked in its module keeps its marker; the others take their module's kind below, or `unit`.
KINDS = ("unit", "sim", "deploy", "containers")
SIM_MODULES = {
    # federated runs, in process (loopback) or through Flower, and whole pipelines on real data
    "test_simulation",
    "test_end_to_end",
    "test_determinism",
    "test_resume",
    "test_faults",
    "test_tracking",
    "test_asynchrony",
    "test_robust",
    "test_example",
    "test_experiments",
    "test_benchmarks",
    "test_gpu_evidence",
    "test_pretrained",
    "test_fuzz",
    "test_server_app",
    "test_paper_metrics",
    "test_fedma",
    "test_flower_walk",
    "test_site_data",
    "test_paired_report",
    "test_fednolowe_partition",
    "test_fedoui_repro",
    "test_partition_edits",
    "test_client_app",
    "test_node_departure",
}
DEPLOY_MODULES = {"test_deployment", "test_ray_cluster", "test_port_claim"}  # SuperLinks, SuperNodes, Ray as processes
SIM_DOCTESTS = {"fedweigh.models.vit", "fedweigh.tracking", "fedweigh.models.resnet"}  # download-sized models, MLflow


def kind_of(item) -> str:
    """The marker a collected test runs under (see :data:`KINDS`)."""
    own = [kind for kind in KINDS if item.get_closest_marker(kind)]
    if own:
        return own[0]
    module = item.nodeid.split("::")[0].removesuffix(".py").replace("/", ".")  # tests.test_x, fedweigh.models.vit
    if module.rsplit(".", 1)[-1] in SIM_MODULES or module in SIM_DOCTESTS:
        return "sim"
    if module.rsplit(".", 1)[-1] in DEPLOY_MODULES:
        return "deploy"
    return "unit"


class KindMarkers:
    """Marks every collected test with its kind, before ``-m`` selects (a plugin: its hook runs first)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            kind = kind_of(item)
            if not item.get_closest_marker(kind):
                item.add_marker(getattr(pytest.mark, kind))


def pytest_configure(config) -> None:
    config.pluginmanager.register(KindMarkers(), "fedweigh-test-kinds")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Notice when ``--dist loadgroup`` would not keep an ``xdist_group`` together.

    The deployment tests and the shared simulation are sequences on one
    worker's processes (a reference run, then a crash compared with it). On
    each worker, pytest-xdist marks a grouped test by adding ``@<group>`` to its
    node id; when a pytest release stops honouring that (pytest 9.2 with
    pytest-xdist 3.8 did), the groups are spread over the workers and those
    sequences would fail in confusing ways. Every grouped test then fails at
    once with the reason instead (:func:`pytest_runtest_setup`).
    """
    if not getattr(config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        config.stash[GROUPS_LOST] = (
            f"--dist loadgroup: pytest-xdist could not tag {len(lost)} grouped tests with their group, so it spreads "
            "each group over the workers; use a pytest and pytest-xdist pair that work together (see the dev extra "
            "in pyproject.toml)"
        )


def pytest_runtest_setup(item) -> None:
    if GROUPS_LOST in item.config.stash and item.get_closest_marker("xdist_group"):
        pytest.fail(item.config.stash[GROUPS_LOST], pytrace=False)
