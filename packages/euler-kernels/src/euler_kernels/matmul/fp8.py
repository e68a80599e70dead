"""Launchers of fp8.cu: a tensor's absolute maximum, and its FP8 copy (e4m3 or e5m2, one power-of-two scale
per tensor; the rule and its NumPy reference are in fp8_format.py) row-major, transposed, or both, the
operands of gemm_fp8 (which wants the summed dimension contiguous in both operands)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from euler_kernels.cuda._module import THREADS, get_kernel, grid
from euler_kernels.matmul.fp8_format import FORMATS

FP8_TILE = 64  # fp8.cuh's FP8_TILE: a block of fp8.cu's or swiglu.cu's FP8 kernels writes 64 x 64 values


@dataclass
class Fp8Tensor:
    """An FP8 copy of a (rows, cols) tensor x: x = fp8 value * scale_inv.

    rows: (rows, cols) uint8 bit patterns, or None; cols: the transpose, (cols, rows), or None;
    scale_inv: a float32 device scalar, 2^-k; fmt: "e4m3" or "e5m2"; n_rows: how many of the rows hold
    the tensor's values when the rest are zero rows that pad it to the FP8 products' multiple of 16 (None:
    all of them)."""

    fmt: str
    shape: tuple[int, int]
    rows: Any
    cols: Any
    scale_inv: Any
    n_rows: int | None = None


def amax_bits(x: Any, out: Any = None) -> Any:
    """The largest |value| of a C-contiguous float32 or bf16 (uint16) CuPy array as a uint32 device scalar
    holding its float32 bit pattern (NaN anywhere: a NaN pattern). out: a uint32 scalar to raise to it
    (atomic max: one scalar can collect several tensors); None: a new one, starting at 0."""
    import cupy

    _check_source(x, "amax_bits")
    out = cupy.zeros((), dtype=cupy.uint32) if out is None else out
    if x.size:
        name = "amax_bf16" if x.dtype == np.uint16 else "amax_f32"
        args = (x, np.int64(x.size), np.int32(_aligned(x)), out)
        get_kernel("fp8.cu", name)(grid((x.size + 7) // 8), (THREADS,), args)
    return out


def amax_pointer(amax: Any, what: str) -> Any:
    """The amax argument of a kernel that raises a maximum while it makes a tensor (swiglu.cu, rmsnorm.cu):
    a uint32 scalar in amax_bits' form, or a null pointer for None."""
    if amax is None:
        return np.uint64(0)
    if amax.dtype != np.uint32 or amax.size != 1:
        raise ValueError(f"{what}: amax must be a uint32 scalar (fp8.amax_bits's form), got {amax.dtype}")
    return amax


def to_fp8(x: Any, fmt: str, rows: bool = True, cols: bool = False, amax: Any = None) -> Fp8Tensor:
    """The FP8 copy of a C-contiguous 2-D float32 or bf16 (uint16) CuPy array: row-major (rows), transposed
    (cols), or both from one read. amax: its `amax_bits` if the caller has it (say, from the kernel that
    made x); None: measured here first (one more read of x)."""
    import cupy

    _check_source(x, "to_fp8")
    if fmt not in FORMATS:
        raise ValueError(f"to_fp8: format must be one of {sorted(FORMATS)}, got {fmt!r}")
    if x.ndim != 2 or not (rows or cols):
        raise ValueError(f"to_fp8: needs a 2-D array and rows or cols, got {x.shape}")
    n_rows, n_cols = x.shape
    amax = amax_bits(x) if amax is None else amax
    out = cupy.empty((n_rows, n_cols), dtype=cupy.uint8) if rows else None
    out_t = cupy.empty((n_cols, n_rows), dtype=cupy.uint8) if cols else None
    scale_inv = cupy.empty((), dtype=cupy.float32)
    if x.size:
        name = "cast_fp8_bf16" if x.dtype == np.uint16 else "cast_fp8_f32"
        kernel = get_kernel("fp8.cu", name, FP8_E5M2=int(fmt == "e5m2"))
        blocks = ((n_cols + FP8_TILE - 1) // FP8_TILE, (n_rows + FP8_TILE - 1) // FP8_TILE)
        null = np.uint64(0)
        aligned = np.int32(all(_aligned(a) for a in (x, out, out_t) if a is not None))
        args = (x, np.int64(n_rows), np.int64(n_cols), aligned, amax, null if out is None else out,
                null if out_t is None else out_t, scale_inv)  # fmt: skip
        kernel(blocks, (THREADS,), args)
    else:
        scale_inv.fill(1.0)
    return Fp8Tensor(fmt, (n_rows, n_cols), out, out_t, scale_inv)


def _aligned(a: Any) -> bool:
    return a.data.ptr % 16 == 0


def _check_source(x: Any, what: str) -> None:
    if x.dtype not in (np.float32, np.uint16) or not x.flags.c_contiguous:
        raise ValueError(f"{what}: needs a C-contiguous float32 or bf16 (uint16) array, got {x.dtype}")
