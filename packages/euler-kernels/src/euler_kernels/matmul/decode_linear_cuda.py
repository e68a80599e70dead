"""Launcher of decode_linear.cu and decode_linear_mma.cu: a few rows through a linear layer, with the norm
before it and SwiGLU or the residual addition after it, in one launch per group of rows.

The rule (_uses_mma): bf16 weights run on the tensor cores (decode_linear_mma.cu, 16 output columns a tile,
up to 32 rows a launch, fewer where K is long: _mma_rows) where K is a multiple of 32; float32 weights, and
bf16 of another K, on the CUDA cores (decode_linear.cu, one warp per output column, 8 rows a launch), which
multiply float32 exactly. The choice depends on the weight alone, never on the number of rows.

Every row's sums are formed the same way whatever the number of rows (one, a group, several groups), so a
speculative step's T rows per sequence decode exactly as plain steps' single rows do: that is why more
rows than a launch takes run as several launches (the later ones read the weights from L2) rather than as
one cuBLAS product, whose sums depend on its shape."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from euler_kernels.cuda._module import blocks, device_attribute, get_kernel, sm_count

MAX_ROWS = 8  # rows of h per launch of decode_linear.cu: each lane keeps one sum per row
ROW_LIMIT = 128  # rows whose bits do not depend on the rows beside them (a batch of 32 verifying 4 tokens
# each; the CPU's too); more go to cuBLAS
MAX_VEC_ITERS = 16  # 16-byte pieces of a weight row per lane (registers): K <= 4096 bf16, 2048 float32
_THREADS = 256  # 8 warps (decode_linear.cu: one output column each)
_SMEM_LIMIT = 47 * 1024  # bytes of staged h a block gets without opting in (48 KB less the static rstd)
MMA_ROWS = 32  # rows of h per launch of decode_linear_mma.cu at most (4 n-tiles of 8)
MMA_CHUNK = 32  # K per chunk of decode_linear_mma.cu; chunk c is summed by warp c % 8
MAX_MMA_CHUNKS = 16  # chunks per warp (registers: 8 per chunk and weight row pair): K <= 4096, 2048 SwiGLU


def _staged_bytes(rows: int, weight: Any) -> int:
    """Shared memory of a launch for several rows: h (R, K), bf16 with bf16 weights, else float32; one row
    is normed by each warp itself (no staging)."""
    return 0 if rows == 1 else rows * weight.shape[1] * (2 if weight.dtype == np.uint16 else 4)


def _pieces(k: int, itemsize: int) -> int:
    """16-byte pieces of a weight row per lane (32 lanes share a row)."""
    return -(-k * itemsize // (16 * 32))


def _uses_mma(weight: Any, swiglu: bool) -> bool:
    """The rule: bf16 weights (uint16 bit patterns) run on the tensor cores where decode_linear_mma.cu
    takes their K (a multiple of MMA_CHUNK, at most MAX_MMA_CHUNKS per warp, half with swiglu, which holds
    gate and up rows; 8 rows of h within a block's shared memory), else on the CUDA cores."""
    k = weight.shape[1]
    if weight.dtype != np.uint16 or k % MMA_CHUNK:
        return False
    return _mma_chunks(k) <= MAX_MMA_CHUNKS // (2 if swiglu else 1) and _mma_rows(k, swiglu) > 0


def _mma_chunks(k: int) -> int:
    """Chunks of MMA_CHUNK that each of the 8 warps of decode_linear_mma.cu sums."""
    return -(-k // (8 * MMA_CHUNK))


def _mma_stride(k: int) -> int:
    """Row stride (bf16) of h staged by decode_linear_mma.cu: K, or K + 32 when 2K bytes is a multiple of
    128 (then the two rows one 8-lane load phase reads would share banks)."""
    return k + 32 if k % 64 == 0 else k


def _mma_bytes(rows: int, k: int, swiglu: bool) -> int:
    """Shared memory of one decode_linear_mma.cu launch: h (8 n-tiles, stride) bf16 and the 8 warps' sums
    (parts, 8, 16, 8 n-tiles) float32; n-tiles = ceil(rows / 8)."""
    staged = 8 * -(-rows // 8)
    return staged * _mma_stride(k) * 2 + (2 if swiglu else 1) * 8 * 16 * staged * 4


def _mma_rows(k: int, swiglu: bool) -> int:
    """Rows per launch of decode_linear_mma.cu: 32, or 16 or 8 where 32 rows of h would not fit."""
    limit = device_attribute("MaxSharedMemoryPerBlockOptin")  # shared memory a block may opt in to
    return next((r for r in (MMA_ROWS, 16, 8) if _mma_bytes(r, k, swiglu) <= limit), 0)


def decode_linear_fits(x: Any, weight: Any, norm: Any = None, swiglu: bool = False) -> bool:
    """Whether a kernel takes x (R, K) against this (N, K) weight: at most ROW_LIMIT rows; x, the weight
    and the norm's weight C-contiguous from 16-byte aligned addresses (the kernels read them in pieces);
    and decode_linear_mma.cu takes the weight (_uses_mma), or decode_linear.cu does: rows of the weight a
    whole number of 16-byte pieces, at most MAX_VEC_ITERS of them per lane, a launch's staged h within the
    47 KB a block has beside the kernel's own shared memory."""
    k, itemsize = weight.shape[1], weight.dtype.itemsize
    arrays = [a for a in (x, weight, norm) if a is not None]
    aligned = all(a.data.ptr % 16 == 0 and a.flags.c_contiguous for a in arrays)
    if not (1 <= x.shape[0] <= ROW_LIMIT and aligned):
        return False
    if _uses_mma(weight, swiglu):
        return True
    whole = (k * itemsize) % 16 == 0 and _pieces(k, itemsize) <= MAX_VEC_ITERS
    return whole and _staged_bytes(min(x.shape[0], MAX_ROWS), weight) <= _SMEM_LIMIT


def decode_linear(
    x: Any, weight: Any, norm: Any = None, eps: float = 0.0, residual: Any = None, swiglu: bool = False
) -> Any:
    """out (R, columns) float32 from x (R, K) (float32 or bf16) and weight (N, K) (float32 or bf16;
    decode_linear_fits), columns = N, or N / 2 with swiglu; norm (K,) float32, residual (R, columns)
    float32 contiguous (see decode_linear.py for what each does)."""
    import cupy

    r = x.shape[0]
    columns = weight.shape[0] // 2 if swiglu else weight.shape[0]
    out = cupy.empty((r, columns), dtype=cupy.float32)
    mma = _uses_mma(weight, swiglu)
    launch, group = (_launch_mma, _mma_rows(weight.shape[1], swiglu)) if mma else (_launch, MAX_ROWS)
    for r0 in range(0, r, group):  # groups of rows: contiguous row blocks, 16-byte aligned (whole pieces)
        rows = slice(r0, min(r0 + group, r))
        launch(out[rows], x[rows], weight, norm, eps, None if residual is None else residual[rows], swiglu)
    return out


@functools.cache
def _mma_kernel(rows: int, k: int, x_bf16: bool, norm: bool, swiglu: bool, residual: bool) -> Any:
    """decode_linear_mma.cu built for these rows, K and switches, allowed the shared memory it takes."""
    kernel = get_kernel(
        "decode_linear_mma.cu",
        "decode_linear_mma",
        ROWS=rows,
        CHUNKS=_mma_chunks(k),
        HS=_mma_stride(k),
        X_BF16=int(x_bf16),
        NORM=int(norm),
        SWIGLU=int(swiglu),
        RESIDUAL=int(residual),
    )
    kernel.max_dynamic_shared_size_bytes = _mma_bytes(rows, k, swiglu)
    return kernel


def _launch_mma(out: Any, x: Any, weight: Any, norm: Any, eps: float, residual: Any, swiglu: bool) -> None:
    """One launch of decode_linear_mma.cu over x's rows (at most _mma_rows) into out: tiles of 16 columns,
    at most two blocks an SM (each stages h once and takes every grid-th tile)."""
    r, k = x.shape
    columns = out.shape[1]
    kernel = _mma_kernel(r, k, x.dtype == np.uint16, norm is not None, swiglu, residual is not None)
    g = x if norm is None else norm  # an unused pointer when the switch is off
    res = x if residual is None else residual
    args = (out, x, weight, g, res, np.int32(k), np.int32(columns), np.float32(eps))
    grid = min(blocks(columns, 16), 2 * sm_count())
    kernel((grid,), (_THREADS,), args, shared_mem=_mma_bytes(r, k, swiglu))


def _launch(out: Any, x: Any, weight: Any, norm: Any, eps: float, residual: Any, swiglu: bool) -> None:
    """One launch over x's rows (at most MAX_ROWS) into out."""
    r, k = x.shape
    columns = out.shape[1]
    kernel = get_kernel(
        "decode_linear.cu",
        "decode_linear",
        ROWS=r,
        VEC_ITERS=_pieces(k, weight.dtype.itemsize),
        W_BF16=int(weight.dtype == np.uint16),
        X_BF16=int(x.dtype == np.uint16),
        NORM=int(norm is not None),
        SWIGLU=int(swiglu),
        RESIDUAL=int(residual is not None),
        STAGED=int(r > 1),
    )
    g = x if norm is None else norm  # an unused pointer when the switch is off
    res = x if residual is None else residual
    args = (out, x, weight, g, res, np.int32(k), np.int32(columns), np.float32(eps))
    kernel((blocks(columns, 8),), (_THREADS,), args, shared_mem=_staged_bytes(r, weight))
