"""What :mod:`fedweigh.flower.logs` changes in Flower 1.41 (the log flush on a run's exit), checked against Flower.

The first test pins what the change relies on and fails on an upgrade until
it is checked again; the others run Flower's own log uploader thread through
the installed flush. Its effect on a run's end: ``fedweigh benchmark overhead``
(docs/benchmarks.md).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
from queue import Queue

import flwr
import pytest

from fedweigh.flower import logs, supported

LOGGER = importlib.import_module(logs.FLOWER_LOGGER)


class RecordingClient:
    """Stands in for the Runtime API client: records each ``PushLogs`` call's lines once the call has returned."""

    def __init__(self) -> None:
        self.pushed: list[str] = []
        self.release = threading.Event()  # set: calls return; unset: a call waits for it (a push in flight)
        self.release.set()

    def PushLogs(self, request):  # noqa: N802 (Flower's name)
        self.release.wait(timeout=10)
        self.pushed.extend(request.logs)


def test_flower_sleeps_a_second_in_its_flush_and_both_exits_call_it_by_name_before_the_final_status():
    """Checked against Flower 1.41: ``flush_logs`` ends with a fixed sleep of up to 1 s; the uploader is a thread
    started with ``_log_uploader`` as its target and no name; each process's exit flushes, then pushes its status."""
    assert supported(), flwr.__version__
    assert "time.sleep(min(1, remaining))" in inspect.getsource(LOGGER.flush_logs)
    assert "target=_log_uploader" in inspect.getsource(LOGGER.start_log_uploader)
    assert "name=" not in inspect.getsource(LOGGER.start_log_uploader)
    for name in logs.EXITING_MODULES:
        source = inspect.getsource(importlib.import_module(name))
        flush = source.index("flush_logs(log_queue)")
        assert source.index("PushTaskOutput(", flush) > flush, name


def test_the_flush_returns_once_every_queued_line_is_pushed_and_the_uploader_has_stopped():
    queue: Queue[str | None] = Queue()
    client = RecordingClient()
    uploader = LOGGER.start_log_uploader(queue, 1, 2, client)
    assert logs.uploader_threads() == [uploader]
    client.release.clear()  # the uploader's push of the first line stays in flight
    queue.put("first\n")
    queue.put("second\n")
    done: list[bool] = []
    flusher = threading.Thread(target=lambda: done.append(logs.flush_by_stopping(queue)))
    flusher.start()
    flusher.join(timeout=0.3)
    assert flusher.is_alive() and client.pushed == []  # a flush does not end while a push is in flight
    client.release.set()
    flusher.join(timeout=5)
    assert done == [True]
    assert client.pushed == ["first\n", "second\n"]
    assert not uploader.is_alive() and logs.uploader_threads() == []
    LOGGER.stop_log_uploader(queue, uploader)  # what the exit calls next: returns at once


def test_without_exactly_one_uploader_flower_s_own_flush_runs(monkeypatch):
    calls: list[tuple[object, float]] = []
    monkeypatch.setattr(LOGGER, "flush_logs", lambda q, timeout=3.0: calls.append((q, timeout)) or True)
    queue: Queue[str | None] = Queue()
    assert logs.flush_by_stopping(queue, 2.0) is True
    assert calls == [(queue, 2.0)]
    assert queue.empty()  # no stop signal left for an uploader that is not there


@pytest.fixture
def exiting_modules(monkeypatch):
    """Both exit modules loaded, their ``flush_logs`` restored after the test."""
    modules = [importlib.import_module(name) for name in logs.EXITING_MODULES]
    for module in modules:
        monkeypatch.setattr(module, "flush_logs", module.flush_logs)
    return modules


def test_install_replaces_the_flush_of_the_loaded_exit_modules_once(exiting_modules):
    assert logs.install()
    assert [m.flush_logs for m in exiting_modules] == [logs.flush_by_stopping] * len(exiting_modules)
    assert logs.install()
    assert [m.flush_logs for m in exiting_modules] == [logs.flush_by_stopping] * len(exiting_modules)


def test_install_leaves_an_exit_module_that_is_not_loaded_unimported(monkeypatch):
    monkeypatch.delitem(sys.modules, logs.EXITING_MODULES[1], raising=False)
    assert logs.install()
    assert logs.EXITING_MODULES[1] not in sys.modules
