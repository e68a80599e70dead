"""The bf16 step's matrix products, kind by kind: what gemm_tuned chose against every option it had, timed in
interleaved rounds, and PyTorch's matmul of the same sizes. How much of the step the product choices leave
on the table.

    python benchmarks/tune_gemm_gpu.py --preset 350m --context 1024 --batch 16 [--rounds 7 --reps 3]

One eager bf16 step of the preset is run first: gemm_tuned times each kind of product at its first call, as
in training, and every call is counted by kind (sizes, transposes, output type, alignment) and by whether it
adds into its output. Then, for each kind, on fresh random operands of its sizes, every option is timed
`--reps` calls at a time, the options taking turns for `--rounds` rounds (so a clock change or another
process moves them all alike), and the median round is kept: cublasGemmEx, each of cuBLASLt's first
`--candidates` heuristic candidates, and torch.matmul (bf16 out; float32 out for the weight gradients is not
what autocast writes, so that column is the bf16 one). The table prints microseconds per call; the totals
weigh each kind by its calls a step: the step's products as chosen, with the best option of each kind, and
with PyTorch's.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter

import cupy as cp
import numpy as np
import torch

import euler_kernels as ek
import euler_model
from euler_kernels.matmul import gemm, gemm_tuned
from euler_kernels.matmul.blas import CUDA_R_16BF

BF16 = ek.Precision("bf16")  # the step's products: bf16, each kind tuned at its first call


def count_step_products(cfg, batch: int) -> Counter:
    """{(key, accumulate): calls} of one eager bf16 forward and backward of cfg on random tokens (gemm_tuned
    makes its choices on the way)."""
    calls: Counter = Counter()
    real = gemm_tuned.run_tuned

    def counted(a, b, trans, out, out_type, accumulate, gemm_ex):
        calls[gemm_tuned.kind(a, b, trans, out, out_type), accumulate] += 1
        return real(a, b, trans, out, out_type, accumulate, gemm_ex)

    params = {k: cp.asarray(v) for k, v in euler_model.init_params(cfg, seed=0).items()}
    rng = np.random.default_rng(0)
    tokens = cp.asarray(rng.integers(0, cfg.vocab_size, (batch, cfg.context)))
    targets = cp.asarray(rng.integers(0, cfg.vocab_size, (batch, cfg.context + cfg.n_mtp_heads - 1)))
    gemm_tuned.run_tuned = counted
    try:
        euler_model.loss_and_grads(cfg, params, tokens, targets, precision=BF16)
    finally:
        gemm_tuned.run_tuned = real
    cp.cuda.Device().synchronize()
    return calls


def bf16_random(shape: tuple) -> cp.ndarray:
    return (cp.random.standard_normal(shape, dtype=cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)


def options(key: tuple, accumulate: bool, candidates: int) -> tuple[dict, str]:
    """({name: call} for one kind, the name of gemm_tuned's choice)."""
    _, m, n, k, trans, out_type, _ = key
    a = bf16_random((k, m) if trans[0] else (m, k))
    b = bf16_random((n, k) if trans[1] else (k, n))
    bf16_out = out_type == CUDA_R_16BF
    out = cp.zeros((m, n), dtype=cp.uint16 if bf16_out else cp.float32)

    def gemm_ex() -> None:  # untuned: cublasGemmEx whatever gemm_tuned chose
        gemm.gemm_bf16(
            a, b, trans[0], trans[1], out=out if accumulate else None, bf16_out=bf16_out, tuned=False
        )

    calls = {"cublasGemmEx": gemm_ex}
    product = gemm_tuned.candidates(key, candidates)
    for i in range(product.count):
        if product.run(i, a, b, out, accumulate) == 0:  # a candidate these operands can take
            calls[f"cuBLASLt #{i}"] = lambda i=i: product.run(i, a, b, out, accumulate)
    ta, tb = (torch.as_tensor(x.view(cp.int16), device="cuda").view(torch.bfloat16) for x in (a, b))
    ta, tb = (ta.T if trans[0] else ta), (tb.T if trans[1] else tb)
    calls["torch.matmul (bf16 out)"] = lambda: torch.matmul(ta, tb)
    choice = gemm_tuned.choices().get(key, gemm_tuned.GEMM_EX)
    return calls, "cublasGemmEx" if choice == gemm_tuned.GEMM_EX else f"cuBLASLt #{choice}"


def timed_rounds(calls: dict, rounds: int, reps: int) -> dict[str, float]:
    """Median microseconds per call of each option over `rounds` rounds of `reps` calls, options in turn."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call()  # untimed: first-call work
    for _ in range(rounds):
        for name, call in calls.items():
            torch.cuda.synchronize()
            samples[name].append(1000 * gemm_tuned.time_ms(call, reps) / reps)
    return {name: statistics.median(s) for name, s in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpu")
    parser.add_argument("--context", type=int, default=None)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--candidates", type=int, default=gemm_tuned.TUNE_CANDIDATES)
    args = parser.parse_args()
    overrides = {"context": args.context} if args.context else {}
    cfg = euler_model.preset(args.preset, **overrides)
    calls = count_step_products(cfg, args.batch)
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    total = sum(calls.values())
    print(f"{name}: preset {args.preset}, B={args.batch}, T={cfg.context}; {total} products a step")
    head = ("M x N x K op out (adds)", "calls", "chosen", "us", "best", "us", "torch us")
    print(f"{head[0]:34} {head[1]:>5} {head[2]:>16} {head[3]:>8} {head[4]:>16} {head[5]:>8} {head[6]:>9}")
    chosen_total = best_total = torch_total = 0.0
    for (key, accumulate), count in sorted(calls.items(), key=lambda kv: -kv[1]):
        _, m, n, k, trans, out_type, _ = key
        opts, chosen = options(key, accumulate, args.candidates)
        us = timed_rounds(opts, args.rounds, args.reps)
        ours = {o: t for o, t in us.items() if not o.startswith("torch")}
        best = min(ours, key=ours.get)
        torch_us = us["torch.matmul (bf16 out)"]
        chosen_total += count * us[chosen]
        best_total += count * ours[best]
        torch_total += count * torch_us
        ops = "".join("T" if t else "N" for t in trans)
        out = "bf16" if out_type == CUDA_R_16BF else "f32"
        label = f"{m} x {n} x {k} {ops} {out}{' +=' if accumulate else ''}"
        row = f"{count:5} {chosen:>16} {us[chosen]:8.1f} {best:>16} {ours[best]:8.1f} {torch_us:9.1f}"
        print(f"{label:34} {row}")
    print(
        f"products a step: as chosen {chosen_total / 1000:.2f} ms, best option of each kind "
        f"{best_total / 1000:.2f} ms, torch.matmul {torch_total / 1000:.2f} ms"
    )


if __name__ == "__main__":
    main()
