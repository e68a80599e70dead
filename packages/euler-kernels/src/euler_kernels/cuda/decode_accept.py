"""Launcher of decode_accept.cu: a speculative step's accepted tokens recorded, one launch."""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda._module import THREADS, blocks, contiguous, get_kernel


def decode_accept(
    g: Any, drafts: Any, buffers: tuple, stop: Any, limit: Any, drafted: Any, accepted: Any
) -> Any:
    """ops.decode_accept on CuPy arrays: buffers (out, last, pos, count, stopped_by, done, seen), drafted
    and accepted updated in place (C-contiguous); returns chosen (B,) int64."""
    import cupy

    g, drafts, stop, limit = contiguous(g, drafts, stop, limit)
    if not all(a.flags.c_contiguous for a in (*buffers, drafted, accepted)):
        raise ValueError("decode_accept: the buffers it updates in place must be C-contiguous")
    out, last, pos, count, stopped_by, done, seen = buffers
    b, v = stop.shape
    chosen = cupy.empty((b,), dtype=cupy.int64)
    args = (chosen, drafted, accepted, out, last, pos, count, stopped_by, done, seen, g, drafts, stop, limit)
    sizes = (np.int32(b), np.int32(drafts.shape[1]), np.int32(v), np.int32(out.shape[1]))
    get_kernel("decode_accept.cu", "decode_accept")((blocks(b, THREADS),), (THREADS,), (*args, *sizes))
    return chosen
