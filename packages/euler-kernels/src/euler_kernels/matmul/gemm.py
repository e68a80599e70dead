"""Float32 matrix products through cuBLAS called directly (ctypes), so they can be captured in a CUDA graph.

CuPy's matmul refuses to run while a stream is being captured (it checks before every cuBLAS call), but
cuBLAS itself supports capture when its handle works in a workspace the caller owns. So the linear op
calls `cublasGemmEx` here: one handle per device, a 32 MiB workspace of ours, the current CuPy stream.

Arrays in and out are float32 in every mode, and products accumulate in float32; the mode (the `matmul`
of the caller's euler_kernels.Precision) picks the tensor-core math: "fp32" exact float32 products;
"tf32" operands rounded to TF32 (10-bit mantissa); "bf16" operands rounded to bfloat16 (7-bit mantissa)
by our cast kernel (cast.cu), then a bf16 x bf16 -> float32 GEMM on the bf16 tensor cores; "bf16fast"
hands float32 operands to cuBLAS with COMPUTE_32F_FAST_16BF and lets it down-convert them itself (to bf16
or TF32, its choice); "fp8" multiplies as "bf16" here, and the linear op sends the products whose weight
is an FP8 copy (the MLP's and the heads', see model.py) to gemm_fp8.py. A bf16 product runs with cuBLASLt
instead of cublasGemmEx where one of cuBLASLt's algorithms was timed faster for its kind (gemm_tuned.py),
unless the caller turns tuning off (a Precision's gemm_tuning).

Row-major arrays are column-major transposes, so C = op(A) @ op(B) (M x N) is computed as
C^T = op(B)^T @ op(A)^T: cuBLAS gets B first, then A, with m = N and n = M.
"""

from __future__ import annotations

import ctypes
from typing import Any

from euler_kernels.cuda.cast import to_bf16
from euler_kernels.matmul import gemm_tuned
from euler_kernels.matmul.blas import (
    CUBLAS_COMPUTE_32F,
    CUBLAS_COMPUTE_32F_FAST_16BF,
    CUBLAS_COMPUTE_32F_FAST_TF32,
    CUBLAS_GEMM_DEFAULT,
    CUBLAS_OP_N,
    CUBLAS_OP_T,
    CUDA_R_16BF,
    CUDA_R_32F,
    WORKSPACE_BYTES,
    load_cuda_library,
)

COMPUTE_TYPES = {
    "fp32": CUBLAS_COMPUTE_32F,
    "tf32": CUBLAS_COMPUTE_32F_FAST_TF32,
    "bf16": CUBLAS_COMPUTE_32F,  # on bf16 operands (rounded by us): the bf16 tensor cores
    "bf16fast": CUBLAS_COMPUTE_32F_FAST_16BF,
    "fp8": CUBLAS_COMPUTE_32F,  # the products that are not FP8 ones: as bf16
}
BF16_MODES = ("bf16", "fp8")  # the modes whose float32 operands are rounded to bf16 by us
# Without this cuBLAS may reduce split-K partial sums in the output type (bf16): the sums must be float32
# and rounded once, so a bf16 output is the float32 result rounded.
CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16

_lib: Any = None
_handles: dict[int, _Handle] = {}


def _cublas() -> Any:
    """The libcublas that CuPy loaded (same process, same library), with argument types declared."""
    global _lib
    if _lib is None:
        lib = load_cuda_library(("libcublas.so.13", "libcublas.so.12", "libcublas.so"), "cublas")
        p, i = ctypes.c_void_p, ctypes.c_int
        lib.cublasCreate_v2.argtypes = [ctypes.POINTER(p)]
        lib.cublasSetStream_v2.argtypes = [p, p]
        lib.cublasSetWorkspace_v2.argtypes = [p, p, ctypes.c_size_t]
        lib.cublasSetMathMode.argtypes = [p, i]
        lib.cublasGemmEx.argtypes = [p, i, i, i, i, i, p, p, i, i, p, i, i, p, p, i, i, i, i]
        ll = ctypes.c_longlong
        lib.cublasGemmStridedBatchedEx.argtypes = [
            p, i, i, i, i, i, p, p, i, i, ll, p, i, i, ll, p, p, i, i, ll, i, i, i
        ]  # fmt: skip
        _lib = lib
    return _lib


