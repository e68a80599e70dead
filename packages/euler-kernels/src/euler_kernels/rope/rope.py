"""Rotary position embedding with precomputed tables and the rotate-half pairing of HF Llama.

Pair i of a head vector is (x[..., i], x[..., i + D // 2]); at position p it is rotated by the angle
p * theta ** (-2 i / D). `offset` shifts positions, so a KV-cache decode step uses offset = past length.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from euler_kernels import cuda
from euler_kernels.backend import (
    bf16_bits,
    check_activations,
    check_float,
    get_array_module,
    is_bf16,
    shape_error,
)
from euler_kernels.rope import rope_cuda


class RoPECache(NamedTuple):
    """rope_forward's cache on the array operations (NumPy, or CuPy float64): the (T, H, D) tables."""

    cos_full: Any  # cat(cos, cos) at x's positions
    sin_signed: Any  # cat(-sin, sin) at x's positions


class RoPEKernelCache(NamedTuple):
    """rope_forward's cache on the GPU kernel: the (P, D/2) tables and where x sat in them."""

    cos: Any
    sin: Any
    offset: int  # x's first position
    shape: tuple  # x's (B, T, H, D)
    bf16: bool  # x was bf16: dx is bf16 too


def rope_tables(
    head_dim: int, max_positions: int, theta: float = 10000.0, dtype: Any = np.float32, xp: ModuleType = np
) -> tuple[Any, Any]:
    """cos, sin tables, each (max_positions, head_dim // 2), computed in float64 then cast.

    >>> cos, sin = rope_tables(4, 3)
    >>> cos.shape, float(cos[0, 0]), round(float(sin[1, 0]), 4)
    ((3, 2), 1.0, 0.8415)
    """
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"rope_tables: head_dim must be a positive even number, got {head_dim}")
    if max_positions <= 0:
        raise ValueError(f"rope_tables: max_positions must be positive, got {max_positions}")
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # (D/2,)
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]  # (P, D/2)
    return xp.asarray(np.cos(angles), dtype=dtype), xp.asarray(np.sin(angles), dtype=dtype)


