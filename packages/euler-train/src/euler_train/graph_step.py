"""The training step on one GPU as one CUDA graph: step.train_step captured once, then replayed.

Launched from Python, one step of the `gpu` preset is about 1,500 kernel launches and cuBLAS calls;
captured once (CuPy stream capture) it is replayed with a single launch. What changes between steps lives
in step.StepBuffers, which the host rewrites before each replay (the batch, the loss shares, the
optimizer's hyper); afterwards it reads back the loss, the norm and whether the update was applied. A
non-finite loss or gradient norm makes the update leave weights and moments untouched (decided on the
device, in the control vector).

The graph's intermediate buffers come from a memory pool of its own, so no other allocation can ever
land on an address the graph writes to. The trainer uses it on one GPU when `train.cuda_graph` is true
(the default) and attention runs the fused kernel; otherwise step.EagerStep runs the same function.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

import euler_kernels as ek
from euler_train.step import StepBuffers, bf16_weight_copies, train_step


class GraphStep:
    """Capture on the first call of `run`, replay on every later one (same `run` as step.EagerStep)."""

    def __init__(
        self,
        mcfg: Any,
        params: dict[str, Any],
        opt: Any,
        comm: Any,
        max_norm: float,
        recompute: bool = False,
        fp8_scales: Any = None,
        keep_activations: bool = False,
        bf16_grads: bool = False,
    ) -> None:
        import cupy as cp  # only on the GPU path

        self.cp, self.mcfg, self.params, self.opt, self.comm = cp, mcfg, params, opt, comm
        self.max_norm, self.recompute, self.fp8_scales = max_norm, recompute, fp8_scales
        self.keep_activations, self.bf16_grads = keep_activations, bf16_grads
        self.buf: StepBuffers | None = None
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.pool = cp.cuda.MemoryPool()  # the graph's own: nothing else allocates from it
        self.graph = None
        self.copies: dict[str, Any] = {}  # bf16_weight_copies, made before the capture

    def _body(self) -> None:
        layers = (self.keep_activations, self.bf16_grads)
        args = (self.max_norm, self.recompute, self.fp8_scales, self.copies, *layers)
        train_step(self.mcfg, self.params, self.opt, self.comm, self.buf, *args)

    def _capture(self, micro: list[tuple], shares: list[float], hyper: np.ndarray) -> None:
        """A dry run (enable = 0: compiles kernels, creates handles and tables, updates nothing; with
        delayed FP8 scales it measures their first maxima, so the graph casts with them), then the
        capture of the same work into a graph."""
        cp = self.cp
        dry = np.array(hyper, dtype=np.float32)
        dry[3] = 0.0  # enable = 0
        # the graph holds the addresses of the multi-tensor tables: keep them alive as long as it lives
        scales = self.fp8_scales  # scales a resumed run saved: the dry run must not move them
        kept = ek.fp8_scale_arrays(scales) if scales is not None and scales.calibrated else None
        with ek.keep_tables() as self.tables, cp.cuda.using_allocator(self.pool.malloc), self.stream:
            self.buf = StepBuffers.allocate(cp, self.mcfg, self.params, micro, len(hyper))
            self.copies = bf16_weight_copies(self.mcfg, self.params, self.opt)
            self.buf.write(micro, shares, dry, stream=self.stream)
            self._body()
            self.stream.synchronize()
            if kept is not None:
                ek.restore_fp8_scales(scales, kept)
                self.stream.synchronize()
            self.stream.begin_capture()
            try:
                self._body()
            except BaseException:
                try:
                    self.stream.end_capture()
                except Exception:  # the capture is already invalid; the first error is the one to show
                    pass
                raise
            self.graph = self.stream.end_capture()

    def run(self, micro: list[tuple], shares: list[float], hyper: np.ndarray) -> tuple[float, float, bool]:
        """Step on these micro-batches; returns (loss, norm before clipping, whether the update was
        applied). The first call captures the graph."""
        cp = self.cp
        cp.cuda.Stream.null.synchronize()  # work queued on the default stream (eval, saving) is done
        if self.graph is None:
            self._capture(micro, shares, hyper)
        elif not self.buf.fits(micro):
            raise ValueError(
                f"GraphStep: the graph was captured for batches {self.buf.tokens.shape} / "
                f"{self.buf.targets.shape}, got {len(micro)} x {micro[0][0].shape} / {micro[0][1].shape}"
            )
        self.buf.write(micro, shares, hyper, stream=self.stream)
        self.graph.launch(stream=self.stream)
        self.stream.synchronize()
        return self.buf.read()

    def memory_bytes(self) -> int:
        """Device memory held by the graph's own pool: the step's buffers (gradients included), activations
        and temporaries; everything of the step but the weights and the optimizer's state."""
        return int(self.pool.total_bytes())


class CapturedOrEager:
    """A GraphStep whose first step, if capturing fails, falls back to the eager step for good (the dry run
    and the capture update nothing, so the eager step then takes the same step)."""

    def __init__(self, graph: GraphStep, eager: Any) -> None:
        self.graph, self.eager, self.captured = graph, eager, False

    def run(self, micro: list[tuple], shares: list[float], hyper: np.ndarray) -> tuple[float, float, bool]:
        if self.captured:
            return self.graph.run(micro, shares, hyper)
        if self.graph is None:
            return self.eager.run(micro, shares, hyper)
        try:
            out = self.graph.run(micro, shares, hyper)
        except Exception as err:
            self.graph = None
            print(f"euler-train: CUDA graph capture failed ({err}); stepping eagerly", file=sys.stderr)
            return self.eager.run(micro, shares, hyper)
        self.captured = True
        print("euler-train: the step is captured as a CUDA graph; replayed from here on", file=sys.stderr)
        return out
