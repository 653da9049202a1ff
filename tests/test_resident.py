"""A long-running ClientApp per SuperNode (``fedweigh-superexec``, :mod:`fedweigh.resident`) on a real deployment.

Two SuperNodes, each on its own host (network namespaces where permitted,
else loopback) with TLS and node authentication as in ``test_deployment``,
run with ``--isolation process`` and a ``fedweigh-superexec`` beside each.
The same run then goes again on the same nodes restarted with Flower's
default isolation (a ``flwr-clientapp`` process per message): the two runs
must end with the same metrics and the same model, bit for bit, and in the
resident run every message of a node was answered by one and the same
process, which imported the app once.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import types
from pathlib import Path

import flwr
import pytest
import torch
from flwr.supercore.constant import ExecutorType

from fedweigh import resident
from fedweigh.launch.virtual_federation import Federation, federation_on_hosts
from fedweigh.results import read_metrics, without_timing

NODES = ["resident-1", "resident-2"]
RUN = {"strategy": "fedavg", "dataset": "digits", "seed": 4, "fraction-train": 1.0, "min-train-nodes": 2}
TASK_DONE = re.compile(r"\[fedweigh\] resident ClientApp task \d+ \((\w+)\) done in [0-9.]+s in process (\d+)")

pytestmark = pytest.mark.xdist_group("resident")


def test_it_replaces_only_flower_s_executor_and_keeps_flower_s_loop(monkeypatch):
    """Checked against Flower 1.41: the loop looks up get_executor when it starts, and reads the poll setting."""
    runner = importlib.import_module(resident.RUNNER_MODULE)
    assert flwr.__version__.startswith(resident.SUPPORTED_FLOWER), flwr.__version__
    assert "executor = get_executor(" in inspect.getsource(runner.run_superexec)
    assert runner._TASK_POLL_INTERVAL_ENV == resident.TASK_POLL_ENV
    source = inspect.getsource(importlib.import_module("flwr.supernode.runtime.run_clientapp").run_clientapp)
    for step in ("pull_task_input(client)", "push_message(client, reply_message, context)", "HeartbeatSender("):
        assert step in source  # what run_task does, as flwr-clientapp does it
    monkeypatch.setattr(runner, "get_executor", runner.get_executor)  # put back after the test
    executor = resident.install()
    assert runner.get_executor(ExecutorType.SUBPROCESS, None) is executor
    with pytest.raises(ValueError, match="--executor subprocess only"):
        runner.get_executor(ExecutorType.KUBERNETES, {"namespace": "n"})


def test_the_fab_s_packages_are_imported_afresh(tmp_path, monkeypatch):
    (tmp_path / "siteapp").mkdir()
    (tmp_path / "siteapp" / "__init__.py").write_text("")
    (tmp_path / "helper.py").write_text("")
    (tmp_path / "data").mkdir()  # not a package
    assert resident.app_packages(tmp_path) == {"siteapp", "helper"}
    for name in ("siteapp", "siteapp.client", "helper", "siteapplication"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    assert sorted(resident.forget_modules({"siteapp", "helper"})) == ["helper", "siteapp", "siteapp.client"]
    assert "siteapplication" in sys.modules  # a name that only starts like one stays


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    with federation_on_hosts(NODES, tmp_path_factory.mktemp("resident"), NODES) as fed:
        for name in NODES:
            fed.register(name)
        yield fed


def start_nodes(fed: Federation, resident: bool) -> None:
    for index, name in enumerate(NODES):
        fed.start_supernode(name, name, {"partition-id": index, "num-partitions": len(NODES)}, resident=resident)
    for name in NODES:
        fed.supernodes[name].wait_for(r"SuperNode ID: \d+", timeout=180)


def run_to_completion(fed: Federation, output: Path, name: str) -> Path:
    config = {**RUN, "num-server-rounds": 2, "output-dir": str(output), "run-name": name}
    run = fed.finish(fed.submit(config, name), timeout=480)
    assert run.status == "finished:completed", f"{run.status} {run.details}\n{run.process.tail(40)}"
    return output / name


def test_a_resident_clientapp_gives_the_run_flower_s_own_isolation_gives(federation, tmp_path):
    start_nodes(federation, resident=True)
    resident = run_to_completion(federation, tmp_path, "resident")
    for name in NODES:
        superexec = federation.superexecs[name]
        log = superexec.text()
        tasks = TASK_DONE.findall(log)
        # every message of the run (the partition query, then one train per round), all in one process
        assert [kind for kind, _ in tasks] == ["query", "train", "train"], log[-3000:]
        assert {int(pid) for _, pid in tasks} == {superexec.popen.pid}
        assert log.count("resident ClientApp of FAB") == 1  # the app imported once
        assert superexec.running("flwr-clientapp") == []
    for name in NODES:  # the same nodes, Flower's default: a flwr-clientapp process per message
        federation.superexecs.pop(name).stop()
        federation.supernodes.pop(name).stop()
    start_nodes(federation, resident=False)
    default = run_to_completion(federation, tmp_path, "default")

    assert [without_timing(row) for row in read_metrics(resident)] == [
        without_timing(row) for row in read_metrics(default)
    ]
    first, second = (torch.load(folder / "model.pt", weights_only=True) for folder in (resident, default))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
