"""Keep freed memory in the process for the next training step (glibc's malloc).

A training step allocates and frees the same activation and gradient buffers
every batch. glibc's malloc adapts its thresholds to what the process freed
before, so whether it reuses those pages or hands them back to the kernel and
faults them in again at the next step depends on the process's history: in
`fedweigh benchmark allocator` the same 20 rounds of FedOUI's CIFAR-10
training caused 1.5 million page faults a pass in a fresh plain process and
0.8 million in a Ray worker, and took 26 % and 18 % less time once the
thresholds were fixed (docs/benchmarks.md, "Allocator").

Only glibc has these knobs; elsewhere (macOS, musl) this does nothing. A user
who sets glibc's own ``MALLOC_TRIM_THRESHOLD_`` or ``MALLOC_MMAP_THRESHOLD_``
keeps their values.

Threads are the other half. A thread other than the main one allocates from
an arena of its own (heaps of at most 64 MiB), and there the thresholds above
did not keep an evaluation's freed memory: the same evaluation caused twice
the page faults in such a thread as in the main thread and took 26 % longer
(`fedweigh benchmark allocator`, its thread cases). Flower runs the ServerApp
in such a thread of the simulation process (and the in-process backend runs
the ClientApp in one), so its central evaluation, whose activations at a
batch of 256 are tens of MiB, ran 30-56 % slower than the bare loop's. ``MALLOC_ARENA_MAX=1`` (:data:`PROCESS_ENV`)
makes every thread allocate from the main heap, which keeps its freed memory;
glibc reads it when a process starts, so fedweigh's launchers put it in the
environment of the processes they start (the SuperLink, and through it the
simulation and the apps), and the container image sets it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

# (mallopt parameter number from glibc's <malloc.h>, glibc's own environment variable for it, the value set)
THRESHOLDS = (
    # Blocks below this come from the heap, not from their own mapping (glibc's own ceiling for its adaptive
    # threshold on 64-bit systems).
    (-3, "MALLOC_MMAP_THRESHOLD_", 32 * 2**20),
    # Free memory at the top of the heap up to this stays with the process.
    (-1, "MALLOC_TRIM_THRESHOLD_", 256 * 2**20),
)


PROCESS_ENV = {"MALLOC_ARENA_MAX": "1"}
"""Environment for the processes fedweigh starts, unless already set: one malloc arena for all threads."""


@functools.lru_cache(maxsize=1)
def keep_freed_memory() -> dict[str, int]:
    """Set glibc's mmap and trim thresholds once per process; returns what was set (variable name -> bytes)."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return {}
    libc = ctypes.CDLL(libc_name)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or not hasattr(libc, "gnu_get_libc_version"):
        return {}
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return {
        name: value
        for param, name, value in THRESHOLDS
        if name not in os.environ and mallopt(param, value) == 1  # a value the user set is kept
    }
