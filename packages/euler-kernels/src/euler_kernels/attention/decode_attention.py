"""Decode attention: new tokens per sequence, appended to a static KV cache and attended over it.

The cache holds S key slots per sequence; sequence b's new token is at position pos[b] (on the device)
and sees its keys 0..pos[b], so a batch of sequences of different lengths is one fixed-shape
computation, the same at every step (what a CUDA graph needs). Query heads are grouped under their
key/value head (GQA) as in `attention_forward`, so K and V are never repeated. Inference only: there is
no backward. A row may also bring T > 1 new tokens (a speculative step verifying drafts): a chain at
positions pos[b]..pos[b] + T - 1, each seeing the slots up to its own position, or a draft tree
(draft_tree.py: token t at position pos[b] + depth(t), seeing the slots before pos[b] and its ancestors'
slots); new token t's key and value go to slot pos[b] + t either way.

On float32 CuPy arrays one kernel pair runs it (decode_attention.cu: RoPE, the cache write and a
flash-decoding split over the keys, then the merge of the splits), reading each row's own slots only.
Elsewhere (NumPy, float64 on the GPU) the reference below runs:
rope_rows, an indexed write, and a masked softmax over the first `window` slots, written as CuPy
element-wise products and reductions on the GPU (CuPy's matmul refuses to run while a stream is captured
into a CUDA graph). On NumPy the positions are read on the host: the write is a slice per row, and only
the slots up to the newest are read; one sequence (generate's case) reads the tables and the cache as
slices, and a single new token there needs no mask.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from euler_kernels import cuda, draft_tree
from euler_kernels.attention import decode_attention_cuda as decode_cuda
from euler_kernels.backend import bf16_bits, check_float, get_array_module, shape_error
from euler_kernels.cuda import cast
from euler_kernels.rope.rope import rope_rows


def decode_attention_kernel(k_cache: Any, n_heads: int, new_tokens: int = 1) -> bool:
    """Whether decode_attention_forward runs its kernel for this cache (B, Hkv, S, D), Hq query heads and T
    new tokens a row: then it reads each row's own slots itself and `window` does not matter."""
    _, hkv, _, d = k_cache.shape
    return cuda.float32_on_gpu(k_cache) and decode_cuda.decode_attention_fits(d, n_heads, hkv, new_tokens)


def decode_attention_forward(
    qkv: Any,
    k_cache: Any,
    v_cache: Any,
    pos: Any,
    cos: Any,
    sin: Any,
    n_heads: int,
    window: int | None = None,
    bf16_out: bool = False,
    tree: tuple[int, ...] | None = None,
) -> Any:
    """softmax(q k^T / sqrt(D) + mask) v for each sequence's newest token, after writing its key and value.

    qkv (B, (Hq + 2 Hkv) D): each row's q, k and v projections side by side, RoPE not applied yet; k_cache
    and v_cache (B, Hkv, S, D), contiguous, get the rotated key and the value at slot pos[b] of row b (in
    place); pos (B,) int64 with every pos[b] < S; cos, sin the rope_tables (P, D/2), P > every pos[b].
    qkv may be (B, T, (Hq + 2 Hkv) D): T new tokens per row, at slots pos[b]..pos[b] + T - 1 (< S).
    window: the reference reads only slots 0..window-1 (every new slot must be below it; None: all S).
    tree: the T new tokens' parents (draft_tree.py: T - 1 values), None a chain.
    Returns (B, Hq * D), or (B, T, Hq * D), in qkv's dtype or, with bf16_out, as a bf16 activation (the
    GPU's bf16 products take it as it is); query head h reads key/value head h // (Hq // Hkv).

    >>> import numpy as np
    >>> from euler_kernels.rope.rope import rope_tables
    >>> cos, sin = rope_tables(2, 4, dtype=np.float64)
    >>> k, v = np.zeros((1, 1, 4, 2)), np.zeros((1, 1, 4, 2))
    >>> v[0, 0, 0] = [3.0, 5.0]
    >>> qkv = np.array([[0.0, 0.0, 0.0, 0.0, 1.0, 1.0]])  # q = k = 0, v = 1 (one head of 2)
    >>> out = decode_attention_forward(qkv, k, v, np.array([1]), cos, sin, 1)
    >>> out.tolist(), v[0, 0, 1].tolist()
    ([[2.0, 3.0]], [1.0, 1.0])
    """
    qkv = bf16_bits(qkv)  # a CuPy bfloat16 array as its bit patterns
    b, hkv, s, d = k_cache.shape
    width = (n_heads + 2 * hkv) * d
    rows_ok = qkv.ndim in (2, 3) and qkv.shape[0] == b and qkv.shape[-1] == width
    if not rows_ok or v_cache.shape != k_cache.shape:
        raise shape_error(
            "decode_attention_forward",
            f"qkv must be (B, [T,] (Hq + 2 Hkv) D) = ({b}, [T,] {width}) and v_cache like k_cache",
            qkv=qkv,
            k_cache=k_cache,
            v_cache=v_cache,
        )
    if pos.shape != (b,) or n_heads % hkv:
        raise shape_error("decode_attention_forward", f"pos must be (B,) and Hkv divide {n_heads}", pos=pos)
    check_float("decode_attention_forward", qkv=qkv, k_cache=k_cache, v_cache=v_cache, cos=cos, sin=sin)
    rows = qkv.reshape(b, -1, width)  # (B, T, width)
    t = rows.shape[1]
    if tree is not None:
        draft_tree.check_parents(tree)
        if len(tree) != t - 1:
            raise ValueError(f"decode_attention_forward: a tree of {len(tree) + 1} tokens for {t} new tokens")
    in_place = k_cache.flags.c_contiguous and v_cache.flags.c_contiguous  # the kernel writes them as is
    if b == 1 and type(qkv) is np.ndarray and not bf16_out:  # one NumPy sequence (generate): slices
        out = _one_sequence(rows, k_cache, v_cache, int(pos[0]), cos, sin, n_heads, tree)
    elif in_place and decode_attention_kernel(k_cache, n_heads, t):
        masks = None if tree is None else draft_tree.ancestors(tree)
        out = decode_cuda.decode_attention(rows, k_cache, v_cache, pos, cos, sin, n_heads, bf16_out, masks)
    else:
        if bf16_out and not cuda.float32_on_gpu(qkv):
            raise ValueError("decode_attention_forward: bf16_out needs float32 CuPy arrays")
        out = _reference(rows, k_cache, v_cache, pos, cos, sin, n_heads, window or s, tree)
        out = cast.as_bf16(out) if bf16_out else out
    return out.reshape(b, -1) if qkv.ndim == 2 else out.reshape(b, rows.shape[1], -1)


