"""One full training step of any preset on one GPU: euler (CuPy + our kernels) vs PyTorch.

    python benchmarks/bench_train_gpu.py [--preset gpu|350m|1b|...] [--context T] [--batch B]
        [--set model.KEY=V --set train.KEY=V ...] [--precision tf32|bf16|fp8] [--steps 10] [--no-compile]
        [--recompute] [--muon] [--profile] [--kernels]

The model is `--preset` (default gpu) with `--context`, `--batch` and each `--set section.key=value` applied
the way `euler-train pretrain --preset NAME --set ...` applies them (euler-train's resolve_config and its
[model] override check), keeping the preset's own vocabulary; `--set train.recompute=true` or
`--set train.optimizer=muon` change our step, `--set run.attention_kernel=mma` (or sm90) and
`--set run.gemm_tuning=false` the kernels of our precision (euler_kernels.Precision), as they change
euler-train's. The batch defaults to the preset's train.batch_size, the precision to its run.precision
(tf32 when that is fp32).

Both sides run forward, backward, global-norm clipping and AdamW on the same weights and batch, in the
same process on the same GPU. Before timing, the two losses on the same weights are compared. Ours runs
twice: launched op by op from Python (eager), and captured once as a CUDA graph and replayed (euler-train's
GraphStep, what `euler-train pretrain` uses on one GPU; its time includes copying each batch in and reading
the loss back). PyTorch runs eagerly and under `torch.compile` (the reference; --no-compile skips it).
Prints tokens/s, step ms, achieved TFLOP/s, MFU and GPU memory for each, then each of ours against each
of PyTorch's: the throughput ratio and both MFUs. Memory, two columns: "held" is what the step keeps from
the GPU, free blocks of the caching allocators included (ours: weights, optimizer state and CuPy's pool;
PyTorch: torch.cuda.max_memory_reserved), the like-for-like figure; "live" is the peak of memory in use
(PyTorch: max_memory_allocated; our captured step: weights, optimizer state, the most its pool had in
use at once while the graph was recorded, from a CuPy memory hook, and with planned memory the most bytes
its body has alive at once and what the dry run made to keep).
--recompute adds our graph step with train.recompute = true (activations re-made in the backward): its
step time and memory against the same step without it.
--muon adds our graph step with train.optimizer = "muon".
--profile adds a table of GPU time per op in our eager step (CUDA events around every op); --kernels a
table of GPU time per kernel of our captured step (and of torch.compile's), from CUPTI.
--precision tf32: TF32 matmuls on both sides (ours: FlashAttention on the TF32 tensor cores too, as in
euler-train's tf32 runs), MFU against the H200's dense TF32 rate, 494.7 TFLOP/s.
--precision bf16: ours with bf16 activations (norm outputs, projections, RoPE, SwiGLU, our bf16
FlashAttention; matmuls on the bf16 tensor cores with float32 accumulation; float32 residual stream,
weights, weight gradients, moments, softmax statistics and loss) against PyTorch under bf16 autocast
(bf16 activations, bf16 FlashAttention); MFU against the dense bf16 rate, 989.4 TFLOP/s.
--precision fp8: ours as bf16 but with the MLP's and the heads' products in FP8 (e4m3 activations and
weights, e5m2 gradients; run.precision = "fp8") against the same PyTorch bf16 autocast step: not like for
like in precision, so the loss check's tolerance is FP8's; MFU still against the dense bf16 rate. With
`--set train.fp8_scaling="delayed"` SwiGLU writes its FP8 operands directly, with delayed scales.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import cupy as cp
import numpy as np
import torch

import euler_kernels as ek
import euler_model
from euler_kernels.matmul import gemm_tuned
from euler_model import count_params, init_params, loss_and_grads
from euler_model.blocks import fp8_scale_formats
from euler_train.comm import Comm
from euler_train.config import ConfigError, TrainConfig, resolve_config
from euler_train.graph_step import GraphStep
from euler_train.optimizer import make_optimizer
from euler_train.runspec import model_overrides
from euler_train.step import EagerStep, StepOptions

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_model import torch_loss, torch_tables

TF32_PEAK = 494.7e12  # dense TF32 FLOP/s of an H100/H200 SXM (datasheet)
BF16_PEAK = 989.4e12  # dense bf16 FLOP/s of the same


def step_flops(cfg, batch: int) -> float:
    """6 N per token for the matmuls plus the causal attention's score and value products (x3 for bwd)."""
    tokens = batch * cfg.context
    attention = 3 * 2 * 2 * batch * cfg.n_layers * cfg.n_heads * cfg.context**2 * cfg.head_dim / 2
    return 6 * (count_params(cfg) - cfg.vocab_size * cfg.dim) * tokens + attention


