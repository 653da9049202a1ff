"""An exact log flush: a run's process reports how it ended once its last log lines are uploaded, not 1 s later.

On exit, Flower 1.41's ``flwr-simulation`` and ``flwr-serverapp`` processes
call ``flush_logs(log_queue)`` before they push the run's final status
(``PushTaskOutput``, which ends ``flwr run --stream``). Flower's flush waits,
in 0.2 s steps, until the uploader thread has taken the queued lines, and then
sleeps **1 s** "to allow the PushLogs call to complete"
(``flwr.supercore.logger.flush_logs``). Every run, simulated or deployed,
waits that second after its ServerApp has returned.

:func:`install` replaces the name ``flush_logs`` in those two modules
(:data:`EXITING_MODULES`, each of which looks it up by name when it exits) with
:func:`flush_by_stopping`: it puts Flower's own stop signal (``None``) behind
the queued lines and joins the uploader thread, which leaves its loop right
after the ``PushLogs`` call that carried the last of them has returned. So the
flush ends when every line queued before it is uploaded, and no later. The
uploader is found by its thread's name: a ``threading.Thread`` given a target
and no name is called ``Thread-N (<target's name>)`` (Python 3.10 and later),
and Flower's target is ``_log_uploader``. Where there is not exactly one such
thread alive, Flower's own flush runs.

What else changes: a line printed after the flush (between it and the
process's exit, where Flower prints only "Failed to push task output") is no
longer uploaded; Flower uploaded it after the final status, once ``flwr run
--stream`` had already ended. Who installs it: the ServerApp module
(``fedweigh/server_app.py``), which both processes import before they exit.
Imports only Flower and the standard library.
"""

from __future__ import annotations

import importlib
import sys
import threading
from queue import Queue

from . import supported

FLOWER_LOGGER = "flwr.supercore.logger"
"""Where Flower 1.41 defines ``flush_logs`` and the uploader thread's target, ``_log_uploader``."""
EXITING_MODULES = ("flwr.simulation.app", "flwr.superlink.runtime.run_serverapp")
"""The process entry points whose exit handler calls ``flush_logs`` by its module's name."""
UPLOADER_THREAD_SUFFIX = "(_log_uploader)"
"""How the name of Flower's uploader thread ends (``Thread-N (_log_uploader)``)."""


def uploader_threads() -> list[threading.Thread]:
    """The live threads running Flower's log uploader, found by their names."""
    return [t for t in threading.enumerate() if t.name.endswith(UPLOADER_THREAD_SUFFIX) and t.is_alive()]


def flush_by_stopping(log_queue: Queue[str | None], timeout: float = 3.0) -> bool:
    """Upload every line queued so far: stop the uploader behind them and wait (at most ``timeout`` s) until it has.

    Whether it has; Flower's ``flush_logs`` (same arguments) where there is not exactly one uploader thread.
    """
    threads = uploader_threads()
    if len(threads) != 1:
        return importlib.import_module(FLOWER_LOGGER).flush_logs(log_queue, timeout)
    log_queue.put(None)  # Flower's stop signal: the uploader pushes what it has taken, then leaves its loop
    threads[0].join(timeout)
    return not threads[0].is_alive()


flush_by_stopping.exact = True  # type: ignore[attr-defined]


def install() -> bool:
    """Make the exit of this process's ``flwr-simulation`` or ``flwr-serverapp`` entry point (whichever is loaded)
    flush its logs exactly; whether it is installed (only on a supported Flower)."""
    if not supported():
        return False
    for name in EXITING_MODULES:
        module = sys.modules.get(name)  # the process's own entry point is loaded; the other one is not imported
        if module is not None and not getattr(module.flush_logs, "exact", False):
            module.flush_logs = flush_by_stopping
    return True
