"""The captured step's planned memory (graph_memory, GraphStep(planned_memory=True), the default): the
steps it replays are those of the pool-served graph, every request of the kept capture lands in the slab,
the slab holds no more than the pool did, and a request the record did not foresee goes to the pool
rather than onto a live array's bytes."""

from __future__ import annotations

import numpy as np
import pytest

import euler_model
from euler_kernels import Precision
from euler_train.comm import Comm
from euler_train.config import resolve_config
from euler_train.graph_memory import AllocationRecord, PlannedAllocator, plan_offsets, plan_record
from euler_train.graph_step import GraphStep
from euler_train.optimizer import AdamW
from euler_train.step import StepOptions

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu


def run_steps(planned, keep=True, lrs=(3e-3, 2e-3, 1e-3)):
    """(params after the steps, the runner, the losses): a bf16 model with kept activations and bf16
    gradients (the 1b preset's step, small), captured, a new batch every step."""
    cfg = euler_model.preset("tiny", dim=256, n_heads=4, n_kv_heads=2, n_layers=3, context=128)
    params = {k: cp.asarray(v) for k, v in euler_model.init_params(cfg, seed=3).items()}
    t = resolve_config("tiny").train
    opt = AdamW(params, t.beta1, t.beta2, t.eps, 0.1)
    options = StepOptions(max_norm=1.0, keep_activations=keep, bf16_grads=True, precision=Precision("bf16"))
    runner = GraphStep(cfg, params, opt, Comm(), options, planned_memory=planned)
    rng = np.random.default_rng(0)
    losses = []
    for lr in lrs:
        tokens = rng.integers(0, cfg.vocab_size, (8, 128))
        micro = [(tokens, rng.integers(0, cfg.vocab_size, (8, 128 + cfg.n_mtp_heads - 1)), None)]
        loss, _, applied = runner.run(micro, [1.0], opt.hyper(lr))
        opt.t += int(applied)
        losses.append(loss)
    return params, runner, losses


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "remade"])
def test_planned_graph_steps_as_the_pool_served_one(keep):
    """Three replays: the same losses, every request of the capture served from the slab laid out for the
    dry run's, which is within 10% of the most bytes the body had alive at once, and held memory no more
    than the pool-served graph's. One step: the matrices' updates bit for bit (cuBLAS products, the same
    every run), the embedding and norms to 0.1% of the step's lr (their gradients are atomic sums in no
    fixed order; AdamW's first step divides each by its own size, which makes one rounding of a small
    gradient a visible share of lr, and its later steps magnify it)."""
    run_steps(False, keep, lrs=(1e-3,))  # handles, workspaces, tuned products: made once, here
    _, runner, losses = run_steps(True, keep)
    _, pool_runner, pool_losses = run_steps(False, keep)
    assert runner.slab is not None and runner.planner.misses == 0, runner.memory_plan()
    assert runner.planned_from == "the dry run's", runner.memory_plan()  # it foresaw every request
    requests, total, floor = runner.plan_stats
    assert requests > 50 and floor <= total <= 1.10 * floor, runner.memory_plan()
    assert pool_runner.slab is None and pool_runner.plan_stats is None
    held, pool_held = runner.memory_bytes(), pool_runner.memory_bytes()
    assert held <= pool_held, (held, pool_held)
    np.testing.assert_allclose(losses, pool_losses, rtol=1e-5)
    planned, _, _ = run_steps(True, keep, lrs=(3e-3,))
    pooled, _, _ = run_steps(False, keep, lrs=(3e-3,))
    for name in planned:
        got, want = planned[name].get(), pooled[name].get()
        if name.startswith("layers.") and got.ndim == 2:
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3 * 3e-3, err_msg=name)  # 0.1% of lr


def test_a_request_the_record_did_not_foresee_goes_to_the_pool():
    """Recorded: a made and freed, then b (the plan puts b on a's bytes), then c. Served: a is still alive
    when b comes, so b goes to the pool; c, of another size than recorded, too; a block alive in the
    slab keeps its values while the pool serves the others."""
    pool = cp.cuda.MemoryPool()
    record = AllocationRecord(cp, pool.malloc)
    with cp.cuda.using_allocator(record.malloc):
        a = cp.empty(1 << 20, dtype=cp.uint8)
        del a
        b = cp.empty(1 << 20, dtype=cp.uint8)
        c = cp.empty(4096, dtype=cp.uint8)
    record.close()
    offsets, total = plan_offsets(record.sizes, record.starts, record.ends)
    assert offsets[0] == offsets[1] and total == (1 << 20) + 4096
    slab = cp.cuda.Memory(total)
    planner = PlannedAllocator(cp, record.sizes, offsets, slab, pool.malloc)
    with cp.cuda.using_allocator(planner.malloc):
        a = cp.full(1 << 20, 7, dtype=cp.uint8)
        b = cp.full(1 << 20, 9, dtype=cp.uint8)
        c = cp.empty(8192, dtype=cp.uint8)
    assert a.data.ptr == slab.ptr + int(offsets[0])
    assert planner.misses == 2
    for other in (b, c):
        assert not slab.ptr <= other.data.ptr < slab.ptr + total
    assert int((a == 7).all()) and int((b == 9).all())


def test_the_dry_runs_record_plans_what_the_capture_asks_for():
    """The dry run's record, served by a pool that gives each freed block back at once: it holds only what
    is in use. A block still alive after it (a workspace made once) is kept out of the plan and keeps its
    memory; a request made only in the dry run is passed over when the capture does not make it; the
    capture's requests all land in the slab, a block on the bytes of one freed before it."""
    dry_pool, pool = cp.cuda.MemoryPool(), cp.cuda.MemoryPool()
    record = AllocationRecord(cp, dry_pool.malloc, after_free=dry_pool.free_all_blocks)
    with cp.cuda.using_allocator(record.malloc):
        workspace = cp.empty(1 << 20, dtype=cp.uint8)
        once = cp.empty(4096, dtype=cp.uint8)
        del once
        a = cp.empty(1 << 16, dtype=cp.uint8)
        b = cp.empty(1 << 16, dtype=cp.uint8)
        assert dry_pool.total_bytes() == (1 << 20) + 2 * (1 << 16)  # the freed block went back at once
        del a
        c = cp.empty(1 << 16, dtype=cp.uint8)
        del b, c
    record.close()
    assert dry_pool.total_bytes() == 1 << 20 and record.alive == [True, False, False, False, False]
    sizes, offsets, total, floor = plan_record(record)
    assert sizes == [-1, 4096, 1 << 16, 1 << 16, 1 << 16]
    assert total == floor == 2 * (1 << 16) and offsets[4] == offsets[2]
    slab = cp.cuda.Memory(total)
    planner = PlannedAllocator(cp, sizes, offsets, slab, pool.malloc)
    with cp.cuda.using_allocator(planner.malloc):
        a = cp.full(1 << 16, 1, dtype=cp.uint8)
        b = cp.full(1 << 16, 2, dtype=cp.uint8)
        del a
        c = cp.full(1 << 16, 3, dtype=cp.uint8)
    assert planner.misses == 0 and pool.total_bytes() == 0
    assert {b.data.ptr, c.data.ptr} == {slab.ptr + int(offsets[3]), slab.ptr + int(offsets[4])}
    assert int((b == 2).all()) and int((c == 3).all()) and workspace.size == 1 << 20
