"""Variants of the Hopper FlashAttention kernels (flash_attention_sm90.cu -D settings), timed in one run.

    python benchmarks/tune_attention_sm90.py

Forward: STAGES (2, or 3: P V of a tile pipelined under the next tile's softmax), BN (keys per tile, 128 or
192), PINGPONG 1 (the two warpgroups take turns to issue their products); FWD_ABLATE 1 and 2 leave out the
loads of K and V after the first tile (in the 3-stage loop only) / the exponentials (wrong results,
timing only: what each costs).
Each variant's output is compared with the default's. Backward: DQ_MODE 1 (dQ through shared memory and
bulk reductions instead of float4 atomics), PINGPONG 1, BWD_ABLATE 1 and 2 (leave out the dQ atomics / all
of dQ: timing only).
"""

from __future__ import annotations

import cupy as cp
import numpy as np
from bench_kernels_gpu import time_ms  # the same CUDA-event median as the other GPU benchmarks

from euler_kernels.cuda import cast, flash_attention_sm90
from euler_kernels.cuda.flash_attention import flash_attention_forward_bf16

ROWS = [(64, 12, 4, 2, 8192), (128, 16, 4, 2, 8192), (128, 16, 4, 8, 2048), (64, 12, 4, 32, 512)]
FORWARD = [
    {"STAGES": 2},
    {"STAGES": 3},
    {"BN": 192, "STAGES": 2},
    {"PINGPONG": 1},
    {"FWD_ABLATE": 1, "STAGES": 3},
    {"FWD_ABLATE": 2},
]
BACKWARD = [{}, {"DQ_MODE": 1}, {"PINGPONG": 1}, {"BWD_ABLATE": 1}, {"BWD_ABLATE": 2}]


def forward_variant(q, k, v, ref, lse, flops: float, tuning: dict) -> str:
    out, lse2 = cp.empty_like(q), cp.empty_like(lse)
    try:
        ms = time_ms(lambda: flash_attention_sm90.forward(q, k, v, True, out, lse2, **tuning))
    except Exception as error:  # a variant that does not compile or launch (too much shared memory)
        return f"  forward {tuning}: {str(error).splitlines()[0][:80]}"
    err = float(cp.abs(cast.from_bf16(out) - cast.from_bf16(ref)).max())
    return f"  forward {tuning!s:34} {ms:7.3f} ms {flops / ms / 1e9:5.0f} TF/s  max |diff| {err:.1e}"


def backward_variant(g, q, k, v, lse, delta, flops: float, tuning: dict) -> str:
    dq = cp.zeros(q.shape, cp.float32)
    dk, dv = cp.empty(k.shape, cp.float32), cp.empty(v.shape, cp.float32)
    ms = time_ms(lambda: flash_attention_sm90.backward(g, q, k, v, lse, delta, True, dq, dk, dv, **tuning))
    return f"  backward {tuning!s:33} {ms:7.3f} ms {2.5 * flops / ms / 1e9:5.0f} TF/s"


def main() -> None:
    for D, Hq, Hkv, B, T in ROWS:
        rng = np.random.default_rng(T)
        shapes = [(B, T, Hq, D), (B, T, Hkv, D), (B, T, Hkv, D), (B, T, Hq, D)]
        q, k, v, g = (cast.to_bf16(cp.asarray(rng.standard_normal(s, dtype=np.float32))) for s in shapes)
        flops = 4 * B * Hq * T * T * D / 2
        ref, lse = flash_attention_forward_bf16(q, k, v, True)
        delta = cp.asarray(rng.standard_normal((B, Hq, T), dtype=np.float32))
        print(f"D {D}, {Hq}/{Hkv} heads, {B} x {T}")
        for tuning in FORWARD:
            print(forward_variant(q, k, v, ref, lse, flops, tuning))
        for tuning in BACKWARD:
            print(backward_variant(g, q, k, v, lse, delta, flops, tuning))


if __name__ == "__main__":
    main()
