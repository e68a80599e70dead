"""The decode step captured as CUDA graphs on the GPU and replayed once per token; eager elsewhere.

The step takes an attention window (decode_step.attention_window: the cache slots it reads, a multiple of
WINDOW), and each window has its own graph. The pattern of euler-train's graph_step.py: a stream and a
memory pool of the graphs' own (no other allocation can land on an address a graph writes to; the graphs
run one after another on that stream, so they may share their temporaries); the first call with a window
runs the step eagerly on that stream (it compiles the kernels, creates the cuBLAS handles and fills the
pool), then records the same step into that window's graph without running it; every later call with the
window replays it. The step reads and writes only the DecodeState's buffers, so a replay is the next
step. If recording fails (an operation that cannot be captured), the state is untouched by it and the
steps run eagerly from then on; `mode` says which happened.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import euler_kernels as ek


class EagerDecode:
    """Runs the step as it is called (NumPy, or CuPy launched from Python)."""

    def __init__(self, step: Callable[[int], None], done: Any) -> None:
        self.step, self.done, self.mode = step, done, "eager"

    def run(self, window: int) -> None:
        self.step(window)

    def finished(self) -> bool:
        """Whether every row is done (on the GPU a read back to the host, so a sync)."""
        return bool(self.done.all())

    def synchronize(self) -> None:
        """Nothing to wait for: the steps ran on the default stream."""


class DecodeGraph:
    """A window's step captured on its first `run` (which also runs it once), replayed on later calls."""

    def __init__(self, step: Callable[[int], None], done: Any, xp: Any) -> None:
        self.step, self.done, self.cp = step, done, xp
        self.stream = xp.cuda.Stream(non_blocking=True)
        self.pool = xp.cuda.MemoryPool()  # the graphs' own: nothing else allocates from it
        self.graphs: dict[int, Any] = {}  # window -> its graph
        self.mode = "cuda graph"
        self.eager = False

    def run(self, window: int) -> None:
        if self.eager:
            with self.stream:
                self.step(window)
        elif window not in self.graphs:
            self._capture(window)
        else:
            self.graphs[window].launch(stream=self.stream)

    def _capture(self, window: int) -> None:
        cp = self.cp
        cp.cuda.Stream.null.synchronize()  # the prefill, queued on the default stream, is done
        with cp.cuda.using_allocator(self.pool.malloc), self.stream:
            self.step(window)  # this step, eagerly: an error here is a real one
            self.stream.synchronize()
            self.stream.begin_capture()
            try:
                self.step(window)
            except Exception as err:
                try:
                    self.stream.end_capture()
                except Exception:  # the capture is already invalid; the first error is the one to say
                    pass
                self.eager, self.mode = True, f"eager (CUDA graph capture failed: {err})"
                return
            self.graphs[window] = self.stream.end_capture()

    def finished(self) -> bool:
        """Whether every row is done: the graph's stream is waited for, then `done` read back."""
        with self.stream:
            return bool(self.done.all())

    def synchronize(self) -> None:
        """Wait for the steps queued on the graph's stream (before the state is read elsewhere)."""
        self.stream.synchronize()


def decode_runner(step: Callable[[int], None], done: Any, cuda_graph: bool) -> EagerDecode | DecodeGraph:
    """A DecodeGraph for CuPy buffers when cuda_graph, else an EagerDecode."""
    if not cuda_graph or isinstance(done, np.ndarray):
        return EagerDecode(step, done)
    return DecodeGraph(step, done, ek.get_array_module(done))
