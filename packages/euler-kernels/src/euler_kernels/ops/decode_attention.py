"""Decode attention: one new token per sequence, appended to a static KV cache and attended over it.

The cache holds S key slots per sequence; sequence b is at position pos[b] (on the device) and sees its
keys 0..pos[b], so a batch of sequences of different lengths is one fixed-shape computation, the same at
every step (what a CUDA graph needs). Query heads are grouped under their key/value head (GQA) as in
`attention_forward`, so K and V are never repeated. Inference only: there is no backward.

On float32 CuPy arrays one kernel pair runs it (cuda/decode_attention.cu: RoPE, the cache write and a
flash-decoding split over the keys, then the merge of the splits), reading each row's own slots only.
Elsewhere (NumPy, float64 on the GPU) the reference below runs: rope_rows, an indexed write, and a
masked softmax over the first `window` slots, written as CuPy element-wise products and reductions on the
GPU (CuPy's matmul refuses to run while a stream is captured into a CUDA graph).
"""

from __future__ import annotations

import math
from typing import Any

from euler_kernels import cuda
from euler_kernels.backend import check_float, get_array_module, shape_error
from euler_kernels.cuda import decode_attention as decode_cuda
from euler_kernels.ops.rope import rope_rows


def decode_attention_kernel(k_cache: Any, n_heads: int) -> bool:
    """Whether decode_attention_forward runs its kernel for this cache (B, Hkv, S, D) and Hq query heads:
    then it reads each row's slots 0..pos[b] itself and `window` does not matter."""
    _, hkv, _, d = k_cache.shape
    return cuda.fused(k_cache) and decode_cuda.decode_attention_fits(d, n_heads, hkv)


def decode_attention_forward(
    qkv: Any,
    k_cache: Any,
    v_cache: Any,
    pos: Any,
    cos: Any,
    sin: Any,
    n_heads: int,
    window: int | None = None,
) -> Any:
    """softmax(q k^T / sqrt(D) + mask) v for each sequence's newest token, after writing its key and value.

    qkv (B, (Hq + 2 Hkv) D): each row's q, k and v projections side by side, RoPE not applied yet; k_cache
    and v_cache (B, Hkv, S, D), contiguous, get the rotated key and the value at slot pos[b] of row b (in
    place); pos (B,) int64 with every pos[b] < S; cos, sin the rope_tables (P, D/2), P > every pos[b].
    window: the reference reads only slots 0..window-1 (every pos[b] must be below it; None: all S).
    Returns (B, Hq * D); query head h reads key/value head h // (Hq // Hkv).

    >>> import numpy as np
    >>> from euler_kernels.ops.rope import rope_tables
    >>> cos, sin = rope_tables(2, 4, dtype=np.float64)
    >>> k, v = np.zeros((1, 1, 4, 2)), np.zeros((1, 1, 4, 2))
    >>> v[0, 0, 0] = [3.0, 5.0]
    >>> qkv = np.array([[0.0, 0.0, 0.0, 0.0, 1.0, 1.0]])  # q = k = 0, v = 1 (one head of 2)
    >>> out = decode_attention_forward(qkv, k, v, np.array([1]), cos, sin, 1)
    >>> out.tolist(), v[0, 0, 1].tolist()
    ([[2.0, 3.0]], [1.0, 1.0])
    """
    b, hkv, s, d = k_cache.shape
    if qkv.ndim != 2 or qkv.shape != (b, (n_heads + 2 * hkv) * d) or v_cache.shape != k_cache.shape:
        raise shape_error(
            "decode_attention_forward",
            f"qkv must be (B, (Hq + 2 Hkv) D) = ({b}, {(n_heads + 2 * hkv) * d}) and v_cache like k_cache",
            qkv=qkv,
            k_cache=k_cache,
            v_cache=v_cache,
        )
    if pos.shape != (b,) or n_heads % hkv:
        raise shape_error("decode_attention_forward", f"pos must be (B,) and Hkv divide {n_heads}", pos=pos)
    check_float("decode_attention_forward", qkv=qkv, k_cache=k_cache, v_cache=v_cache, cos=cos, sin=sin)
    in_place = k_cache.flags.c_contiguous and v_cache.flags.c_contiguous  # the kernel writes them as is
    if in_place and decode_attention_kernel(k_cache, n_heads):
        return decode_cuda.decode_attention(qkv, k_cache, v_cache, pos, cos, sin, n_heads).reshape(b, -1)
    return _reference(qkv, k_cache, v_cache, pos, cos, sin, n_heads, s if window is None else window)


def _reference(
    qkv: Any, k_cache: Any, v_cache: Any, pos: Any, cos: Any, sin: Any, hq: int, window: int
) -> Any:
    """decode_attention_forward in array operations, reading slots 0..window-1."""
    xp = get_array_module(qkv)
    b, hkv, _, d = k_cache.shape
    rows = xp.arange(b)
    at_pos = xp.take(cos, pos, axis=0), xp.take(sin, pos, axis=0)  # (B, D/2) each: every row's own angles
    qk = rope_rows(qkv[:, : (hq + hkv) * d].reshape(b, hq + hkv, d), *at_pos)  # (B, Hq + Hkv, D)
    k_cache[rows, :, pos] = qk[:, hq:]  # slot pos[b] of row b: (B, Hkv, D)
    v_cache[rows, :, pos] = qkv[:, (hq + hkv) * d :].reshape(b, hkv, d)
    k, v = k_cache[:, :, :window], v_cache[:, :, :window]  # (B, Hkv, W, D) views
    q = qk[:, :hq] * qkv.dtype.type(1.0 / math.sqrt(d))  # (B, Hq, D), pre-scaled
    scores = _products(xp, q.reshape(b, hkv, hq // hkv, d), k.swapaxes(-1, -2))  # (B, Hkv, G, W)
    hidden = xp.arange(window)[None, :] > pos[:, None]  # (B, W): row b sees slots 0..pos[b]
    scores = xp.where(hidden[:, None, None], -xp.inf, scores)  # where, not a masked write: capturable
    scores -= scores.max(axis=-1, keepdims=True)
    p = xp.exp(scores, out=scores)  # slot 0 is always seen: every row has a finite maximum
    out = _products(xp, p, v)  # (B, Hkv, G, D)
    out /= p.sum(axis=-1, keepdims=True)
    return out.reshape(b, hq * d)


def _products(xp: Any, a: Any, b: Any) -> Any:
    """The batched matrix product a @ b, (..., M, K) @ (..., K, N). On CuPy as a broadcast product summed
    over K, not CuPy's matmul: that one refuses to run while a stream is captured into a CUDA graph."""
    if xp.__name__ == "numpy":
        return a @ b
    return (a[..., :, :, None] * b[..., None, :, :]).sum(axis=-2)  # (..., M, K, N) summed over K
