"""Every change fedweigh makes to Flower's internals, in one place, for one Flower version.

Flower's public API (``flwr.app``, ``flwr.serverapp``, ``flwr.clientapp``)
is all the rest of fedweigh uses. Where a fixed wait or a process per
message in Flower 1.41 costs a run most of its time, the modules here change
Flower's own code, each for :data:`SUPPORTED_FLOWER` only, each installed by
an explicit call (never by ``import fedweigh``), each pinned by tests that
fail on a Flower release until the change is checked against it:

================  ==========================================================  ================================
module            what changes, and what installs it                          pinned by
================  ==========================================================  ================================
:mod:`.engine`    the simulation engine's message hand-off (event-driven)     ``tests/test_flower_engine.py``
                  and the in-process backend; ``prepare_if_simulating()``,
                  called by the ServerApp and ClientApp modules
:mod:`.resident`  ``fedweigh-superexec``: a SuperExec that runs ClientApp     ``tests/test_flower_resident.py``
                  tasks in its own process; ``install()``
:mod:`.supernode` ``fedweigh-supernode``: a SuperNode without the fixed 3 s   ``tests/test_flower_supernode.py``
                  wait; ``install()``
:mod:`.objects`   a message's content not stored yet is asked for again       ``tests/test_flower_objects.py``
                  after 0.05 s, not 1 s; ``install()``, called by the
                  ServerApp module and ``fedweigh-supernode``
:mod:`.walk`      the ``flwr`` CLI's file walk when it builds a FAB;          ``tests/test_flower_walk.py``
                  ``install()``, called by ``fedweigh.launch.flwr_cli``
:mod:`.logs`      a run's process pushes its final status once its last log   ``tests/test_flower_logs.py``
                  lines are uploaded, not after a fixed 1 s; ``install()``,
                  called by the ServerApp module
================  ==========================================================  ================================

With another Flower version each change stays out: the engine (saying so in
the run's log), the object pulls, the log flush and the CLI walk leave Flower as it is;
``fedweigh-superexec`` and ``fedweigh-supernode`` refuse to start and name
Flower's own process to use instead.

This package imports only Flower and the standard library (the container
image carries it alone, as ``/app/bin/fedweigh_flower``), except
:mod:`.engine`, which reads the run config's simulation settings.
"""

from __future__ import annotations

SUPPORTED_FLOWER = "1.41."
"""The Flower versions (a prefix) every change in this package was checked against."""


def supported(version: str | None = None) -> bool:
    """Whether Flower ``version`` (default: the installed one) is one these changes were checked against.

    >>> supported("1.41.0"), supported("1.42.0")
    (True, False)
    """
    if version is None:
        import flwr

        version = flwr.__version__
    return version.startswith(SUPPORTED_FLOWER)


def unsupported(program: str, instead: str) -> str:
    """Why ``program`` refuses to run on the installed Flower, and what to run ``instead``."""
    import flwr

    return (
        f"{program} was checked against flwr {SUPPORTED_FLOWER}x, this is flwr {flwr.__version__}: use {instead} "
        "until fedweigh/flower/ is checked against it"
    )
