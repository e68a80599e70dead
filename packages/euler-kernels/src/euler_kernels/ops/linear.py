"""Linear layer without bias; weight layout (C_out, C_in) as in PyTorch: out = x @ weight.T."""

from __future__ import annotations

from typing import Any

from euler_kernels import cuda
from euler_kernels.backend import check_float, shape_error


def linear_forward(x: Any, weight: Any) -> tuple[Any, tuple]:
    """out (..., C_out) = x (..., C_in) @ weight.T, weight (C_out, C_in).

    >>> import numpy as np
    >>> out, _ = linear_forward(np.array([[1.0, 2.0]]), np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]]))
    >>> out.tolist()
    [[1.0, 3.0, 4.0]]
    """
    check_float("linear_forward", x=x, weight=weight)
    if weight.ndim != 2 or x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise shape_error(
            "linear_forward", "weight must be (C_out, C_in) with C_in = x.shape[-1]", x=x, weight=weight
        )
    if cuda.fused(x, weight):  # cuBLAS called directly: capturable in a CUDA graph
        x2 = _c(x.reshape(-1, weight.shape[1]))  # (N, C_in)
        out_shape = (*x.shape[:-1], weight.shape[0])
        if cuda.matmul_precision() == "bf16":  # round x and weight once; the backward reuses both
            x16, w16 = cuda.to_bf16(x2), cuda.to_bf16(_c(weight))
            out = cuda.gemm_bf16(x16, w16, trans_b=True).reshape(out_shape)
            return out, ("bf16", x16, w16, x.shape, weight.shape)
        return cuda.gemm(x2, _c(weight), trans_b=True).reshape(out_shape), (x, weight)
    out = x @ weight.T  # (..., C_out)
    return out, (x, weight)


def _c(a: Any) -> Any:
    return a if a.flags.c_contiguous else a.copy()


def linear_backward(dout: Any, cache: tuple) -> tuple[Any, Any]:
    """Gradients (dx (..., C_in), dweight (C_out, C_in))."""
    if isinstance(cache[0], str):  # bf16 on the GPU: dout is rounded once and feeds both products
        _, x16, w16, x_shape, w_shape = cache
        if dout.shape != (*x_shape[:-1], w_shape[0]):
            raise ValueError(
                f"linear_backward: dout{tuple(dout.shape)} must be x.shape[:-1] + ({w_shape[0]},)"
            )
        d16 = cuda.to_bf16(_c(dout.reshape(-1, w_shape[0])))  # (N, C_out)
        return cuda.gemm_bf16(d16, w16).reshape(x_shape), cuda.gemm_bf16(d16, x16, trans_a=True)
    x, weight = cache
    if dout.shape != (*x.shape[:-1], weight.shape[0]):
        raise shape_error(
            "linear_backward", "dout must be x.shape[:-1] + (C_out,)", dout=dout, x=x, weight=weight
        )
    d2 = dout.reshape(-1, weight.shape[0])  # (N, C_out)
    x2 = x.reshape(-1, weight.shape[1])  # (N, C_in)
    if cuda.fused(dout, x, weight):
        d2, x2 = _c(d2), _c(x2)
        dx = cuda.gemm(d2, _c(weight)).reshape(x.shape)  # (..., C_in)
        return dx, cuda.gemm(d2, x2, trans_a=True)  # (C_out, C_in)
    dx = dout @ weight  # (..., C_in)
    dweight = d2.T @ x2  # (C_out, C_in)
    return dx, dweight
