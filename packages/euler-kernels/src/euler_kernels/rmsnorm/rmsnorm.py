"""RMSNorm without bias: out = x / sqrt(mean(x**2) + eps) * weight."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from euler_kernels import cuda
from euler_kernels.backend import bf16_bits, check_float, get_array_module, shape_error
from euler_kernels.rmsnorm import rmsnorm_cuda


class RMSNormCache(NamedTuple):
    """rmsnorm_forward's cache on the array operations (NumPy, or CuPy float64)."""

    xhat: Any  # (..., C) x / rms(x)
    rstd: Any  # (...,) 1 / rms(x)
    weight: Any  # (C,)


class RMSNormKernelCache(NamedTuple):
    """rmsnorm_forward's (and residual_rmsnorm_forward's) cache on the fused GPU kernels."""

    x: Any  # (..., C) float32: the norm's input (residual_rmsnorm's s = x + branch)
    weight: Any  # (C,)
    rstd: Any  # (N,) 1 / rms of each row


def rmsnorm_forward(
    x: Any, weight: Any, eps: float = 1e-5, bf16_out: bool = False, amax: Any = None
) -> tuple[Any, RMSNormCache | RMSNormKernelCache]:
    """Normalise the last axis of `x` (..., C) by its root mean square, then scale by `weight` (C,).

    bf16_out (GPU only): out is a bf16 activation (see backend.is_bf16), for a norm that only feeds bf16
    matrix products; x, weight, rstd and the gradients stay float32. amax (with bf16_out): a uint32
    scalar (ek.fp8_amax) raised to out's largest |value| in the same pass, for the FP8 products that take
    out (linear_forward's x_amax=).

    >>> import numpy as np
    >>> out, _ = rmsnorm_forward(np.array([[3.0, 4.0]]), np.ones(2), eps=0.0)
    >>> np.round(out, 4).tolist()
    [[0.8485, 1.1314]]
    """
    host = type(x) is np.ndarray  # NumPy: the array operations below, nothing else to choose
    check_float("rmsnorm_forward", x=x, weight=weight)
    if weight.ndim != 1 or x.ndim < 1 or x.shape[-1] != weight.shape[0]:
        raise shape_error("rmsnorm_forward", "weight must be (C,) with C = x.shape[-1]", x=x, weight=weight)
    if not host and cuda.float32_on_gpu(x, weight):  # one fused kernel; rstd (N,) is what backward adds
        out, rstd = rmsnorm_cuda.rmsnorm_forward(x, weight, eps, bf16_out, amax)
        return out, RMSNormKernelCache(x, weight, rstd)
    if bf16_out or amax is not None:
        raise ValueError("rmsnorm_forward: bf16_out and amax need float32 CuPy arrays (the GPU path)")
    out, xhat, rstd = rmsnorm_parts(np if host else get_array_module(x), x, weight, eps)
    return out, RMSNormCache(xhat, rstd, weight)


def rmsnorm_parts(xp: Any, x: Any, weight: Any, eps: float) -> tuple[Any, Any, Any]:
    """(out, xhat, rstd) of the array-operation RMSNorm, x (..., C) and weight (C,) already checked: the
    one formula of the NumPy-style path, shared by rmsnorm_forward and the decode step's lean products."""
    ms = xp.einsum("...c,...c->...", x, x) / x.shape[-1]  # (...,) mean of squares
    rstd = 1.0 / xp.sqrt(ms + eps)  # (...,)
    xhat = x * (rstd[..., None] if rstd.ndim else rstd)  # (..., C); one row (C,): times a scalar
    return xhat * weight, xhat, rstd


def rmsnorm_backward(dout: Any, cache: RMSNormCache | RMSNormKernelCache, dx_add: Any = None) -> tuple:
    """Gradients (dx, dweight) of rmsnorm; dx = rstd * (g - xhat * mean(g * xhat)) with g = dout * weight.

    dx_add: a gradient of x's shape to add to dx (say, the residual branch's), in the same pass on the GPU;
    dx_add itself is left unchanged.

    >>> import numpy as np
    >>> _, cache = rmsnorm_forward(np.array([[3.0, 4.0]]), np.ones(2))
    >>> dx, _ = rmsnorm_backward(np.ones((1, 2)), cache, dx_add=np.full((1, 2), 10.0))
    >>> np.round(dx - rmsnorm_backward(np.ones((1, 2)), cache)[0], 6).tolist()
    [[10.0, 10.0]]
    """
    if type(cache) is RMSNormKernelCache:
        dout = bf16_bits(dout)  # a CuPy bfloat16 array as its bit patterns
        dx, dweight, _ = _fused_backward("rmsnorm_backward", dout, cache, dx_add, bf16_copy=False)
        return dx, dweight
    xhat, rstd, weight = cache.xhat, cache.rstd, cache.weight
    xp = np if type(dout) is np.ndarray else get_array_module(dout)
    if dout.shape != xhat.shape or (dx_add is not None and dx_add.shape != xhat.shape):
        raise shape_error("rmsnorm_backward", "dout and dx_add must match x", dout=dout, x=xhat)
    c = xhat.shape[-1]
    dweight = xp.einsum("nc,nc->c", dout.reshape(-1, c), xhat.reshape(-1, c))  # (C,) over leading axes
    g = dout * weight  # (..., C) gradient w.r.t. xhat
    proj = xp.einsum("...c,...c->...", g, xhat) / c  # (...,)
    g -= xhat * proj[..., None]
    g *= rstd[..., None]
    if dx_add is not None:
        g += dx_add
    return g, dweight.astype(weight.dtype, copy=False)


def rmsnorm_backward_bf16_copy(
    dout: Any, cache: RMSNormKernelCache, dx_add: Any = None, amax: Any = None
) -> tuple:
    """(dx, dweight, dx16): rmsnorm_backward's gradients and dx16, dx rounded to bf16 in the same pass, for
    the bf16 products that take dx next (a residual stream's gradient: float32 for the stream, bf16 for the
    products). amax: raised to dx16's largest |value|, as in rmsnorm_forward. GPU only: the cache of a
    fused rmsnorm_forward; dout float32, or bf16 (the gradients are the float32 ones of its values)."""
    if type(cache) is not RMSNormKernelCache:
        raise ValueError("rmsnorm_backward_bf16_copy needs the fused GPU path (float32 CuPy arrays)")
    dout = bf16_bits(dout)  # a CuPy bfloat16 array as its bit patterns
    return _fused_backward("rmsnorm_backward_bf16_copy", dout, cache, dx_add, bf16_copy=True, amax=amax)


def _fused_backward(
    fn: str, dout: Any, cache: RMSNormKernelCache, dx_add: Any, bf16_copy: bool, amax: Any = None
) -> tuple:
    """(dx, dweight, dx16 or None) from the fused kernels, for a fused forward's cache, shapes checked."""
    x, weight, rstd = cache.x, cache.weight, cache.rstd
    if dout.shape != x.shape or (dx_add is not None and dx_add.shape != x.shape):
        raise shape_error(fn, "dout and dx_add must match x", dout=dout, x=x)
    return rmsnorm_cuda.rmsnorm_backward(dout, x, weight, rstd, dx_add, bf16_copy, amax)
