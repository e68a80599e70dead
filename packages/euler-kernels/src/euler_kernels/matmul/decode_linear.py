"""A linear layer for the few rows of a decode step, with what surrounds it in a block fused in.

    out = residual + f(rmsnorm(x) * norm @ weight.T),  f = SwiGLU over the two halves, or nothing

each part optional: `norm` the RMSNorm weight in front of the product (eps its epsilon), `swiglu` a weight
(2F, K) of gate rows then up rows giving silu(gate) * up (R, F), `residual` the stream the block's output
is added to. A decode step is a few rows (one per sequence), so its products are matrix-vector products
bound by reading the weights, and the step by the number of launches: on the GPU one kernel does all of it,
where the unfused ops take three: bf16 weights on the tensor cores (decode_linear_mma.cu, up to 32
rows a launch), float32 weights on the CUDA cores (decode_linear.cu, 8 rows a launch), up to 128
rows. A row's bits never depend on the rows beside it, up to those 128 rows, on the GPU and the
CPU alike: a speculative step's rows then give exactly what plain steps' single rows give.
Inference only: there is no backward.

Numerics follow the unfused ops: with bf16 weights the product's operand is rounded to bf16 (what
rmsnorm_forward(bf16_out=True) writes) and so are the gate and up sums before SwiGLU; sums are float32.
The kernel multiplies float32 weights exactly (no TF32), so it serves float32 weights unless the matmul
precision is bf16 (then the unfused bf16 products do). Elsewhere, and for more rows, the unfused ops run:
rmsnorm_forward, linear_forward, swiglu_forward and an addition; on NumPy their arithmetic is called
directly (rmsnorm_parts, the product, swiglu_parts), without each op's dispatch and checks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels import cuda
from euler_kernels.backend import FLOAT_DTYPES, bf16_bits, is_bf16, shape_error
from euler_kernels.cuda import cast
from euler_kernels.matmul import decode_linear_cuda
from euler_kernels.matmul.linear import linear_forward
from euler_kernels.precision import EXACT, Precision
from euler_kernels.rmsnorm.rmsnorm import rmsnorm_forward, rmsnorm_parts
from euler_kernels.swiglu.swiglu import swiglu_forward, swiglu_parts


def decode_linear_forward(
    x: Any,
    weight: Any,
    norm: Any = None,
    eps: float = 1e-5,
    residual: Any = None,
    swiglu: bool = False,
    precision: Precision = EXACT,
) -> Any:
    """out (R, N), or (R, N / 2) with swiglu, from x (R, K) and weight (N, K); see the module docstring.

    x and weight may be bf16 on the GPU (backend.is_bf16); norm is (K,), residual (R, out columns), both
    in the float dtype; the output is in that dtype (float32 on the GPU). precision: how float32 weights
    are multiplied on the GPU, as linear_forward's.

    >>> import numpy as np
    >>> x, w = np.array([[3.0, 4.0]]), np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]])
    >>> decode_linear_forward(x, w, residual=np.ones((1, 4))).tolist()
    [[4.0, 5.0, 8.0, 7.0]]
    >>> np.round(decode_linear_forward(x, w, norm=np.ones(2), eps=0.0, swiglu=True), 4).tolist()
    [[1.1764, 1.4517]]
    """
    _check(x, weight, norm, residual, swiglu)
    if _lean_takes(x, weight, norm):  # NumPy arrays, never the kernel's
        return _lean_forward(x, weight, norm, eps, residual, swiglu)
    x, weight = bf16_bits(x), bf16_bits(weight)  # a CuPy bfloat16 array as its bit patterns
    if _kernel_takes(x, weight, norm, residual, swiglu, precision):
        return decode_linear_cuda.decode_linear(x, weight, norm, eps, residual, swiglu)
    bf16 = is_bf16(weight)
    h = x if norm is None else rmsnorm_forward(x, norm, eps, bf16_out=bf16)[0]  # (R, K)
    y, _ = linear_forward(h, weight, bf16_out=bf16 and swiglu, precision=precision)  # (R, N)
    if swiglu:
        f = weight.shape[0] // 2
        y, _ = swiglu_forward(y[:, :f], y[:, f:])  # (R, F)
        y = cast.from_bf16(y) if is_bf16(y) else y  # bf16 gate/up sums gave a bf16 out: the op's is float32
    return y if residual is None else residual + y


def _lean_takes(x: Any, weight: Any, norm: Any) -> bool:
    """Whether the lean NumPy path runs: x, weight and norm NumPy arrays of one float dtype (anything else
    takes the unfused ops, whose checks say what is wrong)."""
    dtype = x.dtype
    arrays_ok = type(x) is np.ndarray and type(weight) is np.ndarray
    dtypes_ok = (dtype is FLOAT_DTYPES[0] or dtype is FLOAT_DTYPES[1]) and weight.dtype is dtype
    return arrays_ok and dtypes_ok and (norm is None or (type(norm) is np.ndarray and norm.dtype is dtype))


def _lean_forward(x: Any, weight: Any, norm: Any, eps: float, residual: Any, swiglu: bool) -> Any:
    """The unfused ops' arithmetic on checked NumPy arrays, without their per-call dispatch and checks (a
    decode step makes five of these calls a layer, each a few microseconds of work). Up to ROW_LIMIT rows
    are computed one row at a time (_one_row), so a row's bits do not depend on the rows beside it (as on
    the GPU, whose kernel takes up to ROW_LIMIT rows); more rows as matrices."""
    if x.shape[0] == 1:  # generate's case
        y = _one_row(x[0], weight, norm, eps, swiglu)[None]
    elif x.shape[0] <= decode_linear_cuda.ROW_LIMIT:
        y = np.stack([_one_row(row, weight, norm, eps, swiglu) for row in x])  # (R, N) or (R, N/2)
    else:
        h = x if norm is None else rmsnorm_parts(np, x, norm, eps)[0]  # (R, K)
        y = _unfused_tail(h @ weight.T, swiglu)  # (R, N), as linear_forward
    return y if residual is None else residual + y


def _one_row(x: Any, weight: Any, norm: Any, eps: float, swiglu: bool) -> Any:
    """One row x (K,) -> (N,), or (N/2,) with swiglu: the norm's statistics are NumPy scalars (the same
    float32 operations as on a (1, K) array, at about two thirds of their cost here), the product a
    matrix-vector product (BLAS gemv, half a 1-row matmul's time here)."""
    h = x if norm is None else rmsnorm_parts(np, x, norm, eps)[0]  # (K,)
    return _unfused_tail(np.dot(weight, h), swiglu)


def _unfused_tail(y: Any, swiglu: bool) -> Any:
    """The product's columns y (..., N), through SwiGLU over its two halves when swiglu: (..., N / 2)."""
    if not swiglu:
        return y
    f = y.shape[-1] // 2
    return swiglu_parts(np, y[..., :f], y[..., f:])[0]


def _kernel_takes(x: Any, weight: Any, norm: Any, residual: Any, swiglu: bool, precision: Precision) -> bool:
    """Whether a decode kernel (decode_linear_cuda.py) runs: CuPy arrays, x float32 or bf16, the weight
    bf16, or float32 outside the bf16 matmul modes, of a shape and alignment it takes."""
    if isinstance(x, np.ndarray):
        return False
    floats = [a for a in (norm, residual) if a is not None]
    storage_ok = all(is_bf16(a) or a.dtype == np.float32 for a in (x, weight))
    storage_ok = storage_ok and (not floats or cuda.float32_on_gpu(*floats))
    exact = is_bf16(weight) or not (precision.bf16 or precision.matmul == "bf16fast")
    contiguous = residual is None or residual.flags.c_contiguous
    fits = decode_linear_cuda.decode_linear_fits(x, weight, norm, swiglu)
    return storage_ok and exact and contiguous and fits


def _check(x: Any, weight: Any, norm: Any, residual: Any, swiglu: bool) -> None:
    columns = weight.shape[0] // 2 if swiglu and weight.ndim == 2 else weight.shape[0]
    ok = x.ndim == 2 and weight.ndim == 2 and x.shape[1] == weight.shape[1]
    ok = ok and (norm is None or tuple(norm.shape) == (x.shape[1],))
    ok = ok and (residual is None or tuple(residual.shape) == (x.shape[0], columns))
    ok = ok and not (swiglu and weight.shape[0] % 2)
    if not ok:
        arrays = {"x": x, "weight": weight, **({} if norm is None else {"norm": norm})}
        arrays.update({} if residual is None else {"residual": residual})
        raise shape_error(
            "decode_linear_forward",
            "needs x (R, K), weight (N, K) (N even with swiglu), norm (K,), residual (R, N or N/2)",
            **arrays,
        )
