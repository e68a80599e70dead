"""A micro-batch's gradients, weighted by its share of the loss, into the step's sums."""

from __future__ import annotations

from typing import Any

from euler_kernels import cuda
from euler_kernels.cuda.cast import as_float32
from euler_kernels.optim import grad_accumulate_cuda as grad_accumulate


def accumulate_scaled_many(dst: list[Any], src: list[Any], share: Any, accumulate: bool) -> None:
    """dst[i] = share * src[i], or dst[i] += share * src[i] when accumulate, in place; share is a 0-d or
    (1,) array where the arrays live (no host value enters a captured step). Float32 contiguous CuPy
    arrays: one launch over the whole list, one pass over each array (not a multiply, then a copy or an
    add); the product is rounded before the sum either way. src may hold bf16 arrays (bf16 weight
    gradients, train.bf16_grads); dst is float32.

    >>> import numpy as np
    >>> d, s = [np.zeros(2, np.float32)], [np.array([1.0, 2.0], np.float32)]
    >>> accumulate_scaled_many(d, s, np.float32(0.5), False)
    >>> accumulate_scaled_many(d, s, np.float32(2.0), True)
    >>> d[0].tolist()
    [2.5, 5.0]
    """
    if len(dst) != len(src) or any(d.shape != s.shape for d, s in zip(dst, src)):
        raise ValueError("accumulate_scaled_many: dst and src must be lists of arrays of the same shapes")
    if not dst:
        return
    dst_on_device = all(cuda.float32_on_gpu(d, share) and d.flags.c_contiguous for d in dst)
    on_device = dst_on_device and cuda.fused_grads(*src)
    if on_device:
        grad_accumulate.scale_into_many(dst, src, share, accumulate)
        return
    for d, s in zip(dst, src):
        s = as_float32(s)
        if accumulate:
            d += s * share
        else:
            d[...] = s * share
