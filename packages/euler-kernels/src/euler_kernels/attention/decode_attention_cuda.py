"""Launcher of decode_attention.cu: RoPE, the cache write and attention of one decode step, two launches."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from euler_kernels.cuda._module import contiguous, get_kernel

_SMEM_LIMIT = 48 * 1024  # bytes of shared memory a block gets without opting in


def slots_per_block(head_dim: int) -> int:
    """Cache slots per split block: 2048 / D clipped to 16..64 (D 64: 32 slots, D 128: 16)."""
    return max(16, min(64, 2048 // head_dim))


def _threads(head_dim: int, rows: int) -> int:
    """Threads of a split block: 256 when its `rows` query rows (G query heads x T new tokens) have more
    than 128 pieces of 4 output values, else 128 (one new token a row)."""
    return 256 if rows * head_dim // 4 > 128 else 128


def _smem(head_dim: int, rows: int) -> int:
    """Bytes of shared memory of a split block (see decode_attention.cu): keys (rows padded), values, and
    for its `rows` query rows the queries and scores."""
    slots, pad = slots_per_block(head_dim), 4 if head_dim % 4 == 0 else 1
    return 4 * (slots * (head_dim + pad) + slots * head_dim + rows * head_dim + rows * slots)


def decode_attention_fits(head_dim: int, n_heads: int, n_kv_heads: int, new_tokens: int = 1) -> bool:
    """Whether the kernel takes this head layout: D even and at most 256, a block's shared memory in 48 KB."""
    even = head_dim % 2 == 0 and 0 < head_dim <= 256 and n_heads % n_kv_heads == 0
    return even and _smem(head_dim, n_heads // n_kv_heads * new_tokens) <= _SMEM_LIMIT


def decode_attention(
    qkv: Any,
    k_cache: Any,
    v_cache: Any,
    pos: Any,
    cos: Any,
    sin: Any,
    n_heads: int,
    bf16_out: bool = False,
    masks: list[int] | None = None,
) -> Any:
    """qkv (B, T, (Hq + 2 Hkv) D) float32, caches (B, Hkv, S, D) float32 (contiguous, written in place at
    pos[b] .. pos[b] + T - 1), pos (B,) int64, tables (P, D/2) float32 -> out (B, T, Hq, D) float32, or
    bf16 with bf16_out. masks: a draft tree's ancestor masks (draft_tree.ancestors, T <= 8), None a chain."""
    import cupy

    qkv, cos, sin = contiguous(qkv, cos, sin)
    b, hkv, s, d = k_cache.shape
    t = qkv.shape[1]
    slots = slots_per_block(d)
    splits = -(-s // slots)
    part_acc = cupy.empty((b, n_heads, t, splits, d), dtype=cupy.float32)
    part_ml = cupy.empty((b, n_heads, t, splits, 2), dtype=cupy.float32)
    out = cupy.empty((b, t, n_heads, d), dtype=cupy.uint16 if bf16_out else cupy.float32)
    rows = n_heads // hkv * t
    threads = _threads(d, rows)
    defines = {"HEAD_DIM": d, "SLOTS": slots, "THREADS": threads}
    split = get_kernel("decode_attention.cu", "decode_attention_split", **defines)
    tree = sum(m << (8 * i) for i, m in enumerate(masks)) if masks is not None else 0  # a byte per token
    sizes = (np.int32(n_heads), np.int32(hkv), np.int32(s), np.int32(t), np.float32(1.0 / math.sqrt(d)))
    args = (part_acc, part_ml, k_cache, v_cache, qkv, cos, sin, pos, *sizes, np.uint64(tree))
    split((splits, hkv, b), (threads,), args, shared_mem=_smem(d, rows))
    name = "decode_attention_reduce_bf16" if bf16_out else "decode_attention_reduce"
    reduce = get_kernel("decode_attention.cu", name, HEAD_DIM=d, SLOTS=slots)
    reduce(
        (b * n_heads * t,),
        (d,),
        (out, part_acc, part_ml, pos, np.int32(n_heads), np.int32(t), np.int32(splits)),
    )
    return out
