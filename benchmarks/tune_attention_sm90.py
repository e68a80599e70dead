"""Variants of the Hopper FlashAttention backward (flash_attention_sm90.cu -D settings), timed in one run.

    python benchmarks/tune_attention_sm90.py

The variants are timed in turn, three rounds, and each line gives the fastest round: timed once each in a
fixed order, the first variant was the fastest by up to 10% on some rows, whatever it was (2026-12-04).
BWD_DQ_FIRST 0 waits for dK's and dV's products before dQ is staged (with BWD_OVERLAP 1 also P's
exponentials under dP^T's product and dS under dV's, the backward's order at D 128 before it was
warp-specialised); DQ_ONE_WG and BWD_RS_KV are choices that depend on the head dimension; BWD_HEAVY_FIRST 0
starts the blocks in the old order (each head's key blocks in turn); BWD_ABLATE 1 leaves out the dQ
reductions (wrong dq, timing only: what they cost). Each line also says how the variant's dq, dk, dv
differ from the default's. The forward's variants: FWD_PINGPONG 0 (the consumers issue their products
whenever they are ready instead of in turn) and Q_STAGES 1 (one Q buffer: the next item's Q is copied only
once this one's last S has been computed) and, at D 64, KV_STAGES 3 (three K and V buffers instead of two)
and the work-item layouts of flash_attention_sm90.forward_layout: FWD_CONSUMERS 2 or 3 consumer warpgroups,
FWD_GQA_PACK 1 (an item is 64 positions of three query heads of one kv head) or 0.
`--forward` times only those, `--backward` only the backward's.
docs/benchmarks/attention_gpu.md keeps the measurements of the variants that did not pay.
"""

from __future__ import annotations

import sys

import cupy as cp
import numpy as np
from bench_kernels_gpu import queued_ms  # the same CUDA-event median as the other GPU benchmarks

from euler_kernels.attention import flash_attention_sm90
from euler_kernels.attention.flash_attention import flash_attention_forward_bf16
from euler_kernels.cuda import cast
from euler_kernels.testing import relative_error

ROWS = [(64, 12, 4, 32, 512), (64, 12, 4, 8, 2048), (64, 12, 4, 2, 8192)]
ROWS += [(128, 16, 4, 32, 512), (128, 16, 4, 8, 2048), (128, 16, 4, 2, 8192)]
BACKWARD = {  # per head dimension: the default first
    64: [
        {},
        {"BWD_RS_KV": 0},
        {"DQ_ONE_WG": 0},
        {"BWD_DQ_FIRST": 0},
        {"BWD_DQ_FIRST": 0, "BWD_OVERLAP": 1},
        {"BWD_HEAVY_FIRST": 0},
        {"BWD_ABLATE": 1},
    ],
    128: [
        {},
        {"BWD_DQ_FIRST": 0},
        {"BWD_DQ_FIRST": 0, "BWD_OVERLAP": 1},
        {"BWD_HEAVY_FIRST": 0},
        {"BWD_ABLATE": 1},
    ],
}
FORWARD = {  # per head dimension: the default first (three K/V buffers do not fit at D 128)
    64: [
        {},
        {"FWD_CONSUMERS": 2, "FWD_GQA_PACK": 0},
        {"FWD_CONSUMERS": 3, "FWD_GQA_PACK": 0},
        {"FWD_CONSUMERS": 3, "FWD_GQA_PACK": 1},
        {"FWD_PINGPONG": 0},
        {"Q_STAGES": 1},
        {"KV_STAGES": 3},
    ],
    128: [{}, {"FWD_PINGPONG": 0}, {"Q_STAGES": 1}],
}
ROUNDS = 3


def forward_run(q, k, v, tuning: dict) -> tuple:
    """The variant's (out, lse) from one call, and a function that calls it again into the same arrays."""
    B, T, Hq, _ = q.shape
    out, lse = cp.empty(q.shape, cp.uint16), cp.empty((B, Hq, T), cp.float32)

    def call() -> None:
        flash_attention_sm90.forward(q, k, v, True, out, lse, **tuning)

    call()
    return (out.copy(), lse.copy()), call


def backward_run(g, q, k, v, lse, delta, tuning: dict) -> tuple:
    """The variant's (dq, dk, dv) from one call, and a function that calls it again into the same arrays."""
    dq = cp.zeros(q.shape, cp.float32)
    dk, dv = cp.empty(k.shape, cp.float32), cp.empty(v.shape, cp.float32)

    def call() -> None:
        flash_attention_sm90.backward(g, q, k, v, lse, delta, True, dq, dk, dv, **tuning)

    call()
    return (dq.copy(), dk.copy(), dv.copy()), call


def fastest(runs: list) -> list:
    """Each run's fastest of ROUNDS rounds, the runs timed in turn within a round."""
    best = [float("inf")] * len(runs)
    for _ in range(ROUNDS):
        for i, (_, call) in enumerate(runs):
            best[i] = min(best[i], queued_ms(call))
    return best


def difference(results: tuple, reference: tuple, names: tuple = ("dq", "dk", "dv")) -> str:
    """How each result (dq, dk, dv; or out, lse) differs from the default's: 'same bits' or the relative
    error (the tests' norm-wise measure)."""
    parts = []
    for name, a, b in zip(names, results, reference, strict=True):
        same = bool(cp.array_equal(a, b))
        if a.dtype == cp.uint16:  # bf16 bit patterns
            a, b = cast.from_bf16(a), cast.from_bf16(b)
        parts.append(f"{name} same bits" if same else f"{name} {relative_error(a, b):.1e}")
    return ", ".join(parts)


def main() -> None:
    forward_only, backward_only = "--forward" in sys.argv[1:], "--backward" in sys.argv[1:]
    for D, Hq, Hkv, B, T in ROWS:
        rng = np.random.default_rng(T)
        shapes = [(B, T, Hq, D), (B, T, Hkv, D), (B, T, Hkv, D), (B, T, Hq, D)]
        q, k, v, g = (cast.to_bf16(cp.asarray(rng.standard_normal(s, dtype=np.float32))) for s in shapes)
        flops = 4 * B * Hq * T * T * D / 2
        _, lse = flash_attention_forward_bf16(q, k, v, True, "sm90")  # the Hopper kernels' own lse
        delta = cp.asarray(rng.standard_normal((B, Hq, T), dtype=np.float32))
        print(f"D {D}, {Hq}/{Hkv} heads, {B} x {T}")
        if not backward_only:
            forwards = [forward_run(q, k, v, tuning) for tuning in FORWARD[D]]
            for tuning, ms, (results, _) in zip(FORWARD[D], fastest(forwards), forwards, strict=True):
                change = difference(results, forwards[0][0], ("out", "lse"))
                print(f"  forward  {tuning!s:33} {ms:7.3f} ms {flops / ms / 1e9:5.0f} TF/s  {change}")
        if forward_only:
            continue
        runs = [backward_run(g, q, k, v, lse, delta, tuning) for tuning in BACKWARD[D]]
        for tuning, (results, _), ms in zip(BACKWARD[D], runs, fastest(runs), strict=True):
            change = difference(results, runs[0][0])
            print(f"  backward {tuning!s:33} {ms:7.3f} ms {2.5 * flops / ms / 1e9:5.0f} TF/s  {change}")


if __name__ == "__main__":
    main()
