"""Launcher of decode_accept.cu: a speculative step's accepted tokens recorded, one launch."""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda._module import check_in_place, contiguous, get_kernel

_THREADS = 128  # a block per row: thread 0 records, the block moves the accepted drafts' slots


def decode_accept(
    g: Any,
    drafts: Any,
    buffers: tuple,
    stop: Any,
    limit: Any,
    drafted: Any,
    accepted: Any,
    parents: tuple[int, ...] | None,
    caches: tuple[Any, Any] | None,
) -> Any:
    """ops.decode_accept on CuPy arrays: buffers (out, last, pos, count, stopped_by, done, seen), drafted,
    accepted and the caches (L, B, Hkv, S, D) updated in place (C-contiguous); parents None for a chain;
    returns chosen (B,) int64."""
    import cupy

    g, drafts, stop, limit = contiguous(g, drafts, stop, limit)
    check_in_place(
        "decode_accept: the buffers it updates in place", *buffers, drafted, accepted, *(caches or ())
    )
    out, last, pos, count, stopped_by, done, seen = buffers
    b, v = stop.shape
    tree = 0 if parents is None else sum(p << (4 * c) for c, p in enumerate(parents, start=1))  # 4 bits each
    if caches is None:  # a chain moves nothing: any pointer will do
        k, vv, layers, hkv, s, words = g, g, 0, 0, 0, 0
    else:
        k, vv = caches
        layers, _, hkv, s, d = k.shape
        words = d * k.dtype.itemsize // 4
    chosen = cupy.empty((b,), dtype=cupy.int64)
    rows = (chosen, drafted, accepted, out, last, pos, count, stopped_by, done, seen, g, drafts, stop, limit)
    args = (*rows, k, vv)
    sizes = (np.int32(g.shape[1]), np.int32(v), np.int32(out.shape[1]), np.uint64(tree))
    shape = (np.int32(layers), np.int32(b), np.int32(hkv), np.int32(s), np.int32(words))
    get_kernel("decode_accept.cu", "decode_accept")((b,), (_THREADS,), (*args, *sizes, *shape))
    return chosen
