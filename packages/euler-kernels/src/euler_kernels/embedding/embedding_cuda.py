"""Launcher of embedding.cu: the embedding's backward, a scatter-add with atomics (the forward is a
gather, `take`, on any array module)."""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda._module import THREADS, contiguous, get_kernel, grid


def embedding_backward(dout: Any, tokens: Any, vocab_size: int) -> Any:
    """dout (..., C), tokens (...) -> dweight (V, C), scatter-added with atomics."""
    import cupy

    (dout,) = contiguous(dout)
    C = dout.shape[-1]
    ids = cupy.ascontiguousarray(tokens.reshape(-1), dtype=cupy.int64)
    dweight = cupy.zeros((vocab_size, C), dtype=cupy.float32)
    args = (dweight, dout, ids, np.int64(ids.size), np.int32(C))
    get_kernel("embedding.cu", "embedding_backward")(grid(dout.size), (THREADS,), args)
    return dweight
