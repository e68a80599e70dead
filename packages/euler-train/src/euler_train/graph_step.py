"""The whole optimizer step on one GPU as one CUDA graph: forward, backward, clip and AdamW, replayed.

Launched from Python, one step of the `gpu` preset is about 1,500 kernel launches and cuBLAS calls;
captured once (CuPy stream capture) it is replayed with a single launch. Everything that changes between
steps lives in device buffers that the host rewrites before each replay: the batch (tokens, targets) and
`hyper` = [lr, 1 - beta1**t, 1 - beta2**t, enable]. Nothing is read back while the step runs; afterwards
the host reads the loss, the gradient norm and whether the update was applied. A non-finite loss or
gradient norm makes the AdamW kernel leave weights and moments untouched (decided on the device).

The graph's intermediate buffers come from a memory pool of its own, so no other allocation can ever
land on an address the graph writes to. The trainer uses this for pretraining on one GPU when
`train.cuda_graph` is true (the default); anything else runs the eager step.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class GraphStep:
    """Capture on the first call of `run`, replay on every later one.

    mcfg: the ModelConfig; params: name -> float32 CuPy array (updated in place); opt: euler-train's
    AdamW (its m, v, betas, eps and weight_decay are used; its step counter is the caller's);
    micro_shape: (B, T) of one micro-batch; grad_accum: micro-batches per step; max_norm: 0 = no clip.
    """

    def __init__(
        self,
        mcfg: Any,
        params: dict[str, Any],
        opt: Any,
        micro_shape: tuple[int, int],
        grad_accum: int,
        max_norm: float,
    ) -> None:
        import cupy as cp

        self.cp, self.mcfg, self.params, self.opt = cp, mcfg, params, opt
        self.grad_accum, self.max_norm = grad_accum, max_norm
        b, t = micro_shape
        self.names = list(params)
        self.tokens = cp.zeros((grad_accum, b, t), dtype=cp.int64)  # static inputs the graph reads
        self.targets = cp.zeros((grad_accum, b, t + mcfg.n_mtp_heads - 1), dtype=cp.int64)
        self.grads = {n: cp.zeros_like(p) for n, p in params.items()}  # static: AdamW's tables point here
        self.loss = cp.zeros((), dtype=cp.float32)
        self.hyper = cp.zeros((4,), dtype=cp.float32)
        self.control = cp.zeros((6,), dtype=cp.float32)  # [clip factor, applied, lr, bc1, bc2, norm]
        self.decays = [opt.weight_decay if params[n].ndim >= 2 else 0.0 for n in self.names]
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.pool = cp.cuda.MemoryPool()  # the graph's own: nothing else allocates from it
        self.graph = None

    # --- the captured work ----------------------------------------------------------------------------
    def _body(self) -> None:
        """One step from the static buffers to updated weights; no host read-back, no host-to-device copy."""
        import euler_kernels as ek
        from euler_model import loss_and_grads_on_device

        cp, share = self.cp, 1.0 / self.grad_accum
        loss_sum = None
        for i in range(self.grad_accum):
            loss, grads = loss_and_grads_on_device(self.mcfg, self.params, self.tokens[i], self.targets[i])
            for name, g in grads.items():
                if share != 1.0:
                    cp.multiply(g, share, out=g)
                if i == 0:
                    cp.copyto(self.grads[name], g)
                else:
                    self.grads[name] += g
            loss_sum = loss * share if loss_sum is None else loss_sum + loss * share
        self.loss[...] = loss_sum
        glist = [self.grads[n] for n in self.names]
        ek.step_control(ek.sum_squares_multi(glist), self.loss, self.hyper, self.max_norm, out=self.control)
        ek.adamw_multi_ctl(
            [self.params[n] for n in self.names],
            [self.opt.m[n] for n in self.names],
            [self.opt.v[n] for n in self.names],
            glist,
            self.decays,
            self.control,
            self.opt.beta1,
            self.opt.beta2,
            self.opt.eps,
        )

    def _capture(self) -> None:
        """A dry run (enable = 0: compiles kernels, creates handles and tables, updates nothing), then the
        capture of the same work into a graph."""
        import euler_kernels as ek

        cp = self.cp
        # the graph holds the addresses of the multi-tensor tables: keep them alive as long as it lives
        with ek.keep_tables() as self.tables, cp.cuda.using_allocator(self.pool.malloc), self.stream:
            self._body()
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

    # --- per step -------------------------------------------------------------------------------------
    def _write_inputs(self, micro: list[tuple], lr: float, t: int, enable: bool) -> None:
        tokens = np.stack([np.asarray(m[0], dtype=np.int64) for m in micro])
        targets = np.stack([np.asarray(m[1], dtype=np.int64) for m in micro])
        if tokens.shape != self.tokens.shape or targets.shape != self.targets.shape:
            raise ValueError(
                f"GraphStep: the graph was captured for batches {self.tokens.shape} / {self.targets.shape}, "
                f"got {tokens.shape} / {targets.shape}"
            )
        b1, b2 = self.opt.beta1, self.opt.beta2
        hyper = np.array([lr, 1.0 - b1**t, 1.0 - b2**t, 1.0 if enable else 0.0], dtype=np.float32)
        self.tokens.set(tokens, stream=self.stream)
        self.targets.set(targets, stream=self.stream)
        self.hyper.set(hyper, stream=self.stream)

    def run(self, micro: list[tuple], lr: float, t: int) -> tuple[float, float, bool]:
        """Step on these micro-batches [(tokens, targets, None), ...] with learning rate lr as AdamW's
        t-th update; returns (loss, gradient norm before clipping, whether the update was applied)."""
        cp = self.cp
        cp.cuda.Stream.null.synchronize()  # work queued on the default stream (eval, saving) is done
        if self.graph is None:
            self._write_inputs(micro, lr, t, enable=False)
            self._capture()
        self._write_inputs(micro, lr, t, enable=True)
        self.graph.launch(stream=self.stream)
        self.stream.synchronize()
        control = self.control.get()
        return float(self.loss.get()), float(control[5]), bool(control[1] != 0.0)

    def memory_bytes(self) -> int:
        """Device memory held by the graph's own pool (its activations and temporaries)."""
        return int(self.pool.total_bytes())
