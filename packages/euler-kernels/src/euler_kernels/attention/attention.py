"""Causal grouped-query attention, blockwise with an online softmax (FlashAttention-2 style).

Layout inside: query heads are grouped under their key/value head, q (B, T, Hq, D) becomes
(B, Hkv, T * G, D) with row r = t * G + g (G = Hq // Hkv), so one batched matmul serves a whole group
and K/V are never repeated. Query t sits at key position S - T + t. Scores are built one
(block_size * G, block_size) tile per KV head at a time; forward keeps a running max, sum and
output; only q, k, v, out and the per-row log-sum-exp are saved, and backward recomputes each tile.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np

from euler_kernels import cuda
from euler_kernels.attention import flash_attention
from euler_kernels.backend import (
    bf16_bits,
    check_activations,
    check_float,
    get_array_module,
    is_bf16,
    shape_error,
)
from euler_kernels.cuda import cast
from euler_kernels.precision import EXACT, Precision


class AttentionCache(NamedTuple):
    """attention_forward's cache on the array operations (NumPy, or CuPy float64), in the grouped layout."""

    q_scaled: Any  # (B, Hkv, T * G, D) q / sqrt(D)
    k_t: Any  # (B, Hkv, S, D)
    v_t: Any  # (B, Hkv, S, D)
    out: Any  # (B, Hkv, T * G, D)
    lse: Any  # (B, Hkv, T * G) log-sum-exp of each row's scores
    causal: bool
    block_size: int
    t: int  # query positions T


class AttentionKernelCache(NamedTuple):
    """attention_forward's cache on the GPU kernels (float32 or bf16), in the (B, T, H, D) layout."""

    q: Any
    k: Any
    v: Any
    out: Any
    lse: Any  # (B, Hq, T) float32
    causal: bool
    precision: Precision  # the backward runs the forward's kernels


def _validate(q: Any, k: Any, v: Any, block_size: int, host: bool) -> None:
    fn = "attention_forward"
    if host:
        check_float(fn, q=q, k=k, v=v)
    else:
        check_activations(fn, q=q, k=k, v=v)
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape:
        raise shape_error(fn, "q must be (B, T, Hq, D), k and v (B, S, Hkv, D)", q=q, k=k, v=v)
    (b, _, hq, d), (bk, s, hkv, dk) = q.shape, k.shape
    if b != bk or d != dk or hkv == 0 or hq % hkv:
        raise shape_error(fn, "batch and head_dim must agree and Hq must be a multiple of Hkv", q=q, k=k, v=v)
    if q.shape[1] > s or q.shape[1] == 0:
        raise shape_error(fn, "need 1 <= T <= S (queries are the last T of S positions)", q=q, k=k)
    if block_size < 1:
        raise ValueError(f"{fn}: block_size must be >= 1, got {block_size}")


def _group_queries(xp: Any, q: Any, hkv: int) -> Any:
    # (B, T, Hq, D) -> (B, Hkv, T * G, D), row r = t * G + g
    b, t, hq, d = q.shape
    g = hq // hkv
    return xp.ascontiguousarray(q.reshape(b, t, hkv, g, d).transpose(0, 2, 1, 3, 4)).reshape(b, hkv, t * g, d)


