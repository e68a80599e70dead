"""Launchers of every FlashAttention kernel: exact float32 (flash_attention.cu), TF32 tensor cores
(flash_attention_tf32.cu, a Precision's tf32_attention) and bf16 tensor cores for bf16 activations
(flash_attention_bf16.cu; on Hopper GPUs the wgmma kernels of flash_attention_sm90.py).

All take q (B, T, Hq, D), k and v (B, S, Hkv, D) with Hq a multiple of Hkv; query t sits at key position
S - T + t; forward saves only out and the log-sum-exp lse (B, Hq, T), backward recomputes the
probabilities. bf16 tensors are CuPy uint16 arrays of bfloat16 bit patterns (as `cast.to_bf16` writes
them). Everything runs on the current CuPy stream without host synchronisation and the only allocations
are the outputs (and delta), so a CUDA graph can capture them (compile them once before capturing).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.attention import flash_attention_sm90, tensor_map
from euler_kernels.attention.flash_attention_sm90 import kernel_sizes
from euler_kernels.cuda._module import THREADS, blocks, contiguous, get_kernel

HEAD_DIMS = (64, 128)  # the head sizes the kernels are compiled for (-D HEAD_DIM)


def flash_attention_supports(head_dim: int) -> bool:
    """Whether the GPU FlashAttention kernels take heads of this size (64 or 128); attention with other
    head sizes runs the blockwise NumPy-style code, on CuPy through its matmul.

    >>> flash_attention_supports(64), flash_attention_supports(96)
    (True, False)
    """
    return head_dim in HEAD_DIMS


def check_head_dim(fn: str, head_dim: int) -> None:
    """A ValueError naming `fn` unless `flash_attention_supports(head_dim)`."""
    if not flash_attention_supports(head_dim):
        sizes = " or ".join(str(d) for d in HEAD_DIMS)
        raise ValueError(f"{fn}: head_dim must be {sizes} on the GPU, got {head_dim}")


# --- float32: exact (flash_attention.cu) or TF32 (flash_attention_tf32.cu) ---------------------------
_TILE = 64
# (tf32, backward) -> (.cu file, kernel)
_FLOAT32_KERNELS = {
    (False, False): ("flash_attention.cu", "flash_attention_forward"),
    (False, True): ("flash_attention.cu", "flash_attention_backward"),
    (True, False): ("flash_attention_tf32.cu", "flash_attention_forward_tf32"),
    (True, True): ("flash_attention_tf32.cu", "flash_attention_backward_tf32"),
}


def _float32_smem(head_dim: int, backward: bool, tf32: bool) -> int:
    tile, pad = _TILE, head_dim + 1
    if tf32:  # see flash_attention_tf32.cu: KPAD = D + 4, VPAD = D + 8, PPAD = TILE + 4
        kpad, vpad, ppad = head_dim + 4, head_dim + 8, tile + 4
        if backward:
            return 4 * (4 * tile * kpad + 2 * tile * ppad + 2 * tile)
        return 4 * (2 * tile * kpad + tile * vpad + tile * ppad)
    if backward:
        return 4 * (4 * tile * pad + 2 * tile * (tile + 1) + 2 * tile)
    return 4 * (3 * tile * pad + tile * (tile + 1))


def _float32_kernel(head_dim: int, backward: bool, tf32: bool):
    check_head_dim("flash_attention", head_dim)
    source, name = _FLOAT32_KERNELS[bool(tf32), backward]
    kernel = get_kernel(source, name, HEAD_DIM=head_dim)
    kernel.max_dynamic_shared_size_bytes = _float32_smem(head_dim, backward, tf32)
    return kernel


def flash_attention_forward(q: Any, k: Any, v: Any, causal: bool, tf32: bool = False) -> tuple[Any, Any]:
    """q (B, T, Hq, D), k/v (B, S, Hkv, D) -> out (B, T, Hq, D), lse (B, Hq, T).

    tf32: the tensor-core (TF32) kernel, else the exact-fp32 one (a Precision's tf32_attention).
    """
    import cupy

    q, k, v = contiguous(q, k, v)
    B, T, Hq, D = q.shape
    out = cupy.empty_like(q)
    lse = cupy.empty((B, Hq, T), dtype=cupy.float32)
    kernel = _float32_kernel(D, backward=False, tf32=tf32)
    args = (out, lse, q, k, v, *kernel_sizes(q, k, causal))
    threads = 128 if tf32 else 256
    kernel((blocks(T, _TILE), Hq, B), (threads,), args, shared_mem=_float32_smem(D, False, tf32))
    return out, lse


def flash_attention_backward(
    dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, causal: bool, tf32: bool = False
) -> tuple[Any, Any, Any]:
    """Gradients (dq, dk, dv) of flash_attention_forward, from dout (like q), its inputs, out and lse."""
    import cupy

    dout, q, k, v, out = contiguous(dout, q, k, v, out)
    B, T, Hq, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    delta = cupy.empty((B, Hq, T), dtype=cupy.float32)
    n_rows = B * T * Hq
    delta_kernel = get_kernel("flash_attention.cu", "flash_attention_delta", HEAD_DIM=D)
    delta_args = (delta, dout, out, np.int32(T), np.int32(Hq), np.int64(n_rows))
    delta_kernel((blocks(n_rows * 32, THREADS),), (THREADS,), delta_args)
    dq = cupy.zeros_like(q)
    dk, dv = cupy.empty_like(k), cupy.empty_like(v)
    kernel = _float32_kernel(D, backward=True, tf32=tf32)
    args = (dq, dk, dv, q, k, v, dout, lse, delta, *kernel_sizes(q, k, causal))
    threads = 128 if tf32 else 256
    kernel((blocks(S, _TILE), Hkv, B), (threads,), args, shared_mem=_float32_smem(D, True, tf32))
    return dq, dk, dv


# --- bf16 (flash_attention_bf16.cu) ------------------------------------------------------------------
_BF16_SOURCE = "flash_attention_bf16.cu"
_BF16_THREADS = 128  # 4 warps
_BM = 64  # forward: query rows per block
_BN = 64  # key rows per tile (forward) and per block (backward)


def _bq(head_dim: int) -> int:
    """Backward query rows per tile: BQ in flash_attention_bf16.cu."""
    return 64 if head_dim == 64 else 32


def _bf16_smem_forward(head_dim: int) -> int:
    """Qs (BM, LD) + double-buffered Ks, Vs 2 x (BN, LD) bf16, LD = D + 8."""
    return 2 * (_BM + 4 * _BN) * (head_dim + 8)


def _bf16_smem_backward(head_dim: int) -> int:
    """Ks, Vs (BN, LD) + Qs, dOs 2 x (BQ, LD) + dS^T (BN, BQ + 8) bf16 + lse, delta 2 x BQ float32."""
    bq, ld = _bq(head_dim), head_dim + 8
    return 2 * (2 * _BN * ld + 4 * bq * ld + _BN * (bq + 8)) + 4 * 4 * bq


def _bf16_kernel(name: str, head_dim: int, smem: int = 0):
    kernel = get_kernel(_BF16_SOURCE, name, HEAD_DIM=head_dim)
    if smem:
        kernel.max_dynamic_shared_size_bytes = smem
    return kernel


def _check_bf16(q16: Any, k16: Any, v16: Any) -> None:
    if q16.ndim != 4 or k16.ndim != 4 or k16.shape != v16.shape:
        raise ValueError(
            f"flash_attention_bf16: q (B, T, Hq, D), k and v (B, S, Hkv, D); got "
            f"{q16.shape}, {k16.shape}, {v16.shape}"
        )
    (B, T, Hq, D), (Bk, S, Hkv, Dk) = q16.shape, k16.shape
    check_head_dim("flash_attention_bf16", D)
    if B != Bk or D != Dk or Hkv == 0 or Hq % Hkv or T > S:
        raise ValueError(
            f"flash_attention_bf16: q {q16.shape} does not fit k/v {k16.shape} "
            "(same B and D, Hq a multiple of Hkv, T <= S)"
        )
    for a in (q16, k16, v16):
        if a.dtype != np.uint16:
            raise ValueError(f"flash_attention_bf16: needs uint16 (bf16 bit patterns), got {a.dtype}")


def _inputs_bf16(sm90: bool, *arrays: Any) -> list[Any]:
    """q, k, v as the kernels take them: Hopper's (sm90) read them through tensor maps, which take heads of a
    wider row as they are (q, k, v as columns of the joint q/k/v product's rows); the others index C order."""
    import cupy

    return [a if sm90 and tensor_map.mappable(a) else cupy.ascontiguousarray(a) for a in arrays]


def flash_attention_forward_bf16(
    q16: Any, k16: Any, v16: Any, causal: bool, kernel: str = "auto"
) -> tuple[Any, Any]:
    """q16 (B, T, Hq, D), k16/v16 (B, S, Hkv, D) uint16 -> out16 (B, T, Hq, D) uint16, lse (B, Hq, T) float32.

    lse is the natural-log log-sum-exp of the scores scaled by D^-0.5. kernel: a Precision's
    attention_kernel (auto, sm90, mma; see flash_attention_sm90.py).
    """
    import cupy

    _check_bf16(q16, k16, v16)
    sm90 = flash_attention_sm90.use_sm90(kernel)
    q16, k16, v16 = _inputs_bf16(sm90, q16, k16, v16)
    B, T, Hq, D = q16.shape
    out16 = cupy.empty_like(q16)
    lse = cupy.empty((B, Hq, T), dtype=cupy.float32)
    if out16.size == 0:
        return out16, lse
    if sm90:  # Hopper: wgmma (the rule is in flash_attention_sm90.py)
        flash_attention_sm90.forward(q16, k16, v16, causal, out16, lse)
        return out16, lse
    smem = _bf16_smem_forward(D)
    kernel = _bf16_kernel("flash_attention_forward_bf16", D, smem)
    args = (out16, lse, q16, k16, v16, *kernel_sizes(q16, k16, causal))
    kernel((blocks(T, _BM), Hq, B), (_BF16_THREADS,), args, shared_mem=smem)
    return out16, lse


def flash_attention_backward_bf16(
    dout16: Any, q16: Any, k16: Any, v16: Any, out16: Any, lse: Any, causal: bool, kernel: str = "auto"
) -> tuple[Any, Any, Any]:
    """Gradients of flash_attention_forward_bf16: dout16 (uint16, like q16), the forward's inputs, out16 and
    lse -> float32 dq (B, T, Hq, D), dk, dv (B, S, Hkv, D); kernel as the forward's."""
    import cupy

    _check_bf16(q16, k16, v16)
    if dout16.shape != q16.shape or out16.shape != q16.shape or dout16.dtype != np.uint16:
        raise ValueError(f"flash_attention_bf16: dout and out must be uint16 like q {q16.shape}")
    dout16, out16, lse = (cupy.ascontiguousarray(a) for a in (dout16, out16, lse))
    sm90 = flash_attention_sm90.use_sm90(kernel)
    q16, k16, v16 = _inputs_bf16(sm90, q16, k16, v16)
    B, T, Hq, D = q16.shape
    S, Hkv = k16.shape[1], k16.shape[2]
    if q16.size == 0:
        return tuple(cupy.zeros(a.shape, dtype=cupy.float32) for a in (q16, k16, v16))
    dq = cupy.empty(q16.shape, dtype=cupy.float32)  # zeroed by the delta kernel; the backward adds into it
    dk = cupy.empty(k16.shape, dtype=cupy.float32)
    dv = cupy.empty(v16.shape, dtype=cupy.float32)
    delta = cupy.empty((B, Hq, T), dtype=cupy.float32)
    n_rows = B * T * Hq  # eight threads per row
    delta_args = (delta, dq, dout16, out16, np.int32(T), np.int32(Hq), np.int64(n_rows))
    _bf16_kernel("flash_attention_delta_bf16", D)((blocks(n_rows * 8, 256),), (256,), delta_args)
    if sm90:  # Hopper: wgmma
        flash_attention_sm90.backward(dout16, q16, k16, v16, lse, delta, causal, dq, dk, dv)
        return dq, dk, dv
    smem = _bf16_smem_backward(D)
    kernel = _bf16_kernel("flash_attention_backward_bf16", D, smem)
    args = (dq, dk, dv, q16, k16, v16, dout16, lse, delta, *kernel_sizes(q16, k16, causal))
    kernel((blocks(S, _BN), Hkv, B), (_BF16_THREADS,), args, shared_mem=smem)
    return dq, dk, dv
