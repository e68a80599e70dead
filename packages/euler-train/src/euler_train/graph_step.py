"""The training step on one GPU as one CUDA graph: step.train_step captured once, then replayed.

Launched from Python, one step of the `gpu` preset is about 1,500 kernel launches and cuBLAS calls;
captured once (CuPy stream capture) it is replayed with a single launch. What changes between steps lives
in step.StepBuffers, which the host rewrites before each replay (the batch, the loss shares, the
optimizer's hyper); afterwards it reads back the loss, the norm and whether the update was applied. A
non-finite loss or gradient norm makes the update leave weights and moments untouched (decided on the
device, in the control vector).

The graph's intermediate buffers are its own, so no other allocation can ever land on an address the
graph writes to: the step's buffers come from a pool of its own, and the body's activations, gradients
and temporaries from one slab laid out ahead of time (graph_memory.py: the dry run before the capture
records the body's requests, and the capture serves each at its planned offset), which holds what the step
has in use at its peak, not what a pool's splits and fresh blocks add to it. The trainer uses it on one GPU
when `train.cuda_graph` is true (the default) and attention runs the fused kernel; otherwise
step.EagerStep runs the same function.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

import euler_kernels as ek
from euler_train.graph_memory import (
    AllocationRecord,
    PlannedAllocator,
    alive_at_peak,
    no_cycle_collection,
    peak_in_use,
    plan_record,
)
from euler_train.step import StepBuffers, StepOptions, bf16_weight_copies, train_step


class GraphStep:
    """Capture on the first call of `run`, replay on every later one (same `run` as step.EagerStep)."""

    def __init__(
        self,
        mcfg: Any,
        params: dict[str, Any],
        opt: Any,
        comm: Any,
        options: StepOptions,
        fp8_scales: Any = None,
        planned_memory: bool = True,
        memory_sites: bool = False,
    ) -> None:
        """`planned_memory`: serve the body's allocations from one planned slab (graph_memory.py); False:
        from the pool as they come (what the planned layout is measured against). `memory_sites`: the
        record notes where each request was made, for memory_at_peak."""
        import cupy as cp  # only on the GPU path

        self.cp, self.mcfg, self.params, self.opt, self.comm = cp, mcfg, params, opt, comm
        self.options, self.fp8_scales = options, fp8_scales
        self.buf: StepBuffers | None = None
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.pool = cp.cuda.MemoryPool()  # the graph's own: nothing else allocates from it
        self.planned_memory, self.memory_sites = planned_memory, memory_sites
        self.dry_pool = cp.cuda.MemoryPool()  # the planned dry run's: each freed block goes back at once
        self.record: AllocationRecord | None = None  # the kept capture's requests
        self.slab = None  # the planned slab (cupy.cuda.Memory), or None: the pool serves the body
        self.planner: PlannedAllocator | None = None  # its `misses`: requests the pool served instead
        self.plan_stats: tuple[int, int, int] | None = None  # (requests, slab bytes, most alive at once)
        self.planned_from = ""  # whose requests the slab is for: "the dry run's" or "a first capture's"
        self.setup_bytes = 0  # the most the step's memory came to while capturing (dry run, captures)
        self.graph = None
        self.copies: dict[str, Any] = {}  # bf16_weight_copies, made before the capture

    def _body(self) -> None:
        train_step(
            self.mcfg, self.params, self.opt, self.comm, self.buf, self.options, self.fp8_scales, self.copies
        )

    def _captured(self) -> Any:
        """The body captured on self.stream into a graph (nothing runs)."""
        self.stream.begin_capture()
        try:
            self._body()
        except BaseException:
            try:
                self.stream.end_capture()
            except Exception:  # the capture is already invalid; the first error is the one to show
                pass
            raise
        return self.stream.end_capture()

    def _planned_capture(self, record: AllocationRecord) -> Any:
        """The body captured with its requests served from a slab laid out for `record`'s (the dry run's).
        Where the capture asked for what the record did not foresee (the pool served it), the capture's own
        requests are laid out and the body captured once more."""
        self.planned_from = "the dry run's"
        graph = self._captured_from_plan(record)
        if self.planner is not None and self.planner.misses:
            self.planned_from = "a first capture's"
            del graph  # dropped before the second capture
            self.buf.release_step_grads()
            self.planner = self.slab = None
            self.pool.free_all_blocks()
            graph = self._captured_from_plan(self.record)
        return graph

    def _captured_from_plan(self, record: AllocationRecord) -> Any:
        """The body captured with each request at its offset in a slab laid out for `record`'s (without
        the slab's memory: from the pool); self.record becomes the capture's own requests."""
        cp = self.cp
        sizes, offsets, total, floor = plan_record(record)
        self.plan_stats = (sum(size > 0 for size in sizes), total, floor)
        try:
            self.slab = cp.cuda.Memory(total) if total else None
        except cp.cuda.memory.OutOfMemoryError:
            self.plan_stats = None
            with cp.cuda.using_allocator(self.pool.malloc):
                return self._captured()
        self.planner = PlannedAllocator(cp, sizes, offsets, self.slab, self.pool.malloc)
        self.record = AllocationRecord(cp, self.planner.malloc, self.memory_sites)
        with cp.cuda.using_allocator(self.record.malloc):
            graph = self._captured()
        self.record.close()
        self.setup_bytes = max(self.setup_bytes, self.memory_bytes())
        return graph

    def _capture(self, micro: list[tuple], shares: list[float], hyper: np.ndarray) -> None:
        """A dry run (enable = 0: compiles kernels, creates handles and tables, updates nothing; with
        delayed FP8 scales it measures their first maxima, so the graph casts with them), then the
        capture of the same work into a graph. With planned memory the dry run records the body's
        requests, served by a pool that frees each block as it comes back (so it holds what is in use),
        and the capture serves them from the slab laid out for them. The cyclic collector is off
        throughout, so blocks are freed at the same points in each."""
        cp = self.cp
        dry = np.array(hyper, dtype=np.float32)
        dry[3] = 0.0  # enable = 0
        # the graph holds the addresses of the multi-tensor tables: keep them alive as long as it lives
        scales = self.fp8_scales  # scales a resumed run saved: the dry run must not move them
        kept = ek.fp8_scale_arrays(scales) if scales is not None and scales.calibrated else None
        with (
            ek.keep_tables() as self.tables,
            cp.cuda.using_allocator(self.pool.malloc),
            self.stream,
            no_cycle_collection(),
        ):
            self.buf = StepBuffers.allocate(cp, self.mcfg, self.params, micro, len(hyper))
            self.copies = bf16_weight_copies(self.mcfg, self.params, self.opt, self.options.precision)
            self.buf.write(micro, shares, dry, stream=self.stream)
            if self.planned_memory:
                pool = self.dry_pool
                record = AllocationRecord(cp, pool.malloc, self.memory_sites, pool.free_all_blocks)
                with cp.cuda.using_allocator(record.malloc):
                    self._body()
                self.stream.synchronize()
                record.close()
                held = self.pool.total_bytes()
                self.setup_bytes = held + peak_in_use(record.sizes, record.starts, record.ends)
            else:
                self._body()
                self.stream.synchronize()
                self.setup_bytes = self.pool.total_bytes()
            self.buf.release_step_grads()  # the dry run's: the capture makes its own
            for pool in (self.pool, self.dry_pool):  # the dry run's freed blocks go: the capture starts
                pool.free_all_blocks()  # from what lives
            if kept is not None:
                ek.restore_fp8_scales(scales, kept)
                self.stream.synchronize()
            if self.planned_memory:
                self.graph = self._planned_capture(record)
                self.dry_pool.free_all_blocks()  # dry-run blocks the capture let go of (the pool kept them)
            else:
                self.graph = self._captured()

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

    def memory_plan(self) -> str:
        """One line on the planned slab: its requests, its size against the least any layout could have (the
        most bytes alive at once), and how many requests the pool served instead."""
        if self.plan_stats is None:
            return "memory plan: none (the pool served the body)"
        requests, total, floor = self.plan_stats  # set together with the planner, or neither
        return (
            f"memory plan: {requests:,} requests ({self.planned_from}) in a {total / 2**30:.2f} GiB slab "
            f"(the most alive at once: {floor / 2**30:.2f} GiB); {self.planner.misses} served by the pool "
            f"instead; while capturing, the graph's own memory came to at most "
            f"{self.setup_bytes / 2**30:.2f} GiB"
        )

    def memory_at_peak(self, top: int = 12) -> list[str]:
        """What the body has alive at its peak, by where it was made (needs memory_sites): the `top` sites
        by bytes, one line each."""
        record = self.record
        if record is None or record.sites is None:
            return []
        by_site: dict[str, list[int]] = {}
        for i in alive_at_peak(record.sizes, record.starts, record.ends):
            by_site.setdefault(record.sites[i], []).append(record.sizes[i])
        ranked = sorted(by_site.items(), key=lambda kv: -sum(kv[1]))[:top]
        return [f"{sum(s) / 2**30:7.3f} GiB in {len(s):4d} blocks  {site}" for site, s in ranked]

    def memory_bytes(self) -> int:
        """Device memory held by the graph's own pool and slab: the step's buffers, gradients, activations
        and temporaries; everything of the step but the weights and the optimizer's state."""
        slab = self.slab.size if self.slab is not None else 0
        return int(self.pool.total_bytes()) + int(self.dry_pool.total_bytes()) + slab


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