class _Handle:
    """A cuBLAS handle with its own workspace, re-pointed at whichever stream is current."""

    def __init__(self) -> None:
        import cupy

        lib = _cublas()
        self.ptr = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(self.ptr)), "cublasCreate")
        mode = CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION
        _check(lib.cublasSetMathMode(self.ptr, mode), "cublasSetMathMode")
        self.workspace = cupy.empty((WORKSPACE_BYTES,), dtype=cupy.uint8)
        self.stream = None

    def on_stream(self, stream_ptr: int) -> ctypes.c_void_p:
        if stream_ptr != self.stream:  # setting the stream resets the workspace: set both
            lib = _cublas()
            _check(lib.cublasSetStream_v2(self.ptr, ctypes.c_void_p(stream_ptr)), "cublasSetStream")
            ws = ctypes.c_void_p(self.workspace.data.ptr)
            _check(lib.cublasSetWorkspace_v2(self.ptr, ws, WORKSPACE_BYTES), "cublasSetWorkspace")
            self.stream = stream_ptr
        return self.ptr


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"euler_kernels.gemm: {what} failed with cuBLAS status {status}")


def gemm(
    a: Any,
    b: Any,
    trans_a: bool = False,
    trans_b: bool = False,
    matmul: str = "fp32",
    out: Any = None,
    tuned: bool = True,
) -> Any:
    """op(a) @ op(b) for C-contiguous float32 CuPy matrices; op transposes when asked. Returns a new array,
    or adds the product into `out` (C-contiguous float32 of the product's shape) and returns it.

    matmul: "fp32", "tf32", "bf16", "bf16fast" or "fp8" (as bf16), a Precision's matmul (float32 in and
    out); tuned: as gemm_bf16's, for the bf16 modes.
    """
    _check_operands(a, b)
    if matmul in BF16_MODES:  # both operands rounded to bf16 (16-bit patterns), bf16 tensor cores
        return gemm_bf16(to_bf16(a), to_bf16(b), trans_a, trans_b, out, tuned=tuned)
    return _gemm_ex(a, b, trans_a, trans_b, CUDA_R_32F, COMPUTE_TYPES[matmul], out)


def gemm_bf16(
    a16: Any,
    b16: Any,
    trans_a: bool = False,
    trans_b: bool = False,
    out: Any = None,
    bf16_out: bool = False,
    tuned: bool = True,
) -> Any:
    """op(a16) @ op(b16) for operands already rounded by `to_bf16` (uint16 bit patterns), so a caller that
    uses one operand in several products rounds it once; `out` as in `gemm`. The product is float32, or
    with bf16_out the float32 sums rounded to bf16 by cuBLAS as it writes them (half the bytes, for a
    product that only feeds bf16 kernels or another bf16 product).

    tuned: a cuBLASLt algorithm timed faster for this kind of product runs it (gemm_tuned.py); False:
    cublasGemmEx always (a Precision's gemm_tuning).

    Stacks (n, r, c) of n matrices each multiply pairwise, n products in one batched call
    (cublasGemmStridedBatchedEx); op transposes each matrix."""
    _check_operands(a16, b16, stacks=True)
    out_type = CUDA_R_16BF if bf16_out else CUDA_R_32F
    return _gemm_ex(a16, b16, trans_a, trans_b, CUDA_R_16BF, CUBLAS_COMPUTE_32F, out, out_type, tuned)


