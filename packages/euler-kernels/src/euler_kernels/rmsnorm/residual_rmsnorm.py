"""A residual connection followed by RMSNorm: s = x + branch, out = rmsnorm(s) * weight.

A pre-norm decoder adds each block's output to the residual stream and normalises the sum at the start
of the next block; fused, the sum is read once instead of being written by one kernel and read back by
the next. Backward: the gradient of s (ds, from s's other uses, and through the norm) reaches x and the
branch unchanged, so one array serves as both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels import cuda
from euler_kernels.backend import check_float, shape_error
from euler_kernels.rmsnorm import rmsnorm_cuda
from euler_kernels.rmsnorm.rmsnorm import (
    RMSNormCache,
    RMSNormKernelCache,
    rmsnorm_backward,
    rmsnorm_backward_bf16_copy,
    rmsnorm_forward,
)


def residual_rmsnorm_forward(
    x: Any, branch: Any, weight: Any, eps: float = 1e-5, bf16_out: bool = False, amax: Any = None
) -> tuple[tuple[Any, Any], RMSNormCache | RMSNormKernelCache]:
    """((s, out), cache) with s = x + branch (..., C) and out = rmsnorm(s, weight, eps) (..., C).

    bf16_out (GPU only): out is a bf16 activation, as in rmsnorm_forward; s stays float32. amax: as in
    rmsnorm_forward.

    >>> import numpy as np
    >>> x, branch = np.array([[1.0, 4.0]]), np.array([[2.0, 0.0]])
    >>> (s, out), _ = residual_rmsnorm_forward(x, branch, np.ones(2), eps=0.0)
    >>> s.tolist(), np.round(out, 4).tolist()
    ([[3.0, 4.0]], [[0.8485, 1.1314]])
    """
    fn = "residual_rmsnorm_forward"
    check_float(fn, x=x, branch=branch, weight=weight)
    if x.shape != branch.shape:
        raise shape_error(fn, "x and branch must have the same shape", x=x, branch=branch)
    if weight.ndim != 1 or x.ndim < 1 or x.shape[-1] != weight.shape[0]:
        raise shape_error(fn, "weight must be (C,) with C = x.shape[-1]", x=x, weight=weight)
    if type(x) is not np.ndarray and cuda.float32_on_gpu(x, branch, weight):  # one kernel: s and out
        s, out, rstd = rmsnorm_cuda.residual_rmsnorm_forward(x, branch, weight, eps, bf16_out, amax)
        return (s, out), RMSNormKernelCache(s, weight, rstd)  # an rmsnorm cache of s
    s = x + branch
    out, cache = rmsnorm_forward(s, weight, eps, bf16_out, amax)
    return (s, out), cache


def residual_rmsnorm_backward(ds: Any, dout: Any, cache: RMSNormCache | RMSNormKernelCache) -> tuple:
    """(dx, dweight): dx = ds + d rmsnorm / ds, the gradient of both x and branch (one array, not copies).

    ds: the gradient reaching s from its other uses (the residual stream), or None if it has none.
    """
    return rmsnorm_backward(dout, cache, dx_add=ds)


def residual_rmsnorm_backward_bf16_copy(
    ds: Any, dout: Any, cache: RMSNormKernelCache, amax: Any = None
) -> tuple:
    """(dx, dweight, dx16): residual_rmsnorm_backward's gradients and dx16, dx rounded to bf16 in the same
    pass (rmsnorm_backward_bf16_copy, amax as there). GPU only."""
    return rmsnorm_backward_bf16_copy(dout, cache, dx_add=ds, amax=amax)
