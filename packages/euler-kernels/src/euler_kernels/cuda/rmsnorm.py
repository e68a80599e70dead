"""Launchers of rmsnorm.cu: RMSNorm forward (optionally with the residual addition in front and a bf16
output) and backward (optionally adding the residual branch's gradient). One warp per row; rows of
C = 128 * n (n <= 16) take the vectorised kernels (float4 loads, n pieces per lane, -D ROW_F4=n)."""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda._module import GRID_CAP, THREADS, blocks, contiguous, get_kernel

# (vectorised, x + branch added in front, bf16 out) -> forward kernel
_FORWARD = {
    (False, False, False): "rmsnorm_forward",
    (False, False, True): "rmsnorm_forward_bf16",
    (False, True, False): "rmsnorm_forward_add",
    (False, True, True): "rmsnorm_forward_add_bf16",
    (True, False, False): "rmsnorm_forward_vec",
    (True, False, True): "rmsnorm_forward_vec_bf16",
    (True, True, False): "rmsnorm_forward_vec_add",
    (True, True, True): "rmsnorm_forward_vec_add_bf16",
}
# (vectorised, dx_add added) -> backward kernel
_BACKWARD = {
    (False, False): "rmsnorm_backward",
    (False, True): "rmsnorm_backward_add",
    (True, False): "rmsnorm_backward_vec",
    (True, True): "rmsnorm_backward_vec_add",
}


def _rmsnorm_vec(C: int) -> int:
    """float4 pieces per lane for the vectorised kernels (C = 128 * n, n <= 16), or 0 for the general ones."""
    return C // 128 if C % 128 == 0 and C <= 2048 else 0


def rmsnorm_forward(x: Any, weight: Any, eps: float, bf16_out: bool = False) -> tuple[Any, Any]:
    """x (..., C) -> out (..., C), rstd (N,) with N the number of rows; one warp per row. bf16_out: out is
    bfloat16 (uint16 bit patterns), for a norm whose output only feeds bf16 matrix products."""
    out, rstd, _ = _rmsnorm_forward(x, None, weight, eps, bf16_out)
    return out, rstd


def residual_rmsnorm_forward(
    x: Any, branch: Any, weight: Any, eps: float, bf16_out: bool = False
) -> tuple[Any, Any, Any]:
    """s = x + branch and rmsnorm(s) in one pass: (s, out, rstd)."""
    out, rstd, total = _rmsnorm_forward(x, branch, weight, eps, bf16_out)
    return total, out, rstd


def _rmsnorm_forward(x: Any, branch: Any, weight: Any, eps: float, bf16_out: bool) -> tuple[Any, Any, Any]:
    import cupy

    x, weight = contiguous(x, weight)
    C = x.shape[-1]
    N = x.size // C
    out = cupy.empty(x.shape, dtype=cupy.uint16 if bf16_out else cupy.float32)
    rstd = cupy.empty((N,), dtype=cupy.float32)
    grid = (min(blocks(N, THREADS // 32), GRID_CAP),)
    add, total = (), None
    if branch is not None:  # the residual connection fused in front: the kernel also writes x + branch
        total = cupy.empty_like(x)
        add = (cupy.ascontiguousarray(branch), total)
    vec = _rmsnorm_vec(C)
    name = _FORWARD[bool(vec), branch is not None, bool(bf16_out)]
    if vec:
        kernel = get_kernel("rmsnorm.cu", name, ROW_F4=vec)
        kernel(grid, (THREADS,), (out, rstd, x, weight, *add, np.int32(N), np.float32(eps)))
    else:
        args = (out, rstd, x, weight, *add, np.int32(N), np.int32(C), np.float32(eps))
        get_kernel("rmsnorm.cu", name)(grid, (THREADS,), args)
    return out, rstd, total


def rmsnorm_backward(dout: Any, x: Any, weight: Any, rstd: Any, dx_add: Any = None) -> tuple[Any, Any]:
    """(dx, dweight); dx_add (like x): a gradient added to dx in the same pass (the residual branch's)."""
    import cupy

    dout, x = contiguous(dout, x)
    C = x.shape[-1]
    N = x.size // C
    dx = cupy.empty_like(x)
    dweight = cupy.zeros((C,), dtype=cupy.float32)
    grid = (min(blocks(N, THREADS // 32), 132 * 2),)  # few blocks: each adds its dweight once
    add = () if dx_add is None else (cupy.ascontiguousarray(dx_add),)
    vec = _rmsnorm_vec(C)
    name = _BACKWARD[bool(vec), dx_add is not None]
    if vec:
        kernel = get_kernel("rmsnorm.cu", name, ROW_F4=vec)
        kernel(grid, (THREADS,), (dx, dweight, dout, x, weight, rstd, *add, np.int32(N)))
        return dx, dweight
    args = (dx, dweight, dout, x, weight, rstd, *add, np.int32(N), np.int32(C))
    get_kernel("rmsnorm.cu", name)(grid, (THREADS,), args, shared_mem=4 * C)
    return dx, dweight
