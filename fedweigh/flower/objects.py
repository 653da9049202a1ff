"""Prompt object pulls: Flower 1.41's retry of a message's content that is not stored yet starts at 0.05 s, not 1 s.

In a deployment a message travels in two parts: the message (its metadata and
the tree of its objects) and then each object's content, pushed one after the
other by the sender. A receiver that sees the message before its content is
all there (the SuperNode pulling a train instruction while the ServerApp is
still pushing the model; the ServerApp pulling a reply while the SuperNode is
still pushing it) asks for the missing object again after Flower's
``PULL_INITIAL_BACKOFF``, **1 s**, doubling to 10 s
(``flwr.supercore.inflatable.inflatable_utils.pull_objects``). So a round can
wait about a second on each way for content that arrived milliseconds after
the first look (``docs/benchmarks.md``, section 8).

:func:`install` makes the pulls of this process start retrying after
:data:`INITIAL_BACKOFF` s instead, doubling to Flower's own cap: the pulls of
the ServerApp's deployment grid (``flwr.superlink.grid.http_grid``) and of
the SuperNode's loop (``flwr.supernode.start_client_internal``), each of which
calls ``pull_objects`` by its module's name. Every other argument stays
Flower's (tries, time limit, cap), so a content that never comes fails as
it does with Flower, a few backoff steps later. ``fedweigh-superexec`` passes
the same first wait to its own pulls (:mod:`.resident`). Who installs it: the
ServerApp module (``fedweigh/server_app.py``) and ``fedweigh-supernode``
(:func:`.supernode.install`). Imports only Flower.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from . import supported

INITIAL_BACKOFF = 0.05
"""The first wait (s) before asking again for an object that is not stored yet (Flower 1.41: 1 s)."""
PULLERS = ("flwr.superlink.grid.http_grid", "flwr.supernode.start_client_internal")
"""The Flower modules whose ``pull_objects`` (looked up by name when called) :func:`install` replaces."""
UTILS_MODULE = "flwr.supercore.inflatable.inflatable_utils"


def prompt(pull_objects: Callable[..., dict[str, bytes]]) -> Callable[..., dict[str, bytes]]:
    """``pull_objects`` with :data:`INITIAL_BACKOFF` as its first wait unless the caller names one."""

    @functools.wraps(pull_objects)
    def pull_promptly(*args: Any, **kwargs: Any) -> dict[str, bytes]:
        kwargs.setdefault("initial_backoff", INITIAL_BACKOFF)
        return pull_objects(*args, **kwargs)

    pull_promptly.prompt = True  # type: ignore[attr-defined]
    return pull_promptly


def install() -> bool:
    """Make the object pulls of this process's ServerApp grid and SuperNode loop prompt (once); whether they are
    (only on a supported Flower)."""
    if not supported():
        return False
    flower = importlib.import_module(UTILS_MODULE).pull_objects
    for name in PULLERS:
        module = importlib.import_module(name)
        if not getattr(module.pull_objects, "prompt", False):
            module.pull_objects = prompt(flower)
    return True
