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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

# mallopt parameter numbers, from glibc's <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

# Blocks below this come from the heap, not from their own mapping (glibc's
# own ceiling for its adaptive threshold on 64-bit systems).
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
# Free memory at the top of the heap up to this stays with the process.
TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024

USER_ENV = {M_TRIM_THRESHOLD: "MALLOC_TRIM_THRESHOLD_", M_MMAP_THRESHOLD: "MALLOC_MMAP_THRESHOLD_"}


@functools.lru_cache(maxsize=1)
def keep_freed_memory() -> dict[str, int]:
    """Set glibc's trim and mmap thresholds once per process; returns what was set (name -> bytes)."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return {}
    libc = ctypes.CDLL(libc_name)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or not hasattr(libc, "gnu_get_libc_version"):
        return {}
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    applied: dict[str, int] = {}
    for param, value in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES), (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)):
        if USER_ENV[param] in os.environ:
            continue
        if mallopt(param, value) == 1:
            applied[USER_ENV[param]] = value
    return applied
