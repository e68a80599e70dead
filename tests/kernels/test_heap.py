"""euler_kernels.heap.keep_freed_memory: after it, a step that frees and re-allocates the same arrays
reuses warm pages instead of page-faulting them in again (run in child processes: it is process-wide)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# allocate and free 64 arrays of 1 MiB six times; print the page faults of the last five rounds
CHILD = """
import resource, sys
import numpy as np
from euler_kernels.heap import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
faults = 0
for r in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    arrays = [np.ones(1 << 18, dtype=np.float32) for _ in range(64)]
    del arrays
    if r:
        faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(kept, faults)
"""


def child_faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
    kept, faults = out.stdout.split()
    return kept, int(faults)


def test_freed_arrays_are_reused_without_page_faults():
    kept, with_keep = child_faults("keep")
    if kept != "True":
        pytest.skip("not glibc's malloc: keep_freed_memory() leaves the allocator as it is")
    _, without = child_faults("default")
    pages = 5 * 64 * (1 << 20) // 4096  # what re-faulting every round would cost
    assert without > pages // 2, f"default malloc: {without} faults, expected about {pages}"
    assert with_keep < pages // 20, f"after keep_freed_memory: {with_keep} faults of {pages} pages"
