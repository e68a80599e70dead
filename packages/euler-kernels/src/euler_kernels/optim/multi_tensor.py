"""Launchers of multi_tensor.cu: the optimizer step's kernels that cover a whole list of tensors in one
launch (AdamW, the sum of squares of every gradient, the clip factor, the device-side step control).

A multi-tensor kernel runs one block per chunk of CHUNK elements; it finds its tensor and range in small
device tables (pointers, chunk -> tensor, chunk -> start, sizes: euler_kernels.cuda.tables, shared with
the casts and the gradient sums).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda._module import THREADS, get_kernel
from euler_kernels.cuda.tables import bf16_table, chunk_table, table_cache, upload


def sum_squares_multi(tensors: list[Any]) -> Any:
    """Sum of squares of all elements of all tensors (float32, or bf16 bit patterns), as a float64 device
    scalar (shape (1,))."""
    import cupy

    pointers, chunk_tensor, chunk_start, sizes = chunk_table(tensors)
    partials = cupy.empty((chunk_tensor.size,), dtype=cupy.float64)  # one per chunk
    args = (partials, pointers, bf16_table(tensors), chunk_tensor, chunk_start, sizes)
    get_kernel("multi_tensor.cu", "sum_squares_multi")((chunk_tensor.size,), (THREADS,), args)
    out = cupy.empty((1,), dtype=cupy.float64)
    get_kernel("multi_tensor.cu", "sum_partials")((1,), (1024,), (out, partials, np.int32(partials.size)))
    return out


def clip_factor(sum_squares: Any, max_norm: float) -> tuple[Any, Any]:
    """Device scalars (factor, norm): factor = min(1, max_norm / norm), computed without a host sync."""
    import cupy

    factor = cupy.empty((1,), dtype=cupy.float32)
    norm = cupy.empty((1,), dtype=cupy.float32)
    args = (factor, norm, sum_squares, np.float32(max_norm))
    get_kernel("multi_tensor.cu", "clip_factor")((1,), (1,), args)
    return factor, norm


_decay_tables: dict[tuple, Any] = {}


def _decay_table(weight_decays: list[float]) -> Any:
    """The per-tensor weight decays as a float32 device array, made once per list (no copy per step)."""
    import cupy

    key = tuple(float(d) for d in weight_decays)
    if key not in _decay_tables:
        _decay_tables[key] = cupy.asarray(np.asarray(key, dtype=np.float32))
    return _decay_tables[key]


def _adamw_tables(
    params: list[Any], ms: list[Any], vs: list[Any], grads: list[Any], weight_decays: list[float]
) -> tuple:
    """The nine table arguments both AdamW kernels start with: pointers of params, m, v, grads, the grads'
    bf16 flags, the decays, chunk -> tensor, chunk -> start, sizes."""
    p_ptr, chunk_tensor, chunk_start, sizes = chunk_table(params)
    m_ptr, v_ptr, g_ptr = (chunk_table(ts)[0] for ts in (ms, vs, grads))
    flags = bf16_table(grads)
    return (p_ptr, m_ptr, v_ptr, g_ptr, flags, _decay_table(weight_decays), chunk_tensor, chunk_start, sizes)


def adamw_multi(
    params: list[Any],
    ms: list[Any],
    vs: list[Any],
    grads: list[Any],
    weight_decays: list[float],
    bias_corrections: tuple[float, float],
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    grad_scale: Any = None,
) -> None:
    """One launch updates every tensor in place; grads float32 or bf16 (uint16) each; grad_scale is an
    optional float32 device scalar."""
    import cupy

    tables = _adamw_tables(params, ms, vs, grads, weight_decays)
    scale = cupy.ones((1,), dtype=cupy.float32) if grad_scale is None else grad_scale
    bc1, bc2 = bias_corrections
    args = (*tables, scale, *(np.float32(x) for x in (lr, beta1, beta2, eps, bc1, bc2)))
    grid = (tables[6].size,)  # one block per chunk
    get_kernel("multi_tensor.cu", "adamw_multi")(grid, (THREADS,), args)


def step_control(sum_squares: Any, loss: Any, hyper: Any, max_norm: float, out: Any = None) -> Any:
    """Device control vector [grad_scale, apply, lr, bc1, bc2, norm] for `adamw_multi_ctl`.

    sum_squares: float64 (1,) from `sum_squares_multi`; loss: float32 device scalar; hyper: float32 (4,)
    device array [lr, 1 - beta1**t, 1 - beta2**t, enable] written by the host before each step.
    Nothing is read back to the host, so a CUDA graph can replay it with new `hyper` values.
    """
    import cupy

    control = cupy.empty((6,), dtype=cupy.float32) if out is None else out
    args = (control, sum_squares, loss, hyper, np.float32(max_norm))
    get_kernel("multi_tensor.cu", "step_control")((1,), (1,), args)
    return control


def _copy_table(copies: list[Any | None]) -> Any:
    """Device pointers of AdamW's bf16 copies, 0 where a tensor has none (cached by address)."""
    pointers = tuple(0 if c is None else c.data.ptr for c in copies)
    # the cache keeps the whole upload: inside a capture its pinned host buffer is what the graph copies
    key = ("bf16 copy pointers", *pointers)
    (table,) = table_cache.get(key, lambda: upload(np.array(pointers, dtype=np.uint64)))
    return table


def adamw_multi_ctl(
    params: list[Any],
    ms: list[Any],
    vs: list[Any],
    grads: list[Any],
    weight_decays: list[float],
    control: Any,
    beta1: float,
    beta2: float,
    eps: float,
    copies: list[Any | None] | None = None,
) -> None:
    """`adamw_multi` with the clip factor, lr, bias corrections and a skip flag read from `control`;
    copies[i] (a C-contiguous uint16 array of params[i]'s shape, or None) receives the updated weights
    rounded to bf16 in the same pass (a skipped update leaves it, like the weights, unchanged)."""
    import cupy

    copies = [None] * len(params) if copies is None else list(copies)
    for p, c in zip(params, copies):
        if c is not None and (c.shape != p.shape or c.dtype != cupy.uint16 or not c.flags.c_contiguous):
            raise ValueError(
                f"adamw_multi_ctl: a bf16 copy must be a C-contiguous uint16 array of its weight's shape "
                f"{p.shape}, got {c.dtype} {c.shape}"
            )
    if len(copies) != len(params):
        raise ValueError(f"adamw_multi_ctl: {len(copies)} copies for {len(params)} params")
    tables = _adamw_tables(params, ms, vs, grads, weight_decays)
    args = (
        *tables,
        _copy_table(copies),
        control,
        np.float32(beta1),
        np.float32(beta2),
        np.float32(eps),
    )
    grid = (tables[6].size,)  # one block per chunk
    get_kernel("multi_tensor.cu", "adamw_multi_ctl")(grid, (THREADS,), args)
