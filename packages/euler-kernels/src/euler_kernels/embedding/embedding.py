"""Token embedding: a gather in forward, a scatter-add in backward."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from euler_kernels import cuda
from euler_kernels.backend import check_float, get_array_module, is_capturing, shape_error
from euler_kernels.embedding import embedding_cuda


class EmbeddingCache(NamedTuple):
    """embedding_forward's cache (NumPy or GPU alike): the ids and the weight's shape and dtype."""

    tokens: Any  # (B, T) int
    weight_shape: tuple  # (V, C)
    weight_dtype: Any


def embedding_forward(weight: Any, tokens: Any) -> tuple[Any, EmbeddingCache]:
    """Look up rows of `weight` (V, C) for integer `tokens` (B, T) -> out (B, T, C).

    >>> import numpy as np
    >>> out, cache = embedding_forward(np.eye(3), np.array([[2, 0]]))
    >>> out.tolist()
    [[[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]]
    """
    xp = np if type(weight) is np.ndarray else get_array_module(weight)
    check_float("embedding_forward", weight=weight)
    if weight.ndim != 2:
        raise shape_error("embedding_forward", "weight must be (V, C)", weight=weight, tokens=tokens)
    if tokens.dtype.kind not in "iu":
        raise ValueError(f"embedding_forward: tokens must be integers, got dtype {tokens.dtype}")
    vocab = weight.shape[0]
    checked = tokens.size and (xp is np or not is_capturing(tokens))  # a capture cannot read ids back
    if checked and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise ValueError(
            f"embedding_forward: token ids must lie in [0, {vocab}); got min {int(tokens.min())}, "
            f"max {int(tokens.max())} (weight{tuple(weight.shape)}, tokens{tuple(tokens.shape)})"
        )
    out = xp.take(weight, tokens, axis=0)  # (B, T, C)
    return out, EmbeddingCache(tokens, weight.shape, weight.dtype)


def embedding_backward(dout: Any, cache: EmbeddingCache) -> Any:
    """Scatter-add `dout` (B, T, C) into dweight (V, C); repeated tokens accumulate."""
    tokens, wshape, dtype = cache.tokens, cache.weight_shape, cache.weight_dtype
    xp = np if type(dout) is np.ndarray else get_array_module(dout)
    if dout.shape != (*tokens.shape, wshape[1]):
        raise shape_error(
            "embedding_backward", f"dout must be tokens.shape + ({wshape[1]},)", dout=dout, tokens=tokens
        )
    if (
        xp is not np and cuda.float32_on_gpu(dout) and dtype == np.float32
    ):  # one kernel, atomics: no update is lost
        return embedding_cuda.embedding_backward(dout, tokens, wshape[0])
    flat = tokens.reshape(-1)  # (N,)
    rows = dout.reshape(-1, wshape[1]).astype(dtype, copy=False)  # (N, C)
    dweight = xp.zeros(wshape, dtype=dtype)  # (V, C)
    if xp is not np:  # CuPy, float64: atomic scatter-add
        xp.add.at(dweight, flat, rows)
        return dweight
    if flat.size == 0:
        return dweight
    # NumPy: sort by token, sum each run of equal tokens with one reduceat (much faster than add.at)
    order = np.argsort(flat, kind="stable")
    sorted_tokens = flat[order]
    starts = np.flatnonzero(np.r_[True, sorted_tokens[1:] != sorted_tokens[:-1]])  # first of each run
    dweight[sorted_tokens[starts]] = np.add.reduceat(rows[order], starts, axis=0)
    return dweight
