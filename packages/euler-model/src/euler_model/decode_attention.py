"""Decode-shaped attention: one query row per sequence against a static, preallocated KV cache.

The cache holds `context` key slots per sequence; sequence b sees its keys 0..pos[b] (its own length, on
the device), so a batch of sequences of different lengths is one fixed-shape computation, the same at
every step (what a CUDA graph needs). Query heads are grouped under their key/value head (GQA) as in
euler_kernels' attention, so K and V are never repeated.

This is the NumPy/CuPy reference and the interface of a decode attention kernel (flash-decoding style:
keys split across blocks, partial softmaxes reduced); the kernel itself is not written yet, so on the GPU
this runs as CuPy element-wise products and reductions (capturable, but an (M, K, N) temporary per product).
"""

from __future__ import annotations

import math
from typing import Any

import euler_kernels as ek


def key_bias(keys: Any, pos: Any, dtype: Any) -> Any:
    """The additive mask (B, 1, 1, S): 0 for the keys 0..pos[b] a sequence sees, -inf for the rest.

    keys is arange(S) and pos (B,) each sequence's last position, both on the device.
    """
    xp = ek.get_array_module(pos)
    bias = xp.where(keys[None, :] <= pos[:, None], 0.0, -xp.inf).astype(dtype)  # (B, S)
    return bias[:, None, None, :]


def decode_attention(q: Any, k: Any, v: Any, bias: Any) -> Any:
    """softmax(q k^T / sqrt(D) + bias) v for one query per sequence.

    q (B, Hq, D); k and v the cache (B, Hkv, S, D) with Hq % Hkv == 0; bias (B, 1, 1, S) from key_bias.
    Returns (B, Hq, D); query head h reads key/value head h // (Hq // Hkv).

    >>> import numpy as np
    >>> q = np.ones((1, 2, 2)); k = np.ones((1, 1, 3, 2)); v = np.arange(6.0).reshape(1, 1, 3, 2)
    >>> decode_attention(q, k, v, key_bias(np.arange(3), np.array([1]), q.dtype)).tolist()
    [[[1.0, 2.0], [1.0, 2.0]]]
    """
    xp = ek.get_array_module(q)
    (b, hq, d), hkv = q.shape, k.shape[1]
    qs = (q * q.dtype.type(1.0 / math.sqrt(d))).reshape(b, hkv, hq // hkv, d)  # (B, Hkv, G, D), pre-scaled
    scores = _products(xp, qs, k.swapaxes(-1, -2))  # (B, Hkv, G, S)
    scores += bias
    scores -= scores.max(axis=-1, keepdims=True)
    p = xp.exp(scores, out=scores)  # key 0 is always seen: every row has a finite maximum
    out = _products(xp, p, v)  # (B, Hkv, G, D)
    out /= p.sum(axis=-1, keepdims=True)
    return out.reshape(b, hq, d)


def _products(xp: Any, a: Any, b: Any) -> Any:
    """The batched matrix product a @ b, (..., M, K) @ (..., K, N). On CuPy as a broadcast product summed
    over K, not CuPy's matmul: that one refuses to run while a stream is captured into a CUDA graph."""
    if xp.__name__ == "numpy":
        return a @ b
    return (a[..., :, :, None] * b[..., None, :, :]).sum(axis=-2)  # (..., M, K, N) summed over K
