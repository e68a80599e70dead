"""Launchers for the bf16 tensor-core FlashAttention (flash_attention_bf16.cu).

bf16 tensors are CuPy uint16 arrays holding bfloat16 bit patterns (as `to_bf16` writes them). Everything
runs on the current CuPy stream without host synchronisation, and the only allocations are the outputs
(and delta), so both launchers can be captured in a CUDA graph (compile them once before capturing).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda._module import blocks, get_kernel

_SOURCE = "flash_attention_bf16.cu"
_THREADS = 128  # 4 warps
_BM = 64  # forward: query rows per block
_BN = 64  # key rows per tile (forward) and per block (backward)


def _bq(head_dim: int) -> int:
    """Backward query rows per tile: BQ in flash_attention_bf16.cu."""
    return 64 if head_dim == 64 else 32


def _smem_forward(head_dim: int) -> int:
    """Qs (BM, LD) + double-buffered Ks, Vs 2 x (BN, LD) bf16, LD = D + 8."""
    return 2 * (_BM + 4 * _BN) * (head_dim + 8)


def _smem_backward(head_dim: int) -> int:
    """Ks, Vs (BN, LD) + Qs, dOs 2 x (BQ, LD) + dS^T (BN, BQ + 8) bf16 + lse, delta 2 x BQ float32."""
    bq, ld = _bq(head_dim), head_dim + 8
    return 2 * (2 * _BN * ld + 4 * bq * ld + _BN * (bq + 8)) + 4 * 4 * bq


def _kernel(name: str, head_dim: int, smem: int = 0):
    kernel = get_kernel(_SOURCE, name, HEAD_DIM=head_dim)
    if smem:
        kernel.max_dynamic_shared_size_bytes = smem
    return kernel


def _check(q16: Any, k16: Any, v16: Any) -> None:
    if q16.ndim != 4 or k16.ndim != 4 or k16.shape != v16.shape:
        raise ValueError(
            f"flash_attention_bf16: q (B, T, Hq, D), k and v (B, S, Hkv, D); got "
            f"{q16.shape}, {k16.shape}, {v16.shape}"
        )
    (B, T, Hq, D), (Bk, S, Hkv, Dk) = q16.shape, k16.shape
    if D not in (64, 128):
        raise ValueError(f"flash_attention_bf16: head_dim must be 64 or 128, got {D}")
    if B != Bk or D != Dk or Hkv == 0 or Hq % Hkv or T > S:
        raise ValueError(
            f"flash_attention_bf16: q {q16.shape} does not fit k/v {k16.shape} "
            "(same B and D, Hq a multiple of Hkv, T <= S)"
        )
    for a in (q16, k16, v16):
        if a.dtype != np.uint16:
            raise ValueError(f"flash_attention_bf16: needs uint16 (bf16 bit patterns), got {a.dtype}")


def _sizes(q16: Any, k16: Any, causal: bool) -> tuple:
    """T, S, Hq, Hkv, scale, causal: the scalar kernel arguments."""
    _, T, Hq, D = q16.shape
    S, Hkv = k16.shape[1], k16.shape[2]
    return (np.int32(T), np.int32(S), np.int32(Hq), np.int32(Hkv), np.float32(D**-0.5), np.int32(causal))


def flash_attention_forward_bf16(q16: Any, k16: Any, v16: Any, causal: bool) -> tuple[Any, Any]:
    """q16 (B, T, Hq, D), k16/v16 (B, S, Hkv, D) uint16 -> out16 (B, T, Hq, D) uint16, lse (B, Hq, T) float32.

    Query t sits at key position S - T + t; lse is the natural-log log-sum-exp of the scores scaled by D^-0.5.
    """
    import cupy

    _check(q16, k16, v16)
    q16, k16, v16 = (cupy.ascontiguousarray(a) for a in (q16, k16, v16))
    B, T, Hq, D = q16.shape
    out16 = cupy.empty_like(q16)
    lse = cupy.empty((B, Hq, T), dtype=cupy.float32)
    if out16.size == 0:
        return out16, lse
    smem = _smem_forward(D)
    kernel = _kernel("flash_attention_forward_bf16", D, smem)
    args = (out16, lse, q16, k16, v16, *_sizes(q16, k16, causal))
    kernel((blocks(T, _BM), Hq, B), (_THREADS,), args, shared_mem=smem)
    return out16, lse


def flash_attention_backward_bf16(
    dout16: Any, q16: Any, k16: Any, v16: Any, out16: Any, lse: Any, causal: bool
) -> tuple[Any, Any, Any]:
    """Gradients of flash_attention_forward_bf16: dout16 (uint16, like q16), the forward's inputs, out16 and
    lse -> float32 dq (B, T, Hq, D), dk, dv (B, S, Hkv, D)."""
    import cupy

    _check(q16, k16, v16)
    if dout16.shape != q16.shape or out16.shape != q16.shape or dout16.dtype != np.uint16:
        raise ValueError(f"flash_attention_bf16: dout and out must be uint16 like q {q16.shape}")
    dout16, q16, k16, v16, out16, lse = (
        cupy.ascontiguousarray(a) for a in (dout16, q16, k16, v16, out16, lse)
    )
    B, T, Hq, D = q16.shape
    S, Hkv = k16.shape[1], k16.shape[2]
    dq = cupy.zeros(q16.shape, dtype=cupy.float32)  # the kernel adds into it with atomics
    if q16.size == 0:
        return dq, cupy.zeros(k16.shape, dtype=cupy.float32), cupy.zeros(v16.shape, dtype=cupy.float32)
    dk = cupy.empty(k16.shape, dtype=cupy.float32)
    dv = cupy.empty(v16.shape, dtype=cupy.float32)
    delta = cupy.empty((B, Hq, T), dtype=cupy.float32)
    n_rows = B * T * Hq  # eight threads per row
    delta_args = (delta, dout16, out16, np.int32(T), np.int32(Hq), np.int64(n_rows))
    _kernel("flash_attention_delta_bf16", D)((blocks(n_rows * 8, 256),), (256,), delta_args)
    smem = _smem_backward(D)
    kernel = _kernel("flash_attention_backward_bf16", D, smem)
    args = (dq, dk, dv, q16, k16, v16, dout16, lse, delta, *_sizes(q16, k16, causal))
    kernel((blocks(S, _BN), Hkv, B), (_THREADS,), args, shared_mem=smem)
    return dq, dk, dv
