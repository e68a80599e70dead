"""Worker threads for the NumPy training step: each runs one slice of the batch with single-threaded BLAS.

NumPy runs its element-wise work (exp, norms, masks: a large part of a `small` step) on one core, and a
multi-threaded BLAS splits each of the step's small matrix products across cores, each split paid for
with a wait; when the cores are shared with other processes those waits turn into stalls that can take
longer than the step itself. One slice of the batch per core, each with a BLAS thread of its own, keeps
every core busy with whole ops instead (docs/benchmarks/model.md).

The number of workers is the number of threads the BLAS library was started with (OPENBLAS_NUM_THREADS,
OMP_NUM_THREADS or MKL_NUM_THREADS, else one per core), so a process that asked for one BLAS thread runs
the step on one thread as before. While the workers run, BLAS is held at one thread per call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

import numpy as np
from threadpoolctl import ThreadpoolController

Part = TypeVar("Part")

_state: dict[str, Any] = {}  # the BLAS controller, its thread count at first use, the worker pool


def _controller() -> tuple[ThreadpoolController, int]:
    if "controller" not in _state:
        controller = ThreadpoolController().select(user_api="blas")
        threads = max((lib.num_threads for lib in controller.lib_controllers), default=1)
        _state["controller"], _state["threads"] = controller, max(1, threads)
    return _state["controller"], _state["threads"]


def cpu_workers(batch: int) -> int:
    """How many worker threads a NumPy step of `batch` rows uses: BLAS's thread count at the first call
    of this module, at most one per row.

    >>> 1 <= cpu_workers(16) and cpu_workers(1) == 1
    True
    """
    return max(1, min(batch, _controller()[1]))


class _OneBlasThread:
    """Each BLAS library set to one thread on entry, and back to its count on exit: the libraries' own
    calls only (threadpoolctl's limit() inspects every library each time, a cost paid once per token)."""

    def __enter__(self) -> None:
        libs = _controller()[0].lib_controllers
        self.before = [(lib, n) for lib in libs if (n := lib.num_threads) != 1]
        for lib, _ in self.before:
            lib.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        for lib, n in self.before:
            lib.set_num_threads(n)


def one_blas_thread() -> Any:
    """A context in which every BLAS call runs on one thread: what the worker threads run under, and what
    the small products of a decode step want (with two BLAS threads each small product waits for the
    second thread: docs/benchmarks/generate.md)."""
    return _OneBlasThread()


def one_blas_thread_for(like: Any) -> AbstractContextManager:
    """one_blas_thread() when `like` is a NumPy array (the CPU path), else a context that does nothing."""
    return one_blas_thread() if isinstance(like, np.ndarray) else nullcontext()


def run_parts(fn: Callable[[Part], Any], parts: Sequence[Part]) -> list[Any]:
    """[fn(part) for part in parts] on the worker threads (as many at once as BLAS had threads), BLAS at
    one thread meanwhile; results in the order of parts (an exception in any part is raised here)."""
    threads = _controller()[1]
    if "pool" not in _state:  # kept for the process: the threads' memory arenas stay warm between steps
        _state["pool"] = ThreadPoolExecutor(threads, thread_name_prefix="euler-cpu")
    with one_blas_thread():
        return list(_state["pool"].map(fn, parts))
