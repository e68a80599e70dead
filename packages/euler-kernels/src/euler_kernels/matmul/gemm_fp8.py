"""FP8 matrix products on Hopper's FP8 tensor cores through cuBLASLt (ctypes, like gemm.py, so a CUDA graph
can capture them): out (M, N) = (a * scale_inv_a) @ (b * scale_inv_b).T for FP8 copies a (M, K) and b (N, K)
made by fp8.py's `to_fp8`, products summed in float32, out bf16 or float32.

Hopper's FP8 products take both operands with the summed dimension K contiguous ("TN"): row-major a and b
above. A product over the other dimension of a tensor (a weight gradient sums over tokens) takes that
tensor's transposed copy (`to_fp8(..., cols=True)`). e4m3 and e5m2 mix freely except e5m2 with e5m2.
In cuBLASLt's column-major terms out^T (N x M) = op(b^T) (N x K) @ a^T (K x M): cuBLASLt's A is our b,
transposed, and its B our a, as it is.

One matmul description per shape, operand formats and output type, with cuBLASLt's heuristic's first
algorithm chosen when the shape is first seen; the scale pointers are set at each call.
"""

from __future__ import annotations

import ctypes
from typing import Any

from euler_kernels.matmul import cublaslt
from euler_kernels.matmul.blas import CUDA_R_16BF, CUDA_R_32F
from euler_kernels.matmul.cublaslt import DESC_A_SCALE_POINTER, DESC_B_SCALE_POINTER
from euler_kernels.matmul.fp8 import Fp8Tensor

CUDA_R_8F = {"e4m3": 28, "e5m2": 29}
FP8_MULTIPLE = 16  # every dimension of an FP8 product (its operands' rows are multiples of 16 bytes)

_products: dict[tuple, cublaslt.Product] = {}


def _product(m: int, n: int, k: int, a_fmt: str, b_fmt: str, out_type: int, align: int) -> cublaslt.Product:
    """The kind's description and the heuristic's first algorithm, made when the kind is first seen."""
    import cupy

    key = (cupy.cuda.Device().id, m, n, k, a_fmt, b_fmt, out_type, align)
    if key not in _products:
        types = (CUDA_R_8F[a_fmt], CUDA_R_8F[b_fmt], out_type)
        product = cublaslt.Product(m, n, k, (False, True), types, align)
        if product.count == 0:
            raise RuntimeError(
                f"gemm_fp8: cuBLASLt has no FP8 algorithm for ({m}, {k}) {a_fmt} x ({n}, {k}) {b_fmt}; FP8 "
                "products need an sm_89+ GPU and a CUDA 12+ cuBLASLt"
            )
        _products[key] = product
    return _products[key]


def gemm_fp8(a: Fp8Tensor, b: Fp8Tensor, out: Any = None, bf16_out: bool = True) -> Any:
    """(a's values) (M, K) @ (b's values).T (N, K) -> (M, N): a bf16 (uint16 bit patterns) array, or float32
    with bf16_out=False; or, given `out` (C-contiguous float32 or bf16 (M, N)), the product added into it.
    a and b are FP8 copies with their row-major part (`to_fp8(..., rows=True)`); to multiply by a tensor's
    transpose, pass the transposed copy's values as an Fp8Tensor of that shape (see `transposed`)."""
    import cupy

    for name, t in (("a", a), ("b", b)):
        if t.rows is None:
            raise ValueError(f"gemm_fp8: {name} has no row-major copy (made with rows=False)")
    (m, k), (n, k_b) = a.shape, b.shape
    if k != k_b:
        raise ValueError(f"gemm_fp8: a is ({m}, {k}) and b is ({n}, {k_b}): the summed sizes differ")
    if a.fmt == "e5m2" and b.fmt == "e5m2":
        raise ValueError("gemm_fp8: e5m2 x e5m2 has no FP8 product; make one operand e4m3")
    if k % FP8_MULTIPLE or n % FP8_MULTIPLE or m % FP8_MULTIPLE:
        raise ValueError(f"gemm_fp8: M, N and K must be multiples of {FP8_MULTIPLE}, got M {m}, N {n}, K {k}")
    accumulate = out is not None
    out_dtype = (cupy.uint16 if bf16_out else cupy.float32) if out is None else out.dtype
    kinds = (cupy.float32, cupy.uint16)
    if accumulate and (out.shape != (m, n) or out.dtype not in kinds or not out.flags.c_contiguous):
        raise ValueError(
            f"gemm_fp8: out must be a C-contiguous float32 or bf16 ({m}, {n}) array, got {out.shape} "
            f"{out.dtype}"
        )
    if not accumulate:
        out = cupy.empty((m, n), dtype=out_dtype)
    if out.size == 0:
        return out
    out_type = CUDA_R_16BF if out.dtype == cupy.uint16 else CUDA_R_32F
    product = _product(m, n, k, a.fmt, b.fmt, out_type, cublaslt.alignment(a.rows, b.rows, out))
    set_desc = cublaslt.library().cublasLtMatmulDescSetAttribute
    b_scale, a_scale = ctypes.c_void_p(b.scale_inv.data.ptr), ctypes.c_void_p(a.scale_inv.data.ptr)
    cublaslt.set_attribute(set_desc, product.desc, DESC_A_SCALE_POINTER, b_scale)  # its A is our b
    cublaslt.set_attribute(set_desc, product.desc, DESC_B_SCALE_POINTER, a_scale)
    cublaslt.check(product.run(0, a.rows, b.rows, out, accumulate), "FP8 matmul")
    return out


def transposed(t: Fp8Tensor) -> Fp8Tensor:
    """The transpose of an FP8 copy made with cols=True, as an operand: shape (cols, rows), its row-major
    part the transposed copy (no copy is made)."""
    if t.cols is None:
        raise ValueError("transposed: the FP8 copy has no transposed part (made with cols=False)")
    return Fp8Tensor(t.fmt, (t.shape[1], t.shape[0]), t.cols, t.rows, t.scale_inv)
