"""What :mod:`fedweigh.flower.objects` changes in Flower 1.41 (an object pull's first wait), checked against Flower.

The first test pins what the change relies on and fails on an upgrade until
it is checked again; the others run Flower's own ``pull_objects`` through the
installed change. Its effect on a deployed round: ``fedweigh benchmark
deployment`` (docs/benchmarks.md, section 8).
"""

from __future__ import annotations

import importlib
import inspect
import time

import flwr
import pytest
from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError

from fedweigh.flower import objects, supported

UTILS = importlib.import_module(objects.UTILS_MODULE)


def test_the_pullers_call_flower_s_pull_objects_by_their_module_s_name():
    """Checked against Flower 1.41: the first retry waits 1 s, and the ServerApp's deployment grid and the
    SuperNode's loop each look ``pull_objects`` up in their own module when they pull a message's content."""
    assert supported(), flwr.__version__
    assert importlib.import_module("flwr.supercore.constant").PULL_INITIAL_BACKOFF == 1
    assert inspect.signature(UTILS.pull_objects).parameters["initial_backoff"].default == 1
    for name in objects.PULLERS:
        module = importlib.import_module(name)
        assert module.pull_objects is UTILS.pull_objects or getattr(module.pull_objects, "prompt", False), name
        assert "pull_objects(" in inspect.getsource(module), name


@pytest.fixture
def installed(monkeypatch):
    """The change installed in this process, undone after the test."""
    for name in objects.PULLERS:
        module = importlib.import_module(name)
        monkeypatch.setattr(module, "pull_objects", module.pull_objects)
    assert objects.install()
    return [importlib.import_module(name).pull_objects for name in objects.PULLERS]


def test_a_content_stored_just_after_the_first_look_is_pulled_within_a_tenth_of_a_second(installed):
    def stored_after_the_first_look(looks: list[float]):
        def pull(object_id: str) -> bytes:
            looks.append(time.monotonic())
            if len(looks) == 1:
                raise ObjectUnavailableError(object_id)  # not stored yet at the first look
            return b"content"

        return pull

    for pull_objects in installed:
        looks: list[float] = []
        assert pull_objects(["a"], stored_after_the_first_look(looks), max_concurrent_pulls=1) == {"a": b"content"}
        assert len(looks) == 2 and looks[1] - looks[0] < 0.1 + 0.05  # Flower's first retry: after 0.8-1.2 s


def test_it_keeps_every_other_argument_of_flower_s_and_installs_once(installed):
    def never(object_id: str) -> bytes:
        raise ObjectUnavailableError(object_id)

    started = time.monotonic()
    with pytest.raises(UTILS.ObjectPullError):
        installed[0](["a"], never, max_tries_per_object=3, max_concurrent_pulls=1)  # Flower's limit on tries holds
    assert time.monotonic() - started < 0.5  # two retries: about 0.05 s and 0.1 s
    assert objects.install()
    assert [importlib.import_module(name).pull_objects for name in objects.PULLERS] == installed  # not wrapped twice