def _new_slots_seen(t: int, tree: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """A draft tree's (T, T) bool: new token i sees new slot pos + u; and each new token's depth (T,)."""
    masks = draft_tree.ancestors(tree)
    return (np.asarray(masks)[:, None] >> np.arange(t)) & 1 == 1, np.asarray(draft_tree.depths(tree))


def _reference(
    qkv: Any, k_cache: Any, v_cache: Any, pos: Any, cos: Any, sin: Any, hq: int, window: int, tree: Any = None
) -> Any:
    """decode_attention_forward in array operations, qkv (B, T, (Hq + 2 Hkv) D) -> (B, T, Hq D), reading
    slots 0..window-1; on NumPy only up to the newest slot (reading positions costs no device sync there)."""
    xp = get_array_module(qkv)
    b, t = qkv.shape[:2]
    hkv, d = k_cache.shape[1], k_cache.shape[3]
    g = hq // hkv  # query heads per key/value head
    at = pos[:, None] if t == 1 else pos[:, None] + xp.arange(t)  # (B, T) the new tokens' slots
    seen_new, depth = (None, None) if tree is None else _new_slots_seen(t, tree)  # a tree's are host arrays
    flat = (at if tree is None else pos[:, None] + xp.asarray(depth)).reshape(-1)  # (B T,) their positions
    angles = xp.take(cos, flat, axis=0), xp.take(sin, flat, axis=0)  # (B T, D/2) each
    qk = rope_rows(qkv[..., : (hq + hkv) * d].reshape(b * t, hq + hkv, d), *angles).reshape(b, t, -1, d)
    _write_slots(xp, k_cache, pos, at, qk[:, :, hq:])
    _write_slots(xp, v_cache, pos, at, qkv[..., (hq + hkv) * d :].reshape(b, t, hkv, d))
    if xp is np:  # reading the positions costs no device sync here: attend up to the newest slot only
        window = min(window, max(pos.tolist()) + t)
    k, v = k_cache[:, :, :window], v_cache[:, :, :window]  # (B, Hkv, W, D) views
    q = qk[:, :, :hq] * qkv.dtype.type(1.0 / math.sqrt(d))  # (B, T, Hq, D), pre-scaled
    q = q.reshape(b, t, hkv, g, d).transpose(0, 2, 3, 1, 4).reshape(b, hkv, g * t, d)  # (B, Hkv, G T, D)
    scores = _products(xp, q, k.swapaxes(-1, -2)).reshape(b, hkv, g, t, window)  # (B, Hkv, G, T, W)
    if tree is None:  # the token at pos[b] + i sees 0..pos[b] + i
        hidden = xp.arange(window) > at[:, :, None]  # (B, T, W)
    else:  # new token i sees the old slots and its ancestors'
        new = xp.arange(window) - pos[:, None, None]  # (B, 1, W): a slot's place among the new ones
        seen = xp.asarray(seen_new)[xp.arange(t)[:, None], xp.clip(new, 0, t - 1)]  # (B, T, W)
        hidden = (new >= t) | ((new >= 0) & ~seen)
    scores = xp.where(hidden[:, None, None], -xp.inf, scores)  # where, not a masked write: capturable
    out = _weighted_values(xp, scores.reshape(b, hkv, g * t, window), v)  # (B, Hkv, G T, D)
    return out.reshape(b, hkv, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, hq * d)


def _one_sequence(
    qkv: Any, k_cache: Any, v_cache: Any, p: int, cos: Any, sin: Any, hq: int, tree: Any = None
) -> Any:
    """_reference for one sequence on NumPy, with no row indexing: qkv (1, T, width), the new tokens
    at slots p..p + T - 1; the tables (of a chain) and the cache read as slices. A chain's token i attends
    over exactly its p + i + 1 slots, as a one-token step at its position does, so its bits are that step's
    (a speculative step emits plain greedy's tokens)."""
    t = qkv.shape[1]
    hkv, d = k_cache.shape[1], k_cache.shape[3]
    g, n = hq // hkv, p + t  # n: the slots up to the newest
    scale = qkv.dtype.type(1.0 / math.sqrt(d))
    if t == 1 and tree is None:  # generate's step: one token, its rows as vectors (fewer, cheaper views)
        row = qkv[0, 0]  # (width,)
        qk = rope_rows(row[: (hq + hkv) * d].reshape(hq + hkv, d), cos[p], sin[p])  # (H, D)
        k_cache[0, :, p] = qk[hq:]
        v_cache[0, :, p] = row[(hq + hkv) * d :].reshape(hkv, d)
        q = qk[:hq] * scale  # (Hq, D), pre-scaled
        return _first_slots(q.reshape(hkv, g, d), k_cache[0], v_cache[0], n).reshape(1, 1, hq * d)
    seen_new, depth = (None, None) if tree is None else _new_slots_seen(t, tree)
    angles = (cos[p:n], sin[p:n]) if tree is None else (cos[p + depth], sin[p + depth])
    qk = rope_rows(qkv[0, :, : (hq + hkv) * d].reshape(t, hq + hkv, d), *angles)  # (T, H, D)
    k_cache[0, :, p:n] = qk[:, hq:].swapaxes(0, 1)
    v_cache[0, :, p:n] = qkv[0, :, (hq + hkv) * d :].reshape(t, hkv, d).swapaxes(0, 1)
    q = qk[:, :hq] * scale  # (T, Hq, D), pre-scaled
    if tree is None:  # a chain: token i over its own p + i + 1 slots, a one-token step's sums
        out = [_first_slots(q[i].reshape(hkv, g, d), k_cache[0], v_cache[0], p + i + 1) for i in range(t)]
        return np.stack(out).reshape(1, t, hq * d)  # T of (Hkv, G, D) -> (1, T, Hq D)
    q = q.reshape(t, hkv, g, d).transpose(1, 2, 0, 3).reshape(hkv, g * t, d)  # (Hkv, G T, D)
    scores = q @ k_cache[0, :, :n].swapaxes(-1, -2)  # (Hkv, G T, n)
    hidden = np.zeros((t, n), dtype=bool)  # a tree's token i sees slots 0..p - 1 and its ancestors'
    hidden[:, p:] = ~seen_new  # (T, n)
    scores = np.where(hidden, -np.inf, scores.reshape(hkv, g, t, n)).reshape(hkv, g * t, n)
    out = _weighted_values(np, scores, v_cache[0, :, :n])  # (Hkv, G T, D)
    return out.reshape(hkv, g, t, d).transpose(2, 0, 1, 3).reshape(1, t, hq * d)


def _first_slots(q: Any, keys: Any, values: Any, n: int) -> Any:
    """One token's attention on NumPy: q (Hkv, G, D), pre-scaled, over the first n slots of keys and
    values (Hkv, S, D) -> (Hkv, G, D)."""
    return _weighted_values(np, q @ keys[:, :n].swapaxes(-1, -2), values[:, :n])


def _weighted_values(xp: Any, scores: Any, v: Any) -> Any:
    """softmax over the last axis of scores (..., M, W), hidden slots -inf (slot 0 is always seen, so every
    row has a finite maximum), times v (..., W, D): (..., M, D); scores is overwritten."""
    scores -= scores.max(axis=-1, keepdims=True)
    p = xp.exp(scores, out=scores)
    out = _products(xp, p, v)
    out /= p.sum(axis=-1, keepdims=True)
    return out


def _write_slots(xp: Any, cache: Any, pos: Any, at: Any, new: Any) -> None:
    """cache (B, Hkv, S, D) gets new (B, T, Hkv, D) at slots at[b] = pos[b]..pos[b] + T - 1 of row b. On
    NumPy a slice per row (the positions are on the host; far cheaper than an indexed write)."""
    if xp is np:
        for row, p in enumerate(pos.tolist()):
            cache[row, :, p : p + new.shape[1]] = new[row].swapaxes(0, 1)
        return
    cache[xp.arange(new.shape[0])[:, None], :, at] = new


def _products(xp: Any, a: Any, b: Any) -> Any:
    """The batched matrix product a @ b, (..., M, K) @ (..., K, N). On CuPy as a broadcast product summed
    over K, not CuPy's matmul: that one refuses to run while a stream is captured into a CUDA graph."""
    if xp.__name__ == "numpy":
        return a @ b
    return (a[..., :, :, None] * b[..., None, :, :]).sum(axis=-2)  # (..., M, K, N) summed over K
