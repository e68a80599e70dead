"""Variants of the Hopper FlashAttention backward (flash_attention_sm90.cu -D settings), timed in one run.

    python benchmarks/tune_attention_sm90.py

BWD_HEAVY_FIRST 0 starts the backward's blocks in the old order (each head's key blocks in turn) instead of
heaviest first. BWD_ABLATE 1 leaves out the dQ reductions (wrong dq, timing only: what they cost). The
forward is timed as it is (it has no variants left). The backward's DQ_MODE and PINGPONG went with the
cp.async kernels they tuned, BWD_PIPELINE and FWD_ACROSS_ITEMS did not pay (docs/benchmarks/attention_gpu.md
keeps their measurements).
"""

from __future__ import annotations

import cupy as cp
import numpy as np
from bench_kernels_gpu import queued_ms  # the same CUDA-event median as the other GPU benchmarks

from euler_kernels.cuda import cast, flash_attention_sm90
from euler_kernels.cuda.flash_attention import flash_attention_forward_bf16

ROWS = [(64, 12, 4, 32, 512), (64, 12, 4, 8, 2048), (64, 12, 4, 2, 8192)]
ROWS += [(128, 16, 4, 32, 512), (128, 16, 4, 8, 2048), (128, 16, 4, 2, 8192)]
BACKWARD = [{}, {"BWD_HEAVY_FIRST": 0}, {"BWD_ABLATE": 1}]


def forward_time(q, k, v, flops: float) -> str:
    B, T, Hq, _ = q.shape
    out, lse = cp.empty(q.shape, cp.uint16), cp.empty((B, Hq, T), cp.float32)
    ms = queued_ms(lambda: flash_attention_sm90.forward(q, k, v, True, out, lse))
    return f"  forward  {'':33} {ms:7.3f} ms {flops / ms / 1e9:5.0f} TF/s"


def backward_variant(g, q, k, v, lse, delta, flops: float, tuning: dict) -> str:
    dq = cp.zeros(q.shape, cp.float32)
    dk, dv = cp.empty(k.shape, cp.float32), cp.empty(v.shape, cp.float32)
    ms = queued_ms(lambda: flash_attention_sm90.backward(g, q, k, v, lse, delta, True, dq, dk, dv, **tuning))
    return f"  backward {tuning!s:33} {ms:7.3f} ms {2.5 * flops / ms / 1e9:5.0f} TF/s"


def main() -> None:
    for D, Hq, Hkv, B, T in ROWS:
        rng = np.random.default_rng(T)
        shapes = [(B, T, Hq, D), (B, T, Hkv, D), (B, T, Hkv, D), (B, T, Hq, D)]
        q, k, v, g = (cast.to_bf16(cp.asarray(rng.standard_normal(s, dtype=np.float32))) for s in shapes)
        flops = 4 * B * Hq * T * T * D / 2
        _, lse = flash_attention_forward_bf16(q, k, v, True)
        delta = cp.asarray(rng.standard_normal((B, Hq, T), dtype=np.float32))
        print(f"D {D}, {Hq}/{Hkv} heads, {B} x {T}")
        print(forward_time(q, k, v, flops))
        for tuning in BACKWARD:
            print(backward_variant(g, q, k, v, lse, delta, flops, tuning))


if __name__ == "__main__":
    main()
