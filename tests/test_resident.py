"""What ``fedweigh-superexec`` (:mod:`fedweigh.resident`) changes in Flower 1.41, checked against the installed Flower.

The resident ClientApp at work on a real deployment (two of the three sites of
``tests/test_deployment.py`` run it): every message of a site answered by one
process that imported the app once, and results equal to the same run in one
process, bit for bit, as those of the site that runs Flower's default
isolation.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types

import flwr
import pytest
from flwr.supercore.constant import ExecutorType

from fedweigh import resident


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