def _rotate(x: Any, cos_full: Any, sin_signed: Any, sign: float) -> Any:
    """x * cos + swap_halves(x) * (+-sin), i.e. (x1 cos - x2 sin, x2 cos + x1 sin) for sign=1 and the
    inverse rotation for sign=-1 (the backward pass: the rotation is orthogonal)."""
    xp = np if type(x) is np.ndarray else get_array_module(x)
    b, t, h, d = x.shape
    swapped = xp.ascontiguousarray(x.reshape(b, t, h, 2, d // 2)[..., ::-1, :]).reshape(x.shape)  # (x2, x1)
    out = x * cos_full  # (B, T, H, D): tables are (T, H, D), so each pass runs over long contiguous rows
    swapped *= sin_signed
    if sign > 0:
        out += swapped
    else:
        out -= swapped
    return out


def _check_tables(fn: str, x: Any, cos: Any, sin: Any, offset: int) -> None:
    if x.ndim != 4 or x.shape[-1] % 2:
        raise shape_error(fn, "x must be (B, T, H, D) with D even", x=x)
    t, d = x.shape[1], x.shape[-1]
    if cos.shape != sin.shape or cos.ndim != 2 or cos.shape[1] != d // 2:
        raise shape_error(fn, "cos and sin must be (P, D // 2)", x=x, cos=cos, sin=sin)
    if offset < 0 or offset + t > cos.shape[0]:
        raise shape_error(
            fn, f"positions offset..offset+T = {offset}..{offset + t} exceed the table", x=x, cos=cos
        )


def _tables_for(fn: str, x: Any, cos: Any, sin: Any, offset: int) -> tuple[Any, Any]:
    """(T, H, D) tables for x's positions: cat(cos, cos) and cat(-sin, sin), one row per head."""
    _check_tables(fn, x, cos, sin, offset)
    _, t, h, d = x.shape
    xp = np if type(x) is np.ndarray else get_array_module(x)
    c, s = cos[offset : offset + t, None, :], sin[offset : offset + t, None, :]  # (T, 1, D/2)
    cos_full = xp.broadcast_to(xp.concatenate([c, c], axis=-1), (t, h, d))
    sin_signed = xp.broadcast_to(xp.concatenate([-s, s], axis=-1), (t, h, d))
    return xp.ascontiguousarray(cos_full), xp.ascontiguousarray(sin_signed)


def rope_forward(
    x: Any, cos: Any, sin: Any, offset: int = 0, in_place: bool = False
) -> tuple[Any, RoPECache | RoPEKernelCache]:
    """Rotate x (B, T, H, D) at positions offset .. offset + T - 1; out has x's shape and dtype.

    x may be a bf16 activation (GPU, with float32 tables): out is bf16, and so is the gradient.
    in_place: x itself is rotated and returned. On the GPU x may then be heads of a wider row (q or k as
    columns of the joint q/k/v product's rows, `cuda.token_stride`), rotated where they are.
    """
    host = type(x) is np.ndarray  # NumPy: the array operations below, nothing else to choose
    x = x if host else bf16_bits(x)  # a CuPy bfloat16 array as its bit patterns
    if not host and check_activations("rope_forward", x=x) == "bf16":
        check_float("rope_forward", cos=cos, sin=sin)
        if not cuda.float32_on_gpu(cos, sin):
            raise ValueError("rope_forward: a bf16 x needs float32 CuPy cos/sin tables")
    else:
        check_float("rope_forward", x=x, cos=cos, sin=sin)
    if not host and (is_bf16(x) or cuda.float32_on_gpu(x, cos, sin)):  # one kernel reads the (P, D/2) tables
        _check_tables("rope_forward", x, cos, sin, offset)
        cache = RoPEKernelCache(cos, sin, offset, x.shape, is_bf16(x))
        return rope_cuda.rope_rotate(x, cos, sin, offset, 1.0, out=x if in_place else None), cache
    c, s = _tables_for("rope_forward", x, cos, sin, offset)
    out = _rotate(x, c, s, 1.0)
    if in_place:
        x[...] = out
        out = x
    return out, RoPECache(c, s)


def rope_rows(x: Any, cos_rows: Any, sin_rows: Any) -> Any:
    """Rotate x (..., H, D) when each row sits at its own position: cos_rows, sin_rows (..., D/2) are the
    tables' rows at those positions, x (B, H, D) with (B, D/2) rows, or one row x (H, D) with (D/2,) (the
    decode step's case; forward only, NumPy-style arrays). The same numbers as rope_forward: x1 cos - x2 sin
    equals its x1 cos + x2 (-sin) exactly.

    >>> cos, sin = rope_tables(2, 3)
    >>> rope_rows(np.ones((2, 1, 2)), cos[[0, 2]], sin[[0, 2]]).round(4).tolist()
    [[[1.0, 1.0]], [[-1.3254, 0.4932]]]
    >>> rope_rows(np.ones((1, 2)), cos[2], sin[2]).round(4).tolist()  # one row: (H, D) at position 2
    [[-1.3254, 0.4932]]
    """
    d = x.shape[-1]
    pairs = x.reshape(*x.shape[:-1], 2, d // 2)  # (..., H, 2, D/2): the halves (x1, x2)
    c, s = cos_rows[..., None, None, :], sin_rows[..., None, None, :]  # (..., 1, 1, D/2)
    out = pairs * c  # (x1 cos, x2 cos)
    crossed = pairs[..., ::-1, :] * s  # (x2 sin, x1 sin)
    first = crossed[..., 0, :]
    get_array_module(x).negative(first, out=first)  # (-x2 sin, x1 sin): one addition does both halves
    out += crossed
    return out.reshape(x.shape)


def rope_backward(dout: Any, cache: RoPECache | RoPEKernelCache, out: Any = None) -> Any:
    """dx: the rotation is orthogonal, so the gradient is dout rotated back by -angle.

    out: an array shaped like dout to write dx into (returned); on the GPU of the gradient's type (bf16 for a
    bf16 forward), contiguous or heads of a wider row (dq, dk into the joint q/k/v gradient's columns)."""
    if type(cache) is RoPEKernelCache:
        dout, out = bf16_bits(dout), bf16_bits(out)  # a CuPy bfloat16 array as its bit patterns
        if dout.shape != cache.shape:
            raise shape_error("rope_backward", f"dout must be {cache.shape} as in forward", dout=dout)
        cos, sin, offset, bf16 = cache.cos, cache.sin, cache.offset, cache.bf16
        return rope_cuda.rope_rotate(dout, cos, sin, offset, -1.0, bf16_out=bf16, out=out)  # bf16: a bf16 dx
    c, s = cache.cos_full, cache.sin_signed
    if dout.ndim != 4 or dout.shape[1:] != c.shape:
        raise shape_error("rope_backward", "dout must be (B, T, H, D) matching forward", dout=dout, cos=c)
    dx = _rotate(dout, c, s, -1.0)
    if out is None:
        return dx
    out[...] = dx
    return out