def bench_config(args) -> tuple[dict, object]:
    """(run config, model config) of `--preset`, `--context` and every `--set`, through euler-train's own
    resolve_config (the --set parser, key and type checks) and model_overrides; the preset's vocabulary
    stays unless model.vocab_size is set. ConfigError or ValueError names the bad key."""
    overrides = list(args.set) + ([f"model.context={args.context}"] if args.context else [])
    flags = {"run.precision": args.precision} if args.precision else {}  # checked with the [train] keys
    cfg = resolve_config(args.preset, overrides=overrides, flags=flags)
    return cfg, euler_model.preset(cfg.model["preset"], **model_overrides(cfg))


def euler_step_fn(
    cfg,
    params,
    tokens,
    targets,
    train: TrainConfig,
    precision: ek.Precision,
    lr=3e-4,
    max_norm=1.0,
    graph=False,
    planned=True,
    sites=False,
    **changes,
):
    """euler-train's one training step (step.train_step) on a copy of the weights, run eagerly or captured
    as a CUDA graph (what `euler-train pretrain` uses on one GPU; `planned`: its memory laid out in one
    slab, else served by a pool as it comes), with the run config's [train] settings (optimizer,
    recompute) and `changes` to them, its products in `precision`; returns (step, its runner)."""
    params = {k: v.copy() for k, v in params.items()}
    train = dataclasses.replace(train, **changes)
    if train.optimizer != "adamw":  # bf16 gradients are AdamW's (train.bf16_grads)
        train.bf16_grads = False
    opt = make_optimizer(params, train)
    # train.fp8_scaling = "delayed" (--set, with --precision fp8): SwiGLU casts with delayed scales; the
    # graph's dry run measures their first maxima, an eager runner's first step does
    scales = ek.new_fp8_scales(fp8_scale_formats(cfg)) if train.fp8_scaling == "delayed" else None
    options = dataclasses.replace(StepOptions.from_train(train, precision), max_norm=max_norm)
    args = (cfg, params, opt, Comm(), options, scales)
    runner = GraphStep(*args, planned_memory=planned, memory_sites=sites) if graph else EagerStep(*args)
    micro = [(cp.asnumpy(tokens), cp.asnumpy(targets), None)]

    def step():
        loss, _, applied = runner.run(micro, [1.0], opt.hyper(lr))
        opt.t += int(applied)
        return loss

    return step, runner


class PoolPeak(cp.cuda.MemoryHook):
    """The most bytes `pool` had in use at once while the hook was on (its used_bytes after every
    allocation): for the captured step's pool, what the step needed at its peak, where total_bytes is what
    the pool holds, free blocks included."""

    name = "PoolPeak"

    def __init__(self, pool) -> None:
        self.pool, self.peak = pool, 0

    def malloc_postprocess(self, **kwargs) -> None:
        self.peak = max(self.peak, self.pool.used_bytes())


def torch_memory() -> tuple[int, int]:
    """PyTorch's (held, live) peaks since the last reset: reserved by its caching allocator, and in use."""
    return torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()


def state_bytes(runner) -> int:
    """Device memory of a step's weights and optimizer state."""
    return sum(a.nbytes for a in (*runner.params.values(), *runner.opt.state_tensors().values()))


def graph_bytes(runner) -> int:
    """Device memory a captured step holds: weights, optimizer state, and the graph's pool (the step's
    buffers and gradients, activations, temporaries)."""
    return state_bytes(runner) + runner.memory_bytes()


def profile_ops(step, steps: int = 3) -> None:
    """GPU time per op of our eager step: CUDA events around every euler-kernels op and cuBLAS call."""
    import euler_kernels as ek

    names = [n for n in dir(ek) if n.endswith(("_forward", "_backward"))]
    records: list[tuple[str, object, object]] = []
    originals = {}

    def wrap(module, name):
        fn = getattr(module, name)
        originals[(module, name)] = fn

        def timed_op(*args, **kwargs):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            out = fn(*args, **kwargs)
            end.record()
            records.append((name, start, end))
            return out

        setattr(module, name, timed_op)

    for name in names:
        wrap(ek, name)
    for name in ("sum_squares_many", "step_control", "adamw_update_ctl"):
        wrap(ek, name)
    try:
        step()  # warm-up
        cp.cuda.Device().synchronize()
        records.clear()
        begin, finish = cp.cuda.Event(), cp.cuda.Event()
        begin.record()
        for _ in range(steps):
            step()
        finish.record()
        finish.synchronize()
    finally:
        for (module, name), fn in originals.items():
            setattr(module, name, fn)
    total = cp.cuda.get_elapsed_time(begin, finish) / steps
    per_op: dict[str, list[float]] = {}
    for name, start, end in records:
        per_op.setdefault(name, []).append(cp.cuda.get_elapsed_time(start, end))
    print(f"\nGPU time per op, our eager step (mean of {steps} steps; step {total:.1f} ms):")
    print(f"{'op':>28} {'calls':>6} {'ms/step':>8} {'share':>6}")
    covered = 0.0
    for name, times in sorted(per_op.items(), key=lambda kv: -sum(kv[1])):
        ms = sum(times) / steps
        covered += ms
        print(f"{name:>28} {len(times) // steps:6d} {ms:8.2f} {100 * ms / total:5.1f}%")
    rest = total - covered
    print(f"{'(between ops: glue, gaps)':>28} {'':>6} {rest:8.2f} {100 * rest / total:5.1f}%")


