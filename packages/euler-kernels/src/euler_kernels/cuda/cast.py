"""Launchers of cast.cu: float32 -> bfloat16 rounding (nearest even), one array or many in one launch;
and the way back.

bf16 tensors are uint16 CuPy arrays of bf16 bit patterns. The bf16 matmul mode rounds operands with
`to_bf16`; ops that take bf16 activations round a float32 gradient once with `as_bf16`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.backend import is_bf16
from euler_kernels.cuda._module import THREADS, get_kernel, grid
from euler_kernels.cuda.tables import chunk_table, table_cache, upload


def to_bf16(x: Any, out: Any = None) -> Any:
    """A C-contiguous float32 CuPy array rounded to bfloat16 (nearest even), as uint16 bit patterns.

    out: a uint16 (rows, cols) matrix to write a (rows, cols) x into instead (returned), C-contiguous or
    its rows a stride apart (columns of a wider matrix, such as dv's in the joint q/k/v gradient)."""
    import cupy

    if out is None:
        out = cupy.empty(x.shape, dtype=cupy.uint16)
        get_kernel("cast.cu", "float_to_bf16_kernel")(grid(x.size), (THREADS,), (out, x, np.int64(x.size)))
        return out
    rows_ok = out.ndim == 2 and out.strides[1] == 2 and out.strides[0] >= 0
    if not rows_ok or out.shape != x.shape or out.dtype != np.uint16:
        raise ValueError(f"to_bf16: out must be a uint16 {x.shape} matrix with contiguous rows")
    args = (out, np.int64(out.strides[0] // 2), x, np.int64(x.shape[1]), np.int64(x.size))
    get_kernel("cast.cu", "float_to_bf16_rows")(grid(x.size), (THREADS,), args)
    return out


def as_bf16(x: Any) -> Any:
    """x as a C-contiguous bf16 array (uint16 bit patterns): itself if it is one already, else rounded by
    `to_bf16` (a float32 CuPy array, copied to C order first if it is not)."""
    x = x if x.flags.c_contiguous else x.copy()
    return x if x.dtype == np.uint16 else to_bf16(x)


def _adjacent_copies(shapes: list[tuple]) -> list[Any]:
    """uint16 arrays of these shapes, one after another in one allocation (each 16-byte aligned), so that
    copies of matrices listed one after another are the row blocks of one matrix (`stacked_rows`)."""
    import cupy

    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    starts = np.cumsum([0] + [-(-n // 8) * 8 for n in sizes])  # in elements: 8 of them make 16 bytes
    flat = cupy.empty((int(starts[-1]),), dtype=cupy.uint16)
    return [flat[a : a + n].reshape(s) for a, n, s in zip(starts, sizes, shapes)]


def stacked_rows(matrices: list[Any]) -> Any:
    """The (sum of rows, C) matrix whose consecutive row blocks the C-contiguous (rows_i, C) matrices are,
    as a view, when they lie one after another in one allocation (bf16 copies that `to_bf16_many` made
    together, such as the q, k and v projections'); else None."""
    import cupy

    if not matrices or not all(isinstance(m, cupy.ndarray) and m.ndim == 2 for m in matrices):
        return None
    first = matrices[0]
    end = first.data.ptr
    for m in matrices:
        same = m.dtype == first.dtype and m.shape[1] == first.shape[1] and m.flags.c_contiguous
        if not same or m.data.mem is not first.data.mem or m.data.ptr != end:
            return None
        end += m.nbytes
    rows = sum(m.shape[0] for m in matrices)
    return cupy.ndarray((rows, first.shape[1]), dtype=first.dtype, memptr=first.data)


def from_bf16(x16: Any) -> Any:
    """bfloat16 bit patterns (uint16 CuPy array) -> the float32 values they stand for (exact)."""
    import cupy

    return (x16.astype(cupy.uint32) << 16).view(cupy.float32)


def as_float32(x: Any) -> Any:
    """x itself, or the float32 values of a bf16 array (bf16 weight gradients on a path without
    multi-tensor kernels)."""
    return from_bf16(x) if is_bf16(x) else x


def to_bf16_many(tensors: list[Any], out: list[Any] | None = None) -> list[Any]:
    """bf16 copies (uint16 bit patterns) of C-contiguous float32 tensors, all made in one launch.

    The copies live in buffers kept per list of tensors (in the same cache as the multi-tensor tables, so
    a captured graph's `keep_tables()` scope keeps them too): every call with the same tensors writes the
    same buffers, so the copies of an earlier call are overwritten, and a CUDA graph can replay the cast.
    out: C-contiguous uint16 buffers of the tensors' shapes to write instead (returned).
    """
    import cupy

    def build() -> tuple[list[Any], Any]:  # (the copies, their pointers uploaded: kept with the copies)
        outs = _adjacent_copies([t.shape for t in tensors]) if out is None else list(out)
        return outs, upload(np.array([o.data.ptr for o in outs], dtype=np.uint64))

    if out is None:
        key = ("bf16 copies", *((t.data.ptr, t.size) for t in tensors))
    else:
        if [o.shape for o in out] != [t.shape for t in tensors] or any(o.dtype != cupy.uint16 for o in out):
            raise ValueError("to_bf16_many: out must be uint16 buffers of the tensors' shapes")
        key = ("bf16 into", *((o.data.ptr, o.size) for o in out))
    outs, (out_pointers,) = table_cache.get(key, build)
    in_pointers, chunk_tensor, chunk_start, sizes = chunk_table(tensors)
    args = (out_pointers, in_pointers, chunk_tensor, chunk_start, sizes)
    get_kernel("cast.cu", "float_to_bf16_multi")((chunk_tensor.size,), (THREADS,), args)
    return outs
