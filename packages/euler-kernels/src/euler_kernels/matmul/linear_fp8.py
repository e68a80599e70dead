"""The FP8 path of the linear op (GPU, a weight given as an FP8 copy, made once a step by `fp8_weights`):
out = x @ weight.T with x rounded to e4m3, the gradient of out to e5m2, each with one power-of-two scale
per tensor (fp8_format.py), and every product on the FP8 tensor cores (gemm_fp8.py), summed in float32.

Hopper's FP8 products sum over a contiguous dimension of both operands, so each tensor is cast once into
a row-major and a transposed FP8 copy: the forward uses x and the weight as they are, dx the gradient and
the weight's transpose, dweight the transposes of the gradient and of x. The cache keeps x's transposed
FP8 copy (one byte a value) in place of x, or with keep_input=False only x's absolute maximum: the
backward then casts the re-made x it is handed with that maximum, which gives the forward's copy bit for
bit. Token counts that are not a multiple of 16 (what the FP8 products need) are padded with zero rows,
which add nothing to the weight gradient.

x and the output gradient may also come already cast (an Fp8Tensor with both its copies, as the kernels
that cast their outputs with a delayed scale make them: swiglu_cuda.py's *_fp8): then no cast runs here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from euler_kernels.matmul.fp8 import Fp8Tensor, amax_bits, to_fp8
from euler_kernels.matmul.gemm_fp8 import FP8_MULTIPLE, gemm_fp8, transposed


class LinearFp8Cache(NamedTuple):
    """linear_forward's cache on the FP8 path: the transposed FP8 copies the backward's products take."""

    x8: Fp8Tensor | None  # x's e4m3 copy, transposed part only; None: keep_input=False (x handed back)
    x_amax: Any  # x's absolute maximum (uint32 scalar) to cast the re-made x with; None for a cast x
    w8: Fp8Tensor  # the weight's e4m3 copy, transposed part only
    x_shape: tuple  # x's (..., C_in)


def is_fp8(weight: Any) -> bool:
    """Whether a linear op's weight is an FP8 copy (then the op runs the FP8 path)."""
    return type(weight) is Fp8Tensor


def fp8_fits(weight: Any) -> bool:
    """Whether a weight (C_out, C_in) can be multiplied in FP8: both sizes multiples of 16.

    >>> import numpy as np
    >>> fp8_fits(np.zeros((32, 48))), fp8_fits(np.zeros((32, 40)))
    (True, False)
    """
    return weight.ndim == 2 and weight.shape[0] % FP8_MULTIPLE == 0 and weight.shape[1] % FP8_MULTIPLE == 0


def fp8_amax() -> Any:
    """A new uint32 scalar at 0 for a tensor's absolute maximum (the form fp8.py's amax_bits gives),
    for a kernel that makes the tensor to raise in the same pass (swiglu's amax=) and the FP8 path to take
    (linear_forward's x_amax=, linear_backward's dout_amax=)."""
    import cupy

    return cupy.zeros((), dtype=cupy.uint32)


def fp8_weights(weights: list[Any]) -> list[Fp8Tensor]:
    """e4m3 copies of float32 CuPy weights (C_out, C_in), row-major (the forward's) and transposed (dx's),
    each scaled by its own power of two; each must pass `fp8_fits`."""
    for w in weights:
        if not fp8_fits(w):
            raise ValueError(
                f"fp8_weights: FP8 products need (C_out, C_in) multiples of {FP8_MULTIPLE}, got {w.shape}"
            )
    return [to_fp8(w, "e4m3", rows=True, cols=True) for w in weights]


def _pad_rows(a2: Any) -> Any:
    """a2 (n, c) with zero rows appended up to a multiple of 16 (itself when n already is one)."""
    import cupy

    n = a2.shape[0]
    if n % FP8_MULTIPLE == 0:
        return a2
    padded = cupy.zeros((n + FP8_MULTIPLE - n % FP8_MULTIPLE, a2.shape[1]), dtype=a2.dtype)
    padded[:n] = a2
    return padded


