"""The decode step captured as CUDA graphs on the GPU and replayed once per token; eager elsewhere.

The pattern of euler-train's graph_step.py: the graphs run on a stream and allocate from a memory pool of
their own (no other allocation can land on an address a graph writes to). The first call with a key (the
step's attention window, or a caller's key such as a prefill's) runs the work eagerly on that stream (it
compiles the kernels and fills the pool), then records it as that key's graph without running it again;
later calls replay the graph. The work reads and writes only the DecodeState's buffers, so a replay is the
next step. If recording fails, the key runs eagerly from then on and `mode` says why.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import numpy as np

import euler_kernels as ek


class EagerDecode:
    """Runs the step and any other work as they are called (NumPy, or CuPy launched from Python)."""

    mode = "eager"

    def __init__(self, step: Callable[[int], None]) -> None:
        self.step = step

    def run(self, window: int) -> None:
        self.step(window)

    def call(self, key: Hashable, fn: Callable[[], None], capture: bool = True) -> None:
        fn()

    def forget(self, key: Hashable) -> None:
        pass

    def ordered(self) -> contextlib.AbstractContextManager:
        """Work queued (or read back) inside runs where the steps run."""
        return contextlib.nullcontext()

    def synchronize(self) -> None:
        pass


class DecodeGraph(EagerDecode):
    """A window's step captured on its first `run` (which also runs it once), replayed on later calls."""

    def __init__(self, step: Callable[[int], None], xp: Any) -> None:
        self.step, self.cp = step, xp
        self.stream = xp.cuda.Stream(non_blocking=True)
        self.pool = xp.cuda.MemoryPool()  # the graphs' own: nothing else allocates from it
        self.graphs: dict[Hashable, Any] = {}  # ("step", window) or a caller's key -> its graph
        self.tables: dict[Hashable, dict] = {}  # the multi-tensor tables each graph was recorded with
        self.uncaptured: set[Hashable] = set()  # keys whose recording failed: run eagerly
        self.uncaptured_why = ""  # the last failed recording's error, as a mode
        self.mode = "cuda graph"
        self.eager = False

    def run(self, window: int) -> None:
        key = ("step", window)
        if self.eager:
            with self.cp.cuda.using_allocator(self.pool.malloc), self.stream:
                self.step(window)
        else:
            self.call(key, lambda: self.step(window))
            if key in self.uncaptured:
                self.eager, self.mode = True, self.uncaptured_why

    def call(self, key: Hashable, fn: Callable[[], None], capture: bool = True) -> None:
        """fn() on the graphs' stream: key's graph replayed if it has one; else fn run eagerly, then (when
        capture) recorded as key's graph. Only a recorded run allocates from the graphs' pool."""
        if key in self.graphs:
            self.graphs[key].launch(stream=self.stream)
            return
        if not capture or key in self.uncaptured:  # eager only: its temporaries go back to CuPy's pool
            with self.stream:
                fn()
            return
        # the recording must find the multi-tensor tables the eager run made (none may be built inside it)
        with ek.keep_tables() as tables, self.cp.cuda.using_allocator(self.pool.malloc), self.stream:
            fn()  # eagerly: an error here is a real one
            self._capture(key, fn, tables)

    def forget(self, key: Hashable) -> None:
        """Drop key's graph (a later call with key runs eagerly and records it again)."""
        self.graphs.pop(key, None)
        self.tables.pop(key, None)
        self.uncaptured.discard(key)

    @contextlib.contextmanager
    def ordered(self) -> Iterator[None]:
        """Work queued (or read back) inside runs on the graphs' stream, after everything queued before on
        the caller's stream (a trainer's last update of the weights, say)."""
        self.stream.wait_event(self.cp.cuda.get_current_stream().record())
        with self.stream:
            yield

    def _capture(self, key: Hashable, fn: Callable[[], None], tables: dict) -> None:
        """Record fn() as key's graph (inside call's scopes), or mark key uncaptured if it cannot be."""
        self.stream.synchronize()
        self.stream.begin_capture()
        try:
            fn()
        except Exception as err:
            try:
                self.stream.end_capture()
            except Exception:  # the capture is already invalid; the first error is the one to say
                pass
            self.uncaptured.add(key)
            self.uncaptured_why = f"eager (CUDA graph capture failed: {err})"
            return
        self.graphs[key] = self.stream.end_capture()
        self.tables[key] = tables

    def synchronize(self) -> None:
        """Wait for the work queued on the graphs' stream."""
        self.stream.synchronize()


def decode_runner(step: Callable[[int], None], xp: Any, cuda_graph: bool) -> EagerDecode:
    """A DecodeGraph for a step on CuPy (xp) when cuda_graph, else an EagerDecode."""
    return DecodeGraph(step, xp) if cuda_graph and xp is not np else EagerDecode(step)
