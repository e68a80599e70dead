"""Keep freed memory in the process for reuse instead of handing it back to the OS (glibc's malloc).

A NumPy training step allocates its activations and temporaries (hundreds of arrays of 0.1-4 MiB for the
`small` preset), frees them all at the end of the step, and allocates the same sizes again in the next.
By default glibc serves such arrays with fresh mmap pages, or returns the top of the heap to the OS once
more than a few MiB of it are free, so every step page-faults its memory in again and the kernel zeroes
every page: a large share of a `small` step's time (docs/benchmarks/model.md).
keep_freed_memory() makes freed blocks stay in the process's heap, so the next step reuses warm pages;
the resident size then stays at the peak of a step instead of rising and falling every step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # blocks below this come from the heap (the largest value glibc accepts)
TRIM_THRESHOLD_BYTES = 1 << 30  # free memory at the top of the heap is returned to the OS only above this

_done: list[bool] = []  # the outcome of the one mallopt call, once made


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds once per process; True if they are set (on glibc), False
    elsewhere (another C library, or no mallopt), where nothing changes. Calling it again does nothing.

    >>> keep_freed_memory() == keep_freed_memory()
    True
    """
    if not _done:
        _done.append(_set_thresholds())
    return _done[0]


def _set_thresholds() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # no C library found, or one without mallopt (e.g. musl)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # both, and the mmap one first: setting either turns off glibc's own adjustment of the other
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
