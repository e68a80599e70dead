"""Launcher of rope.cu: rotate head vectors by their position's angles, reading the (P, D/2) tables."""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda._module import blocks, contiguous, get_kernel, grid_cap, token_stride

# the kernel reading eight pairs per thread in 16-byte pieces, for each one reading a value at a time
_VEC8 = {
    "rope_rotate": "rope_rotate_vec8",
    "rope_rotate_bf16": "rope_rotate_bf16_vec8",
    "rope_rotate_to_bf16": "rope_rotate_to_bf16_vec8",
}


def rope_rotate(
    x: Any, cos: Any, sin: Any, offset: int, direction: float, bf16_out: bool = False, out: Any = None
) -> Any:
    """Rotate x (B, T, H, D) by +angle (direction 1, forward) or -angle (direction -1, backward).

    x is float32 or bfloat16 (uint16 bit patterns); out is bf16 when x is, or when bf16_out is set.
    x may have its tokens a stride apart (the heads of a wider row, `token_stride`), read in place.
    out: an array of that type and x's shape to write instead of a new one, contiguous or with its tokens a
    stride apart; x itself rotates in place."""
    import cupy

    cos, sin = contiguous(cos, sin)
    if token_stride(x) is None:
        x = cupy.ascontiguousarray(x)
    _, T, H, D = x.shape
    x_bf16 = x.dtype == cupy.uint16
    out_type = cupy.uint16 if x_bf16 or bf16_out else cupy.float32
    if out is None:
        out = cupy.empty(x.shape, dtype=out_type)
    elif out.shape != x.shape or out.dtype != out_type or token_stride(out) is None:
        raise ValueError(f"rope_rotate: out must be {np.dtype(out_type).name} {x.shape} with packed heads")
    name = "rope_rotate_bf16" if x_bf16 else "rope_rotate_to_bf16" if bf16_out else "rope_rotate"
    n_rows = x.size // D  # (b, t, h) rows
    if n_rows >= 2**31:
        raise ValueError(f"rope_rotate: {n_rows} rows of head vectors exceed the kernel's 32-bit row index")
    strides = (np.int64(token_stride(x)), np.int64(token_stride(out)))
    args = (out, x, cos, sin, np.int32(n_rows), np.int32(T), np.int32(H), np.int32(D), np.int32(offset))
    aligned = all(a.data.ptr % 16 == 0 for a in (x, cos, sin, out))
    rows_aligned = all(s * a.itemsize % 16 == 0 for s, a in zip(strides, (x, out)))
    if D % 16 == 0 and aligned and rows_aligned:  # 8 pairs a thread, 16-byte accesses: (D/16 lanes, rows)
        lanes = min(D // 16, 32)
        name, block = _VEC8[name], (lanes, 256 // lanes)
    else:  # blocks of (32 pair lanes, 8 rows)
        block = (32, 8)
    grid = (min(blocks(n_rows, block[1]), grid_cap()),)
    get_kernel("rope.cu", name)(grid, block, (*args, np.float32(direction), *strides))
    return out
