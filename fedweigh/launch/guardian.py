"""The guardian of a service fedweigh starts: it stops the service's process tree if fedweigh dies first.

``fedweigh simulate`` (and the experiment runner, the benchmarks) start a
SuperLink, which starts a SuperExec, a simulation process per run and Ray;
they stop all of it when they end, Ctrl-C and ``kill`` included. Killed with
SIGKILL they cannot: the SuperLink and everything below it ran on, holding
the port and the CPUs. So each such service gets a guardian, a small process
of its own session started with it (:class:`fedweigh.launch.processes.Guardian`),
which holds one end of a pipe whose other end only the launcher holds. The
kernel closes the launcher's end when the launcher dies, however it dies;
the guardian then stops the service's whole tree as the launcher would have
(:meth:`~fedweigh.launch.processes.ProcessTree.terminate`). While it waits, it
looks at the tree once a second, so that processes which leave it (Ray's
agents, re-parented to init) are stopped too. A launcher that stops the
service itself, or leaves it running on purpose, says ``release`` first, and
the guardian exits without touching anything.

Usage (by :class:`~fedweigh.launch.processes.Guardian`)::

    python -m fedweigh.launch.guardian <pid of the service>    # commands on stdin
"""

from __future__ import annotations

import select
import sys
from typing import BinaryIO

from fedweigh.launch.processes import GUARDIAN_RELEASE, ProcessTree

LOOK_EVERY = 1.0
"""Seconds between two looks at the service's process tree while the launcher lives."""


def watch(root: int, commands: BinaryIO, look_every: float = LOOK_EVERY) -> bool:
    """Wait for ``release`` or the end of ``commands``; on the end, stop ``root``'s tree. True if it did."""
    tree = ProcessTree(root)
    while True:
        ready, _, _ = select.select([commands], [], [], look_every)
        if not ready:
            tree.refresh()
            continue
        line = commands.readline()
        if line.strip() == GUARDIAN_RELEASE:
            return False
        if not line:  # the launcher is gone
            tree.terminate()
            return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        print("usage: python -m fedweigh.launch.guardian <pid>", file=sys.stderr)
        return 2
    watch(int(args[0]), sys.stdin.buffer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