def torch_step_fn(cfg, params, tokens, targets, compile_: bool, bf16: bool = False, lr=3e-4, max_norm=1.0):
    tp = {k: torch.nn.Parameter(torch.as_tensor(v, device="cuda").clone()) for k, v in params.items()}
    decay = [p for p in tp.values() if p.ndim >= 2]
    no_decay = [p for p in tp.values() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    tt, tg = torch.as_tensor(tokens, device="cuda"), torch.as_tensor(targets, device="cuda")
    mask = torch.ones(tg.shape, device="cuda")
    cos, sin = (a.cuda() for a in torch_tables(cfg))
    loss_fn = torch.compile(torch_loss) if compile_ else torch_loss

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):  # bf16 matmuls and attention
            loss = loss_fn(cfg, tp, tt, tg, mask, cos, sin)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tp.values(), max_norm)
        opt.step()
        return loss

    return step


def kernel_table(step, label: str, steps: int = 3, top: int = 25) -> None:
    """GPU time per CUDA kernel of `step` (ours replayed as a CUDA graph, or PyTorch's), as CUPTI sees
    every kernel on the device whoever launched it (torch.profiler, used here only as the measuring tool)."""
    from torch.profiler import ProfilerActivity, profile

    step()
    cp.cuda.Device().synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        cp.cuda.Device().synchronize()
        torch.cuda.synchronize()
    totals: dict[str, list[float]] = {}
    for row in prof.key_averages():  # kernels carry device time; runtime calls (cudaLaunchKernel...) none
        us = getattr(row, "self_device_time_total", None)
        us = row.self_cuda_time_total if us is None else us
        if us <= 0:
            continue
        name = row.key if len(row.key) < 60 else row.key[:57] + "..."
        entry = totals.setdefault(name, [0.0, 0])
        entry[0] += us / 1e3 / steps  # ms per step
        entry[1] += row.count
    total = sum(ms for ms, _ in totals.values())
    print(f"\nGPU kernels per step, {label} (CUPTI, {steps} steps; kernels sum to {total:.1f} ms):")
    print(f"{'kernel':>60} {'calls':>6} {'ms/step':>8} {'share':>6}")
    for name, (ms, calls) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{name:>60} {calls // steps:6d} {ms:8.2f} {100 * ms / total:5.1f}%")


def timed(step, steps: int) -> float:
    for _ in range(3):  # warm-up: compilation, allocator pools, cuBLAS handles
        step()
    cp.cuda.Device().synchronize()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    cp.cuda.Device().synchronize()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def print_gemm_choices() -> None:
    """Which kinds of bf16 product (M x N x K, transposes) run on a cuBLASLt candidate instead of
    cublasGemmEx's choice, as gemm_tuned timed them in this process."""
    choices = gemm_tuned.choices()
    lt = sorted(key[1:5] for key, i in choices.items() if i != gemm_tuned.GEMM_EX)  # (M, N, K, transposes)
    named = ", ".join(f"{m}x{n}x{k}{'T' if ta else 'N'}{'T' if tb else 'N'}" for m, n, k, (ta, tb) in lt)
    listed = f": {named}" if lt else ""
    print(f"bf16 products timed: {len(choices)} kinds, {len(lt)} on cuBLASLt candidates{listed}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="gpu", help="euler-train run preset (default: gpu)")
    parser.add_argument("--context", type=int, help="sequence length T (default: the preset's context)")
    parser.add_argument("--batch", type=int, help="sequences per step B (default: the preset's batch_size)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="as euler-train's, e.g. model.n_layers=8",
    )
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, default=True, help="also time torch.compile"
    )
    parser.add_argument("--profile", action="store_true", help="GPU time per op of our eager step")
    parser.add_argument(
        "--kernels", action="store_true", help="GPU time per kernel: our graph step and PyTorch's step"
    )
    parser.add_argument("--muon", action="store_true", help="also the graph step with --optimizer muon")
    parser.add_argument(
        "--memory-sites", action="store_true", help="what the graph step has alive at its peak, by call site"
    )
    parser.add_argument(
        "--pool-memory",
        action="store_true",
        help="also the graph step with its memory served by a pool as it comes, not the planned slab",
    )
    parser.add_argument("--recompute", action="store_true", help="also the graph step with train.recompute")
    parser.add_argument(
        "--precision",
        choices=["tf32", "bf16", "fp8"],
        help="bf16: our bf16 activations and matmuls vs PyTorch's bf16 autocast (default: the preset's); "
        "fp8: ours with the MLP and heads in FP8, PyTorch as for bf16",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    try:
        run, cfg = bench_config(args)
    except (ConfigError, ValueError) as err:
        sys.exit(f"bench_train_gpu: {err}")
    precision = args.precision or ("bf16" if run.run.precision == "bf16" else "tf32")
    batch = args.batch or run.train.batch_size
    bf16 = precision in ("bf16", "fp8")  # fp8: PyTorch's side is its bf16 step
    # how our products and attention are computed: the precision, and run.attention_kernel and
    # run.gemm_tuning as --set gives them (as euler-train's setup_device makes it)
    products = ek.Precision(precision, run.run.attention_kernel, run.run.gemm_tuning)
    peak = BF16_PEAK if bf16 else TF32_PEAK
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    params = init_params(cfg, seed=0, xp=cp)
    rng = np.random.default_rng(0)
    tokens = cp.asarray(rng.integers(0, cfg.vocab_size, (batch, cfg.context)))
    targets = cp.asarray(rng.integers(0, cfg.vocab_size, (batch, cfg.context + cfg.n_mtp_heads - 1)))
    train = run.train
    print(
        f"{torch.cuda.get_device_name()}: preset {args.preset} ({count_params(cfg) / 1e6:.1f}M params; dim "
        f"{cfg.dim}, {cfg.n_heads}/{cfg.n_kv_heads} heads of {cfg.head_dim}, {cfg.n_layers} layers, ffn "
        f"{cfg.ffn_dim}, vocab {cfg.vocab_size}, K {cfg.n_mtp_heads}), B={batch}, T={cfg.context}, "
        f"optimizer {train.optimizer}{', recompute' if train.recompute else ''}"
        f"{', activations kept' if train.keep_activations and bf16 else ''}"
        f"{', bf16 weight gradients' if train.bf16_grads else ''}, "
        + {
            "fp8": "fp8 (ours: bf16 activations, MLP and heads in FP8; PyTorch: bf16 autocast)",
            "bf16": "bf16 (ours: bf16 activations; PyTorch: autocast)",
        }.get(precision, "TF32 on both sides")
    )

    # same weights, same batch: the first losses must agree (TF32 on both sides: ~1e-3)
    loss_ours = float(loss_and_grads(cfg, params, tokens, targets, precision=products)[0])
    with torch.no_grad():
        weights = {k: torch.as_tensor(v, device="cuda") for k, v in params.items()}
        batch_t = (torch.as_tensor(tokens, device="cuda"), torch.as_tensor(targets, device="cuda"))
        mask = torch.ones(targets.shape, device="cuda")
        cos, sin = (a.cuda() for a in torch_tables(cfg))
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss_torch = float(torch_loss(cfg, weights, *batch_t, mask, cos, sin))
        del weights
    print(f"loss on the same weights: euler {loss_ours:.5f}, torch {loss_torch:.5f}")
    tolerance = {"fp8": 5e-2, "bf16": 2e-2}.get(precision, 2e-3)  # significant bits: fp8 3-4, bf16 8, TF32 11
    assert abs(loss_ours - loss_torch) < tolerance * loss_torch, (loss_ours, loss_torch)

    flops = step_flops(cfg, batch)
    rows = []
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()  # the check's activations
    ours_step, _ = euler_step_fn(cfg, params, tokens, targets, train, products)
    sec = timed(ours_step, args.steps)
    rows.append(("euler eager", sec, pool.total_bytes(), None))
    if args.profile:
        profile_ops(ours_step)
    del ours_step
    pool.free_all_blocks()  # the eager step's activations are not the graph's
    sites = args.memory_sites
    graph_step, graph = euler_step_fn(cfg, params, tokens, targets, train, products, graph=True, sites=sites)
    with PoolPeak(graph.pool) as pool_peak:  # the first step records the graph: every allocation of its pool
        graph_step()
    sec_graph = timed(graph_step, args.steps)
    mem_graph = graph_bytes(graph)
    live = state_bytes(graph) + pool_peak.peak
    if graph.plan_stats is not None:  # the body's requests are served by the slab, not the pool
        live += graph.plan_stats[2] + graph.dry_pool.total_bytes()
    rows.append(("euler CUDA graph", sec_graph, mem_graph, live))
    print(graph.memory_plan())
    for line in graph.memory_at_peak():
        print("  at the peak:", line)
    if args.kernels:
        kernel_table(graph_step, "euler CUDA graph")
    print_gemm_choices()
    del graph_step, graph
    if args.recompute:  # the cost of re-making each layer's activations in the backward, and what it saves
        rerun = not train.recompute
        step, runner = euler_step_fn(
            cfg, params, tokens, targets, train, products, graph=True, recompute=rerun
        )
        sec = timed(step, args.steps)
        mem = graph_bytes(runner)
        rows.append((f"euler CUDA graph, recompute {'on' if rerun else 'off'}", sec, mem, None))
        on, off = ((sec, mem), (sec_graph, mem_graph)) if rerun else ((sec_graph, mem_graph), (sec, mem))
        print(
            f"recompute's cost in the captured step: {100 * (on[0] / off[0] - 1):+.1f}% step time, "
            f"peak {on[1] / 2**30:.2f} GiB instead of {off[1] / 2**30:.2f} GiB"
        )
        del step, runner
    if args.pool_memory:  # the same step with its body's memory from the pool as it comes: the plan's gain
        step, runner = euler_step_fn(cfg, params, tokens, targets, train, products, graph=True, planned=False)
        sec, mem = timed(step, args.steps), graph_bytes(runner)
        rows.append(("euler CUDA graph, pool memory", sec, mem, None))
        print(
            f"the planned slab against the pool: held {mem_graph / 2**30:.2f} GiB instead of "
            f"{mem / 2**30:.2f} GiB, step time {100 * (sec_graph / sec - 1):+.1f}%"
        )
        del step, runner
    if args.muon:  # Muon's cost: Newton-Schulz (bf16 cuBLAS) on every block matrix, inside the same graph
        step, runner = euler_step_fn(
            cfg, params, tokens, targets, train, products, graph=True, optimizer="muon"
        )
        sec_muon = timed(step, args.steps)
        rows.append(("euler CUDA graph, Muon", sec_muon, graph_bytes(runner), None))
        print(f"Muon's overhead over the CUDA graph step: {100 * (sec_muon / sec_graph - 1):+.1f}%")
        del step, runner
    pool.free_all_blocks()
    torch.cuda.empty_cache()  # the loss check's blocks: not the step's
    torch_step = torch_step_fn(cfg, params, tokens, targets, compile_=False, bf16=bf16)
    torch.cuda.reset_peak_memory_stats()
    sec = timed(torch_step, args.steps)
    rows.append(("PyTorch eager", sec, *torch_memory()))
    del torch_step
    if args.compile:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        compiled = torch_step_fn(cfg, params, tokens, targets, compile_=True, bf16=bf16)
        sec = timed(compiled, args.steps)
        rows.append(("PyTorch compile", sec, *torch_memory()))
        if args.kernels:
            kernel_table(compiled, "PyTorch compile")
    tokens_per_step = batch * cfg.context
    mfu = {name: 100 * flops / sec / peak for name, sec, _, _ in rows}
    print(f"{'':>34} {'tokens/s':>10} {'step ms':>8} {'TFLOP/s':>8} {'MFU':>6}", end="")
    print(f" {'held GiB':>9} {'live GiB':>9}")
    for name, sec, held, live in rows:
        tflops = flops / sec / 1e12
        live_gib = "-" if live is None else f"{live / 2**30:.2f}"
        print(
            f"{name:>34} {tokens_per_step / sec:10.0f} {sec * 1e3:8.1f} {tflops:8.1f} "
            f"{mfu[name]:5.1f}% {held / 2**30:9.2f} {live_gib:>9}"
        )
    ours_rows = [r for r in rows if r[0].startswith("euler")]
    for ours_name, ours, _, _ in ours_rows:
        for name, sec, _, _ in rows[len(ours_rows) :]:
            print(
                f"{ours_name} / {name}: {sec / ours:.2f}x the throughput "
                f"(MFU {mfu[ours_name]:.1f}% vs {mfu[name]:.1f}%)"
            )


if __name__ == "__main__":
    main()
