"""Launchers of rmsnorm.cu: RMSNorm forward (optionally with the residual addition in front and a bf16
output) and backward (optionally adding the residual branch's gradient). One warp per row; rows of
C = 128 * n (n <= 16) take the vectorised kernels (float4 loads, -D ROW_F4=n), where a row wider than 512
is shared by two or four warps (-D ROW_TEAM) so that each thread keeps at most four float4 pieces of it.
A bf16 output (the forward's out, the backward's dx16) can also raise `amax`, a uint32 scalar, to its
largest |value| as stored (fp8.amax_bits' form), for the FP8 cast that takes it: in the same pass where
the row is vectorised, by fp8.amax_bits afterwards where not."""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda import cast
from euler_kernels.cuda._module import THREADS, blocks, contiguous, get_kernel, grid_cap, sm_count
from euler_kernels.matmul import fp8

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
# (vectorised, dx_add added, bf16 copy of dx written, bf16 dout) -> backward kernel (only the vectorised
# kernels read a bf16 dout)
_BACKWARD = {
    (False, False, False, False): "rmsnorm_backward",
    (False, True, False, False): "rmsnorm_backward_add",
    (True, False, False, False): "rmsnorm_backward_vec",
    (True, True, False, False): "rmsnorm_backward_vec_add",
    (True, False, True, False): "rmsnorm_backward_vec_copy16",
    (True, True, True, False): "rmsnorm_backward_vec_add_copy16",
    (True, False, False, True): "rmsnorm_backward_vec_g16",
    (True, True, False, True): "rmsnorm_backward_vec_add_g16",
    (True, False, True, True): "rmsnorm_backward_vec_copy16_g16",
    (True, True, True, True): "rmsnorm_backward_vec_add_copy16_g16",
}


# the backward's grid: few blocks, as each adds its dweight sums once (tune_rmsnorm_gpu.py --blocks)
BACKWARD_BLOCKS_PER_SM = 2


def backward_blocks() -> int:
    """The most blocks of the backward's grid on the current GPU: BACKWARD_BLOCKS_PER_SM an SM."""
    return BACKWARD_BLOCKS_PER_SM * sm_count()


def _rmsnorm_vec(C: int) -> dict[str, int]:
    """The vectorised kernels' defines for rows of C (C = 128 * n, n <= 16), or {} for the general ones:
    float4 pieces per warp's lane, and warps per row, a power of two leaving at most four pieces a thread
    (fewer registers, more rows in flight: the widest rows' backward is fastest with four warps a row;
    benchmarks/tune_rmsnorm_gpu.py, its figures in docs/benchmarks/train_gpu.md)."""
    if C % 128 or C > 2048:
        return {}
    pieces = C // 128
    return {"ROW_F4": pieces, "ROW_TEAM": 1 if pieces <= 4 else 2 if pieces <= 8 else 4}


def _rows_per_block(vec: dict[str, int]) -> int:
    return THREADS // 32 // vec.get("ROW_TEAM", 1)


def rmsnorm_forward(
    x: Any, weight: Any, eps: float, bf16_out: bool = False, amax: Any = None
) -> tuple[Any, Any]:
    """x (..., C) -> out (..., C), rstd (N,) with N the number of rows; one warp per row. bf16_out: out is
    bfloat16 (uint16 bit patterns), for a norm whose output only feeds bf16 matrix products; amax: raised
    to out's maximum (bf16_out only)."""
    out, rstd, _ = _rmsnorm_forward(x, None, weight, eps, bf16_out, amax)
    return out, rstd


def residual_rmsnorm_forward(
    x: Any, branch: Any, weight: Any, eps: float, bf16_out: bool = False, amax: Any = None
) -> tuple[Any, Any, Any]:
    """s = x + branch and rmsnorm(s) in one pass: (s, out, rstd)."""
    out, rstd, total = _rmsnorm_forward(x, branch, weight, eps, bf16_out, amax)
    return total, out, rstd


