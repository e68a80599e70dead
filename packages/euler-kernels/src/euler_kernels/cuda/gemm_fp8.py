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

from euler_kernels.cuda.fp8 import Fp8Tensor
from euler_kernels.cuda.gemm import (
    CUBLAS_COMPUTE_32F,
    CUBLAS_OP_N,
    CUBLAS_OP_T,
    CUDA_R_16BF,
    CUDA_R_32F,
    WORKSPACE_BYTES,
    load_cuda_library,
)

CUDA_R_8F = {"e4m3": 28, "e5m2": 29}
# cublasLtMatmulDescAttributes_t, cublasLtMatmulPreferenceAttributes_t (cublasLt.h)
DESC_TRANSA, DESC_TRANSB = 3, 4
DESC_A_SCALE_POINTER, DESC_B_SCALE_POINTER = 17, 18
PREF_MAX_WORKSPACE_BYTES = 1
PREF_MIN_ALIGNMENT = {"a": 5, "b": 6, "c": 7, "d": 8}
FP8_MULTIPLE = 16  # every dimension of an FP8 product (its operands' rows are multiples of 16 bytes)
HEURISTIC_RESULT_BYTES = 96  # cublasLtMatmulHeuristicResult_t: algo (64 bytes), workspaceSize, state, ...

_lib: Any = None
_handles: dict[int, Any] = {}
_plans: dict[tuple, _Plan] = {}


def _cublaslt() -> Any:
    global _lib
    if _lib is None:
        lib = load_cuda_library(("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"), "cublasLt")
        p, i, u64, i64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64, ctypes.c_size_t
        lib.cublasLtCreate.argtypes = [ctypes.POINTER(p)]
        lib.cublasLtMatmulDescCreate.argtypes = [ctypes.POINTER(p), i, i]
        lib.cublasLtMatmulDescSetAttribute.argtypes = [p, i, p, sz]
        lib.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(p), i, u64, u64, i64]
        lib.cublasLtMatmulPreferenceCreate.argtypes = [ctypes.POINTER(p)]
        lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [p, i, p, sz]
        lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [p, p, p, p, p, p, p, i, p, ctypes.POINTER(i)]
        lib.cublasLtMatmul.argtypes = [p, p, p, p, p, p, p, p, p, p, p, p, p, p, sz, p]
        _lib = lib
    return _lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"euler_kernels.gemm_fp8: {what} failed with cuBLAS status {status}")


def _set(setter: Any, obj: Any, attr: int, value: Any) -> None:
    _check(setter(obj, attr, ctypes.addressof(value), ctypes.sizeof(value)), f"attribute {attr}")


class _Plan:
    """A matmul description, the four matrix layouts and the chosen algorithm of one kind of product."""

    def __init__(
        self, handle: Any, m: int, n: int, k: int, a_fmt: str, b_fmt: str, out_type: int, align: int
    ) -> None:
        lib = _cublaslt()
        self.desc = ctypes.c_void_p()
        status = lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), CUBLAS_COMPUTE_32F, CUDA_R_32F)
        _check(status, "DescCreate")
        set_desc = lib.cublasLtMatmulDescSetAttribute
        _set(set_desc, self.desc, DESC_TRANSA, ctypes.c_int32(CUBLAS_OP_T))
        _set(set_desc, self.desc, DESC_TRANSB, ctypes.c_int32(CUBLAS_OP_N))
        self.layouts = []
        for dtype, rows, cols, ld in (
            (CUDA_R_8F[b_fmt], k, n, k),  # cuBLASLt's A: our b (N, K) row-major = K x N column-major
            (CUDA_R_8F[a_fmt], k, m, k),  # its B: our a (M, K) = K x M column-major
            (out_type, n, m, n),  # C and D: out (M, N) row-major = N x M column-major
        ):
            layout = ctypes.c_void_p()
            status = lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), dtype, rows, cols, ld)
            _check(status, "LayoutCreate")
            self.layouts.append(layout)
        pref = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "PreferenceCreate")
        set_pref = lib.cublasLtMatmulPreferenceSetAttribute
        _set(set_pref, pref, PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(WORKSPACE_BYTES))
        for attr in PREF_MIN_ALIGNMENT.values():
            _set(set_pref, pref, attr, ctypes.c_uint32(align))
        result = (ctypes.c_char * HEURISTIC_RESULT_BYTES)()
        found = ctypes.c_int(0)
        a_layout, b_layout, c_layout = self.layouts
        status = lib.cublasLtMatmulAlgoGetHeuristic(
            handle, self.desc, a_layout, b_layout, c_layout, c_layout, pref, 1, result, ctypes.byref(found)
        )
        if status != 0 or found.value == 0:
            raise RuntimeError(
                f"gemm_fp8: cuBLASLt has no FP8 algorithm for ({m}, {k}) {a_fmt} x ({n}, {k}) {b_fmt} "
                f"(status {status}); FP8 products need an sm_89+ GPU and a CUDA 12+ cuBLASLt"
            )
        self.algo = result  # its first 64 bytes are the cublasLtMatmulAlgo_t


def _alignment(*arrays: Any) -> int:
    """The largest power of two, up to 256, that divides every array's address."""
    align = 256
    for a in arrays:
        while a.data.ptr % align:
            align //= 2
    return align


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
    device = cupy.cuda.Device().id
    lib = _cublaslt()
    if device not in _handles:
        handle = ctypes.c_void_p()
        _check(lib.cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
        _handles[device] = (handle, cupy.empty((WORKSPACE_BYTES,), dtype=cupy.uint8))
    handle, workspace = _handles[device]
    align = _alignment(a.rows, b.rows, out)
    key = (device, m, n, k, a.fmt, b.fmt, out_type, align)
    if key not in _plans:
        _plans[key] = _Plan(handle, m, n, k, a.fmt, b.fmt, out_type, align)
    plan = _plans[key]
    set_desc = lib.cublasLtMatmulDescSetAttribute
    _set(set_desc, plan.desc, DESC_A_SCALE_POINTER, ctypes.c_void_p(b.scale_inv.data.ptr))  # its A is our b
    _set(set_desc, plan.desc, DESC_B_SCALE_POINTER, ctypes.c_void_p(a.scale_inv.data.ptr))
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(1.0 if accumulate else 0.0)  # host scalars
    a_layout, b_layout, c_layout = plan.layouts
    status = lib.cublasLtMatmul(
        handle, plan.desc, ctypes.addressof(alpha), b.rows.data.ptr, a_layout, a.rows.data.ptr, b_layout,
        ctypes.addressof(beta), out.data.ptr, c_layout, out.data.ptr, c_layout, plan.algo,
        workspace.data.ptr, WORKSPACE_BYTES, cupy.cuda.get_current_stream().ptr,
    )  # fmt: skip
    _check(status, "cublasLtMatmul")
    return out


def transposed(t: Fp8Tensor) -> Fp8Tensor:
    """The transpose of an FP8 copy made with cols=True, as an operand: shape (cols, rows), its row-major
    part the transposed copy (no copy is made)."""
    if t.cols is None:
        raise ValueError("transposed: the FP8 copy has no transposed part (made with cols=False)")
    return Fp8Tensor(t.fmt, (t.shape[1], t.shape[0]), t.cols, t.rows, t.scale_inv)
