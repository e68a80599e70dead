"""Launcher of decode_linear.cu: a few rows through a linear layer, with the norm before it and SwiGLU or the
residual addition after it, in one launch (one warp per output column) per group of at most 8 rows.

Every row's sums are formed the same way whatever the number of rows (one, a group, several groups), so a
speculative step's T rows per sequence decode exactly as plain steps' single rows do: that is why more
rows than a launch takes run as several launches (the later ones read the weights from L2) rather than as
one cuBLAS product, whose sums depend on its shape."""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda._module import blocks, get_kernel

MAX_ROWS = 8  # rows of h per launch: each lane keeps one sum per row
MAX_GROUPS = 16  # launches of MAX_ROWS rows at most (128: a batch of 32 verifying 4 tokens each); then cuBLAS
ROW_LIMIT = MAX_ROWS * MAX_GROUPS  # rows whose bits do not depend on the rows beside them (the CPU's too)
MAX_VEC_ITERS = 16  # 16-byte pieces of a weight row per lane (registers): K <= 4096 bf16, 2048 float32
_THREADS = 256  # 8 warps, one output column each
_SMEM_LIMIT = 47 * 1024  # bytes of staged h a block gets without opting in (48 KB less the static rstd)


def _staged_bytes(rows: int, weight: Any) -> int:
    """Shared memory of a launch for several rows: h (R, K), bf16 with bf16 weights, else float32; one row
    is normed by each warp itself (no staging)."""
    return 0 if rows == 1 else rows * weight.shape[1] * (2 if weight.dtype == np.uint16 else 4)


def _pieces(k: int, itemsize: int) -> int:
    """16-byte pieces of a weight row per lane (32 lanes share a row)."""
    return -(-k * itemsize // (16 * 32))


def decode_linear_fits(x: Any, weight: Any, norm: Any = None) -> bool:
    """Whether the kernel takes x (R, K) against this (N, K) weight: at most ROW_LIMIT rows (a launch's
    staged h fits the 47 KB a block has beside the kernel's own shared memory), rows of the weight a whole
    number of 16-byte pieces, at most MAX_VEC_ITERS of them per lane, and x, the weight and the norm's
    weight C-contiguous from 16-byte aligned addresses (the kernel reads them in pieces)."""
    k, itemsize = weight.shape[1], weight.dtype.itemsize
    arrays = [a for a in (x, weight, norm) if a is not None]
    aligned = all(a.data.ptr % 16 == 0 and a.flags.c_contiguous for a in arrays)
    whole = (k * itemsize) % 16 == 0 and _pieces(k, itemsize) <= MAX_VEC_ITERS
    rows = min(x.shape[0], MAX_ROWS)  # of one launch
    rows_ok = 1 <= x.shape[0] <= ROW_LIMIT and _staged_bytes(rows, weight) <= _SMEM_LIMIT
    return rows_ok and aligned and whole


def decode_linear(
    x: Any, weight: Any, norm: Any = None, eps: float = 0.0, residual: Any = None, swiglu: bool = False
) -> Any:
    """out (R, columns) float32 from x (R, K) (float32 or bf16) and weight (N, K) (float32 or bf16;
    decode_linear_fits), columns = N, or N / 2 with swiglu; norm (K,) float32, residual (R, columns)
    float32 contiguous (see ops/decode_linear.py for what each does)."""
    import cupy

    r = x.shape[0]
    columns = weight.shape[0] // 2 if swiglu else weight.shape[0]
    out = cupy.empty((r, columns), dtype=cupy.float32)
    for r0 in range(0, r, MAX_ROWS):  # groups of rows: contiguous row blocks, 16-byte aligned (whole pieces)
        rows = slice(r0, min(r0 + MAX_ROWS, r))
        _launch(out[rows], x[rows], weight, norm, eps, None if residual is None else residual[rows], swiglu)
    return out


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