def forward_fp8(
    x: Any, weights: list[Fp8Tensor], bf16_out: bool, keep_input: bool, x_amax: Any = None
) -> list[tuple[Any, LinearFp8Cache]]:
    """[(x @ w.T, cache) for w in weights], x (..., C_in) float32 or bf16 cast to e4m3 once for all of
    them; outputs bf16 with bf16_out, else float32; keep_input as in linear_forward; x_amax: x's absolute
    maximum if its maker measured it (else measured here)."""
    import cupy

    if isinstance(x, Fp8Tensor):
        return _forward_cast(x, weights, bf16_out, keep_input)
    if not isinstance(x, cupy.ndarray) or x.dtype not in (cupy.float32, cupy.uint16):
        raise ValueError("linear_forward: an FP8 weight needs x as a float32 or bf16 CuPy array")
    for w in weights:
        if x.ndim < 1 or x.shape[-1] != w.shape[1]:
            raise ValueError(f"linear_forward: x{tuple(x.shape)} must end in C_in = {w.shape[1]} (FP8)")
    x2 = x.reshape(-1, x.shape[-1])  # (N, C_in)
    n = x2.shape[0]
    padded = _pad_rows(cupy.ascontiguousarray(x2))
    amax = amax_bits(padded) if x_amax is None else x_amax  # zero rows do not change it
    x8 = to_fp8(padded, "e4m3", rows=True, cols=keep_input, amax=amax)
    kept = dataclasses.replace(x8, rows=None) if keep_input else None  # dweight's operand only
    results = []
    for w in weights:
        out = gemm_fp8(x8, w, bf16_out=bf16_out)[:n].reshape(*x.shape[:-1], w.shape[0])
        w_t = dataclasses.replace(w, rows=None)  # the backward's part only: the caller frees the rest
        results.append((out, LinearFp8Cache(kept, amax, w_t, x.shape)))
    return results


def _cast_rows(t: Fp8Tensor, fmt: str, c: int, what: str) -> int:
    """The real rows of an already-cast operand, checked: its format, both copies, c columns."""
    if t.fmt != fmt or t.rows is None or t.cols is None or t.shape[1] != c:
        raise ValueError(f"linear: an FP8 {what} must be {fmt} with both copies and {c} columns")
    return t.shape[0] if t.n_rows is None else t.n_rows


def _forward_cast(x8: Fp8Tensor, weights: list[Fp8Tensor], bf16_out: bool, keep_input: bool) -> list:
    """forward_fp8 of an x that comes cast: its transposed copy is what the cache keeps (a re-made x could
    not be cast again with the scale it was cast with, so keep_input=False is refused)."""
    if not keep_input:
        raise ValueError("linear_forward: an FP8 x is kept as it is (keep_input=False needs an x to re-make)")
    n = _cast_rows(x8, "e4m3", weights[0].shape[1], "x")
    kept = dataclasses.replace(x8, rows=None)
    results = []
    for w in weights:
        out = gemm_fp8(x8, w, bf16_out=bf16_out)[:n]  # (n, C_out)
        results.append((out, LinearFp8Cache(kept, None, dataclasses.replace(w, rows=None), (n, w.shape[1]))))
    return results


def backward_fp8(
    dout: Any,
    cache: LinearFp8Cache,
    dx_into: Any,
    bf16_dx: bool,
    x: Any,
    dout_amax: Any = None,
    bf16_dweight: bool = False,
) -> tuple[Any, Any]:
    """(dx, dweight) of forward_fp8: dout (..., C_out) float32 or bf16 cast to e5m2 (or an e5m2 Fp8Tensor
    already cast, with both copies, whose n_rows are x's rows); dx bf16 with bf16_dx,
    else float32, or added into dx_into; dweight (C_out, C_in) float32, or bf16 with bf16_dweight. x: the
    forward's input, re-made, when the cache does not keep its FP8 copy (keep_input=False); dout_amax as
    forward_fp8's x_amax."""
    import cupy

    x8, amax, w8, x_shape = cache.x8, cache.x_amax, cache.w8, cache.x_shape
    c_out, c_in = w8.shape
    if isinstance(dout, Fp8Tensor):  # cast by the kernel that made it
        n, d8 = _cast_rows(dout, "e5m2", c_out, "output gradient"), dout
        n_x = int(np.prod(x_shape[:-1], dtype=np.int64))
        if n != n_x:
            raise ValueError(f"linear_backward: an FP8 dout of {n} rows for an x of {n_x} rows")
    else:
        if tuple(dout.shape) != (*x_shape[:-1], c_out):
            raise ValueError(f"linear_backward: dout{tuple(dout.shape)} must be x.shape[:-1] + ({c_out},)")
        d2 = cupy.ascontiguousarray(dout.reshape(-1, c_out))  # (N, C_out)
        n = d2.shape[0]
        d8 = to_fp8(_pad_rows(d2), "e5m2", rows=True, cols=True, amax=dout_amax)
    if x8 is None:  # cast as the forward cast it: the same values and maximum give the same bits
        x2 = cupy.ascontiguousarray(x.reshape(-1, x_shape[-1]))
        x8 = to_fp8(_pad_rows(x2), "e4m3", rows=False, cols=True, amax=amax)
    padded = n % FP8_MULTIPLE != 0
    if dx_into is not None and not padded:  # cuBLASLt adds the product into it
        gemm_fp8(d8, transposed(w8), out=dx_into.reshape(-1, c_in))
        dx = dx_into
    else:
        dx = gemm_fp8(d8, transposed(w8), bf16_out=bf16_dx)[:n].reshape(x_shape)
        if dx_into is not None:
            dx_into += dx
            dx = dx_into
    dweight = gemm_fp8(transposed(d8), transposed(x8), bf16_out=bf16_dweight)  # (C_out, C_in): sums over N
    return dx, dweight