def _rmsnorm_forward(
    x: Any, branch: Any, weight: Any, eps: float, bf16_out: bool, amax: Any
) -> tuple[Any, Any, Any]:
    import cupy

    if amax is not None and not bf16_out:
        raise ValueError("rmsnorm_forward: amax= is for a bf16 output (bf16_out=True)")
    pointer = fp8.amax_pointer(amax, "rmsnorm_forward")
    x, weight = contiguous(x, weight)
    C = x.shape[-1]
    N = x.size // C
    out = cupy.empty(x.shape, dtype=cupy.uint16 if bf16_out else cupy.float32)
    rstd = cupy.empty((N,), dtype=cupy.float32)
    vec = _rmsnorm_vec(C)
    grid = (min(blocks(N, _rows_per_block(vec)), grid_cap()),)
    add, total = (), None
    if branch is not None:  # the residual connection fused in front: the kernel also writes x + branch
        total = cupy.empty_like(x)
        add = (cupy.ascontiguousarray(branch), total)
    name = _FORWARD[bool(vec), branch is not None, bool(bf16_out)]
    if vec:
        kernel = get_kernel("rmsnorm.cu", name, **vec)
        maximum = (pointer,) if bf16_out else ()  # the bf16 kernels' last argument
        kernel(grid, (THREADS,), (out, rstd, x, weight, *add, np.int32(N), np.float32(eps), *maximum))
    else:
        args = (out, rstd, x, weight, *add, np.int32(N), np.int32(C), np.float32(eps))
        get_kernel("rmsnorm.cu", name)(grid, (THREADS,), args)
        if amax is not None:
            fp8.amax_bits(out, out=amax)
    return out, rstd, total


def rmsnorm_backward(
    dout: Any, x: Any, weight: Any, rstd: Any, dx_add: Any = None, bf16_copy: bool = False, amax: Any = None
) -> tuple[Any, Any, Any]:
    """(dx, dweight, dx16); dx_add (like x): a gradient added to dx in the same pass (the residual branch's);
    bf16_copy: dx16 is dx rounded to bf16 (uint16 bit patterns; written by the same pass where the row is
    vectorised, else cast afterwards), for bf16 products that take dx next; else dx16 is None. amax: raised
    to dx16's maximum (bf16_copy only). dout float32, or bf16 (the sum of bf16 products' gradients): the
    gradients are the float32 ones of its values."""
    import cupy

    if amax is not None and not bf16_copy:
        raise ValueError("rmsnorm_backward: amax= is for the bf16 copy (bf16_copy=True)")
    pointer = fp8.amax_pointer(amax, "rmsnorm_backward")
    dout, x = contiguous(dout, x)
    C = x.shape[-1]
    N = x.size // C
    dx = cupy.empty_like(x)
    dweight = cupy.zeros((C,), dtype=cupy.float32)
    vec = _rmsnorm_vec(C)
    grid = (min(blocks(N, _rows_per_block(vec)), backward_blocks()),)
    add = () if dx_add is None else (cupy.ascontiguousarray(dx_add),)
    if dout.dtype == cupy.uint16 and not vec:  # the general kernels read float32 only
        dout = cast.from_bf16(dout)
    if vec:
        dx16 = cupy.empty(x.shape, dtype=cupy.uint16) if bf16_copy else None
        name = _BACKWARD[True, dx_add is not None, bf16_copy, bool(dout.dtype == cupy.uint16)]
        kernel = get_kernel("rmsnorm.cu", name, **vec)
        outs = (dx, dx16) if bf16_copy else (dx,)
        maximum = (pointer,) if bf16_copy else ()  # the copy16 kernels' last argument
        kernel(grid, (THREADS,), (*outs, dweight, dout, x, weight, rstd, *add, np.int32(N), *maximum))
        return dx, dweight, dx16
    args = (dx, dweight, dout, x, weight, rstd, *add, np.int32(N), np.int32(C))
    kernel = get_kernel("rmsnorm.cu", _BACKWARD[False, dx_add is not None, False, False])
    kernel(grid, (THREADS,), args, shared_mem=4 * C)
    dx16 = cast.to_bf16(dx) if bf16_copy else None
    if amax is not None:
        fp8.amax_bits(dx16, out=amax)
    return dx, dweight, dx16