def _check_operands(a: Any, b: Any, stacks: bool = False) -> None:
    """2-D C-contiguous matrices, or with `stacks` also two 3-D stacks of as many matrices."""
    two_d = a.ndim == 2 and b.ndim == 2
    stacked = stacks and a.ndim == 3 and b.ndim == 3 and a.shape[0] == b.shape[0]
    if not (two_d or stacked) or not (a.flags.c_contiguous and b.flags.c_contiguous):
        what = "2-D C-contiguous matrices" + (" or two (n, r, c) stacks of n" if stacks else "")
        raise ValueError(f"gemm: needs {what}, got {a.shape} and {b.shape}")


def _gemm_ex(
    a: Any,
    b: Any,
    trans_a: bool,
    trans_b: bool,
    dtype: int,
    compute: int,
    out: Any = None,
    out_type: int = CUDA_R_32F,
    tuned: bool = False,
) -> Any:
    """cublasGemmEx on the current stream: C = op(a) @ op(b), or C = out + op(a) @ op(b) in place
    (beta = 1) when `out` is given; operands of cuBLAS type `dtype`, C of `out_type` (float32 or bf16).
    (n, ., .) stacks go to cublasGemmStridedBatchedEx: n products, each matrix's op as for one."""
    import cupy

    batch = a.shape[:-2]  # () for matrices, (n,) for stacks
    m, k = (a.shape[-1], a.shape[-2]) if trans_a else a.shape[-2:]
    k_b, n = (b.shape[-1], b.shape[-2]) if trans_b else b.shape[-2:]
    if k != k_b:
        raise ValueError(f"gemm: inner sizes differ: op(a) is ({m}, {k}), op(b) is ({k_b}, {n})")
    accumulate = out is not None
    out_dtype = cupy.float32 if out_type == CUDA_R_32F else cupy.uint16
    shape = (*batch, m, n)
    if accumulate and (out.shape != shape or out.dtype != out_dtype or not out.flags.c_contiguous):
        raise ValueError(
            f"gemm: out must be a C-contiguous {out_dtype.__name__} {shape} array, "
            f"got {out.shape} {out.dtype}"
        )
    if not accumulate:
        out = cupy.empty(shape, dtype=out_dtype)
    if out.size == 0:
        return out
    if k == 0:
        if not accumulate:
            out.fill(0)
        return out
    device = cupy.cuda.Device().id
    if device not in _handles:
        _handles[device] = _Handle()
    handle = _handles[device].on_stream(cupy.cuda.get_current_stream().ptr)
    alpha = ctypes.c_float(1.0)  # host scalars, read when the call is made
    beta = ctypes.c_float(1.0 if accumulate else 0.0)
    op_b, op_a = (CUBLAS_OP_T if t else CUBLAS_OP_N for t in (trans_b, trans_a))
    lib = _cublas()
    if not batch:

        def gemm_ex(target: Any, add: bool) -> None:
            scale = ctypes.c_float(1.0 if add else 0.0)
            status = lib.cublasGemmEx(
                handle, op_b, op_a, n, m, k, ctypes.addressof(alpha),
                b.data.ptr, dtype, b.shape[1], a.data.ptr, dtype, a.shape[1],
                ctypes.addressof(scale), target.data.ptr, out_type, n, compute, CUBLAS_GEMM_DEFAULT,
            )  # fmt: skip
            _check(status, "cublasGemmEx")

        if tuned and gemm_tuned.run_tuned(a, b, (trans_a, trans_b), out, out_type, accumulate, gemm_ex):
            return out  # a cuBLASLt algorithm timed faster for this kind of product ran it
        gemm_ex(out, accumulate)
        return out
    stride = [x.shape[-2] * x.shape[-1] for x in (b, a, out)]  # elements between consecutive matrices
    status = lib.cublasGemmStridedBatchedEx(
        handle, op_b, op_a, n, m, k, ctypes.addressof(alpha),
        b.data.ptr, dtype, b.shape[-1], stride[0], a.data.ptr, dtype, a.shape[-1], stride[1],
        ctypes.addressof(beta), out.data.ptr, out_type, n, stride[2], batch[0], compute, CUBLAS_GEMM_DEFAULT,
    )  # fmt: skip
    _check(status, "cublasGemmStridedBatchedEx")
    return out