def _ungroup(xp: Any, x: Any, t: int, hq: int) -> Any:
    # (B, Hkv, T * G, D) -> (B, T, Hq, D)
    b, hkv, _, d = x.shape
    grouped = x.reshape(b, hkv, t, hq // hkv, d).transpose(0, 2, 1, 3, 4)  # (B, T, Hkv, G, D)
    return xp.ascontiguousarray(grouped).reshape(b, t, hq, d)


def _causal_bias(xp: Any, dtype: Any, t0: int, t1: int, s0: int, s1: int, g: int, shift: int) -> Any:
    """(rows, keys) additive mask for queries t0..t1 and keys s0..s1: 0 where allowed, -inf above."""
    device = 0 if xp.__name__ == "numpy" else xp.cuda.runtime.getDevice()  # one cache entry per GPU
    return _cached_bias(xp, device, xp.dtype(dtype).str, t0, t1, s0, s1, g, shift)


@functools.lru_cache(maxsize=32)
def _cached_bias(
    xp: Any, device: int, dtype: str, t0: int, t1: int, s0: int, s1: int, g: int, shift: int
) -> Any:
    # the same few tiles recur in every layer and step, so they are built once (and only read)
    limit = xp.arange(t0, t1).repeat(g) + shift  # (rows,) last key each query may see
    keys = xp.arange(s0, s1)  # (Sb,)
    bias = xp.zeros((limit.shape[0], s1 - s0), dtype=dtype)
    bias[keys[None, :] > limit[:, None]] = -xp.inf
    return bias


_CPU_TILE_BYTES = 1 << 20  # score tiles of about this size stay in the CPU's L2 cache


def _batch_chunks(xp: Any, b: int, hkv: int, rows: int, cols: int, itemsize: int):
    """Batch slices processed together: on NumPy, few enough that one score tile fits the cache budget;
    on CuPy the whole batch at once."""
    per_batch = max(1, hkv * rows * cols * itemsize)
    step = b if xp.__name__ != "numpy" else max(1, min(b, _CPU_TILE_BYTES // per_batch))
    for b0 in range(0, b, step):
        yield slice(b0, min(b0 + step, b))


def _query_block(xp: Any, block_size: int, causal: bool) -> int:
    """Query positions per block: block_size, or on NumPy with the causal mask a quarter of it. Each
    query block reads keys only up to its own last position, so narrower blocks skip most of the masked
    part of the diagonal tiles: 62.5 % of a T = block_size causal square is computed instead of all of it."""
    return max(1, block_size // 4) if causal and xp.__name__ == "numpy" else block_size


def _key_blocks(t0: int, t1: int, s: int, shift: int, causal: bool, bs: int):
    """Key blocks (s0, s1, needs_mask) visible to queries t0..t1."""
    last = min(s, t1 - 1 + shift + 1) if causal else s  # keys beyond this are masked for every row
    for s0 in range(0, last, bs):
        s1 = min(s0 + bs, last)
        yield s0, s1, causal and s1 - 1 > t0 + shift


def attention_forward(
    q: Any, k: Any, v: Any, causal: bool = True, block_size: int = 128, precision: Precision = EXACT
) -> tuple[Any, AttentionCache | AttentionKernelCache]:
    """Scaled dot-product attention, softmax(q k^T / sqrt(D)) v, over grouped KV heads.

    q (B, T, Hq, D), k and v (B, S, Hkv, D) with Hq % Hkv == 0; out (B, T, Hq, D).
    bf16 activations (GPU, D 64 or 128) run the bf16 tensor-core kernel: out is bf16, lse float32, and
    the gradients dq, dk, dv float32.
    precision (GPU): which bf16 kernels run (its attention_kernel), and whether float32 attention runs
    on the TF32 tensor cores (its tf32_attention); the backward follows the forward's.

    >>> import numpy as np
    >>> q = k = v = np.ones((1, 2, 1, 2))
    >>> attention_forward(q, k, v)[0][0, :, 0].tolist()
    [[1.0, 1.0], [1.0, 1.0]]
    """
    host = type(q) is np.ndarray  # NumPy: the array operations below, nothing else to choose
    if not host:  # a CuPy bfloat16 array as its bit patterns
        q, k, v = bf16_bits(q), bf16_bits(k), bf16_bits(v)
    _validate(q, k, v, block_size, host)
    if not host and is_bf16(q):
        flash_attention.check_head_dim("attention_forward", q.shape[-1])  # bf16 has no other path
        kernel = precision.attention_kernel
        out, lse = flash_attention.flash_attention_forward_bf16(q, k, v, causal, kernel)  # bf16 (B, T, Hq, D)
        return out, AttentionKernelCache(q, k, v, out, lse, causal, precision)
    # the hand-written kernel
    if not host and cuda.float32_on_gpu(q, k, v) and flash_attention.flash_attention_supports(q.shape[-1]):
        tf32 = precision.tf32_attention
        out, lse = flash_attention.flash_attention_forward(q, k, v, causal, tf32)  # (B, T, Hq, D), (B, Hq, T)
        return out, AttentionKernelCache(q, k, v, out, lse, causal, precision)
    xp = np if host else get_array_module(q)
    (_, t, hq, d), hkv = q.shape, k.shape[2]
    g, shift, scale = hq // hkv, k.shape[1] - t, 1.0 / math.sqrt(d)
    qs = _group_queries(xp, q * q.dtype.type(scale), hkv)  # (B, Hkv, T*G, D), pre-scaled
    kt = xp.ascontiguousarray(k.transpose(0, 2, 1, 3))  # (B, Hkv, S, D)
    vt = xp.ascontiguousarray(v.transpose(0, 2, 1, 3))  # (B, Hkv, S, D)
    out = xp.empty_like(qs)
    lse = xp.empty(qs.shape[:-1], dtype=q.dtype)  # (B, Hkv, T*G)
    qb = _query_block(xp, block_size, causal)
    tile_rows, tile_cols = min(qb, t) * g, min(block_size, k.shape[1])
    for bi in _batch_chunks(xp, q.shape[0], hkv, tile_rows, tile_cols, q.dtype.itemsize):
        for t0 in range(0, t, qb):
            t1 = min(t0 + qb, t)
            r = slice(t0 * g, t1 * g)  # this query block's rows
            o, lse[bi, :, r] = _forward_rows(
                xp, qs[bi, :, r], kt[bi], vt[bi], t0, t1, g, shift, causal, block_size
            )
            out[bi, :, r] = o
    return _ungroup(xp, out, t, hq), AttentionCache(qs, kt, vt, out, lse, causal, block_size, t)


def _forward_rows(xp, qb, kt, vt, t0, t1, g, shift, causal, bs):
    """Online softmax over key blocks for one query block qb (B, Hkv, R, D) -> (out, lse)."""
    m = l = o = None
    for s0, s1, masked in _key_blocks(t0, t1, kt.shape[2], shift, causal, bs):
        sc = qb @ kt[:, :, s0:s1].swapaxes(-1, -2)  # (B, Hkv, R, Sb) scores
        if masked:
            sc += _causal_bias(xp, sc.dtype, t0, t1, s0, s1, g, shift)
        m_new = sc.max(axis=-1) if m is None else xp.maximum(m, sc.max(axis=-1))  # (B, Hkv, R)
        sc -= m_new[..., None]
        p = xp.exp(sc, out=sc)  # (B, Hkv, R, Sb)
        pv = p @ vt[:, :, s0:s1]  # (B, Hkv, R, D)
        if m is None:
            l, o = p.sum(axis=-1), pv
        else:
            corr = xp.exp(m - m_new)  # rescale what was accumulated under the old max
            l = l * corr + p.sum(axis=-1)
            o = o * corr[..., None] + pv
        m = m_new
    o /= l[..., None]
    return o, m + xp.log(l)


def attention_backward(dout: Any, cache: AttentionCache | AttentionKernelCache) -> tuple[Any, Any, Any]:
    """(dq, dk, dv) shaped like q, k, v; probabilities are recomputed tile by tile from the saved lse."""
    host = type(dout) is np.ndarray  # NumPy: the array operations below, nothing else to choose
    if type(cache) is AttentionKernelCache:
        dout = bf16_bits(dout)  # a CuPy bfloat16 array as its bit patterns
        q, k, v, out, lse, causal = cache.q, cache.k, cache.v, cache.out, cache.lse, cache.causal
        if dout.shape != q.shape:
            raise shape_error("attention_backward", f"dout must be {q.shape}", dout=dout)
        if is_bf16(q):  # the bf16 kernel reads a bf16 dout
            dout = cast.as_bf16(dout)
            kernel = cache.precision.attention_kernel
            return flash_attention.flash_attention_backward_bf16(dout, q, k, v, out, lse, causal, kernel)
        tf32 = cache.precision.tf32_attention
        return flash_attention.flash_attention_backward(dout, q, k, v, out, lse, causal, tf32)
    qs, kt, vt, out, lse = cache.q_scaled, cache.k_t, cache.v_t, cache.out, cache.lse
    causal, bs, t = cache.causal, cache.block_size, cache.t
    xp = np if host else get_array_module(dout)
    b, hkv, rows, d = qs.shape
    g, hq, s = rows // t, rows // t * hkv, kt.shape[2]
    if dout.shape != (b, t, hq, d):
        raise shape_error("attention_backward", f"dout must be {(b, t, hq, d)}", dout=dout)
    do = _group_queries(xp, dout, hkv)  # (B, Hkv, T*G, D)
    delta = xp.einsum("bhrd,bhrd->bhr", do, out)  # (B, Hkv, T*G) rowsum(dO * O)
    dq = xp.zeros_like(qs)
    dk = xp.zeros_like(kt)
    dv = xp.zeros_like(vt)
    saved, grads = (qs, kt, vt, do, lse, delta), (dq, dk, dv)
    qb = _query_block(xp, bs, causal)
    for bi in _batch_chunks(xp, b, hkv, min(qb, t) * g, min(bs, s), qs.dtype.itemsize):
        for t0 in range(0, t, qb):
            t1 = min(t0 + qb, t)
            qi = (bi, slice(None), slice(t0 * g, t1 * g))  # this query block's rows
            for s0, s1, masked in _key_blocks(t0, t1, s, s - t, causal, bs):
                ki = (bi, slice(None), slice(s0, s1))  # this key block's rows
                _backward_tile(xp, qi, ki, saved, grads, (t0, t1, s0, s1, g, s - t) if masked else None)
    dq *= dq.dtype.type(1.0 / math.sqrt(d))
    return _ungroup(xp, dq, t, hq), dk.transpose(0, 2, 1, 3).copy(), dv.transpose(0, 2, 1, 3).copy()


def _backward_tile(xp: Any, qi: tuple, ki: tuple, saved: tuple, grads: tuple, mask: tuple | None) -> None:
    """Accumulate one (query block qi, key block ki) tile's share of dq, dk, dv (FlashAttention-2)."""
    qs, kt, vt, do, lse, delta = saved
    dq, dk, dv = grads
    kb, vb, qb, dob = kt[ki], vt[ki], qs[qi], do[qi]
    sc = qb @ kb.swapaxes(-1, -2)  # (b, Hkv, R, Sb) scores, q pre-scaled
    if mask is not None:
        sc += _causal_bias(xp, sc.dtype, *mask)
    sc -= lse[qi][..., None]
    p = xp.exp(sc, out=sc)  # probabilities of this tile
    dv[ki] += p.swapaxes(-1, -2) @ dob  # (b, Hkv, Sb, D)
    ds = dob @ vb.swapaxes(-1, -2)  # dP (b, Hkv, R, Sb)
    ds -= delta[qi][..., None]
    ds *= p  # dS = P * (dP - delta)
    dq[qi] += ds @ kb
    dk[ki] += ds.swapaxes(-1, -2) @ qb
