"""The decode step captured as one CUDA graph on the GPU and replayed once per token; eager elsewhere.

The pattern of euler-train's graph_step.py: a stream and a memory pool of the graph's own (no other
allocation can land on an address the graph writes to); the first call runs the step eagerly on that
stream (it compiles the kernels, creates the cuBLAS handles and fills the pool), then records the same
step into a graph without running it; every later call replays the graph. The step reads and writes only
the DecodeState's buffers, so a replay is the next step. If recording fails (an operation that cannot be
captured, e.g. a sort that synchronises), the state is untouched by it and the steps run eagerly from
then on; `mode` says which happened.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import euler_kernels as ek


class EagerDecode:
    """Runs the step as it is called (NumPy, or CuPy launched from Python)."""

    def __init__(self, step: Callable[[], None], done: Any) -> None:
        self.step, self.done, self.mode = step, done, "eager"

    def run(self) -> None:
        self.step()

    def finished(self) -> bool:
        """Whether every row is done (on the GPU a read back to the host, so a sync)."""
        return bool(self.done.all())

    def synchronize(self) -> None:
        """Nothing to wait for: the steps ran on the default stream."""


class DecodeGraph:
    """The step captured on the first call of `run` (which also runs it once), replayed on later calls."""

    def __init__(self, step: Callable[[], None], done: Any, xp: Any) -> None:
        self.step, self.done, self.cp = step, done, xp
        self.stream = xp.cuda.Stream(non_blocking=True)
        self.pool = xp.cuda.MemoryPool()  # the graph's own: nothing else allocates from it
        self.graph: Any = None
        self.mode = "cuda graph"
        self.eager = False

    def run(self) -> None:
        if self.eager:
            with self.stream:
                self.step()
        elif self.graph is None:
            self._capture()
        else:
            self.graph.launch(stream=self.stream)

    def _capture(self) -> None:
        cp = self.cp
        cp.cuda.Stream.null.synchronize()  # the prefill, queued on the default stream, is done
        with cp.cuda.using_allocator(self.pool.malloc), self.stream:
            self.step()  # this step, eagerly: an error here is a real one
            self.stream.synchronize()
            self.stream.begin_capture()
            try:
                self.step()
            except Exception as err:
                try:
                    self.stream.end_capture()
                except Exception:  # the capture is already invalid; the first error is the one to say
                    pass
                self.eager, self.mode = True, f"eager (CUDA graph capture failed: {err})"
                return
            self.graph = self.stream.end_capture()

    def finished(self) -> bool:
        """Whether every row is done: the graph's stream is waited for, then `done` read back."""
        with self.stream:
            return bool(self.done.all())

    def synchronize(self) -> None:
        """Wait for the steps queued on the graph's stream (before the state is read elsewhere)."""
        self.stream.synchronize()


def decode_runner(step: Callable[[], None], done: Any, cuda_graph: bool) -> EagerDecode | DecodeGraph:
    """A DecodeGraph for CuPy buffers when cuda_graph, else an EagerDecode."""
    if not cuda_graph or isinstance(done, np.ndarray):
        return EagerDecode(step, done)
    return DecodeGraph(step, done, ek.get_array_module(done))
