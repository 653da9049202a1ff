"""glibc keeps freed training buffers in the process once keep_freed_memory ran (fresh processes)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from fedweigh.allocator import THRESHOLDS

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only"
)

# Allocate, touch and free an 8 MiB buffer in a fresh process; report how much of it the process keeps.
PROBE = """
import json, os, sys
import numpy as np
from fedweigh.allocator import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else {}
page = os.sysconf("SC_PAGE_SIZE")
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * page
before = rss()
buffer = np.ones(8 * 2**20 // 8)
del buffer
print(json.dumps({"kept_bytes": rss() - before, "applied": applied}))
"""


def probe(mode: str, env: dict[str, str] | None = None) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout)


@pytest.mark.sim
def test_freed_memory_stays_with_the_process_only_when_kept():
    default, kept = probe("default"), probe("keep")
    assert default["kept_bytes"] < 2**20  # glibc's default: an 8 MiB block is its own mapping, given back
    assert kept["kept_bytes"] >= 7 * 2**20  # kept: the block came from the heap and stays for reuse
    assert (
        kept["applied"]
        == {
            "MALLOC_MMAP_THRESHOLD_": 32 * 2**20,
            "MALLOC_TRIM_THRESHOLD_": 256 * 2**20,
        }
        == {name: value for _, name, value in THRESHOLDS}
    )


@pytest.mark.sim
def test_a_users_own_malloc_settings_win():
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    result = probe("keep", env)
    assert "MALLOC_MMAP_THRESHOLD_" not in result["applied"]
    assert result["kept_bytes"] < 2**20  # the user's 128 KiB threshold: the block is mapped and given back
