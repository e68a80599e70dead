"""cuBLASLt through ctypes, for the FP8 products (gemm_fp8.py) and the timed bf16 ones (gemm_tuned.py): the
library CuPy loaded, one handle and a workspace of ours per device, and `Product`, one kind of matrix
product (its description, layouts and the heuristic's candidate algorithms), which a CUDA graph can capture.

The operands are row-major, as in gemm.py: out (M, N) = op(a) @ op(b) is computed column-major as
out^T = op(b)^T @ op(a)^T, so cuBLASLt's A is our b and its B our a.
"""

from __future__ import annotations

import ctypes
from typing import Any

from euler_kernels.matmul.blas import (
    CUBLAS_COMPUTE_32F,
    CUBLAS_OP_N,
    CUBLAS_OP_T,
    CUDA_R_32F,
    WORKSPACE_BYTES,
    load_cuda_library,
)

# cublasLtMatmulDescAttributes_t, cublasLtMatmulPreferenceAttributes_t (cublasLt.h)
DESC_TRANSA, DESC_TRANSB = 3, 4
DESC_A_SCALE_POINTER, DESC_B_SCALE_POINTER = 17, 18
PREF_MAX_WORKSPACE_BYTES = 1
PREF_REDUCTION_SCHEME_MASK = 3
PREF_MIN_ALIGNMENT = {"a": 5, "b": 6, "c": 7, "d": 8}
# split-K partial sums in place or in the compute type (float32), never in a bf16 output type: a bf16 output
# is then the float32 sum rounded once, as gemm.py asks of cublasGemmEx
REDUCTION_IN_FLOAT32 = 0x3
HEURISTIC_RESULT_BYTES = 96  # cublasLtMatmulHeuristicResult_t: algo (64 bytes), workspaceSize, state, ...

_lib: Any = None
_handles: dict[int, tuple[Any, Any]] = {}


def library() -> Any:
    """The libcublasLt that CuPy loaded, with argument types declared."""
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


def check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"euler_kernels: cuBLASLt's {what} failed with cuBLAS status {status}")


def set_attribute(setter: Any, obj: Any, attr: int, value: Any) -> None:
    check(setter(obj, attr, ctypes.addressof(value), ctypes.sizeof(value)), f"attribute {attr}")


def handle_and_workspace() -> tuple[Any, Any]:
    """The current device's cuBLASLt handle and the 32 MiB workspace its products use."""
    import cupy

    device = cupy.cuda.Device().id
    if device not in _handles:
        handle = ctypes.c_void_p()
        check(library().cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
        _handles[device] = (handle, cupy.empty((WORKSPACE_BYTES,), dtype=cupy.uint8))
    return _handles[device]


def alignment(*arrays: Any) -> int:
    """The largest power of two, up to 256, that divides every array's address."""
    align = 256
    for a in arrays:
        while a.data.ptr % align:
            align //= 2
    return align


class Product:
    """One kind of product out (M, N) = op(a) @ op(b), summed in float32: a (M, K) or, with trans_a, (K, M);
    b (K, N) or, with trans_b, (N, K); cuBLAS types a_type, b_type, out_type; every pointer aligned to
    `align` bytes. Holds up to `candidates` of the heuristic's algorithms, best first (`count` of them)."""

    def __init__(
        self,
        m: int,
        n: int,
        k: int,
        trans: tuple[bool, bool],
        types: tuple[int, int, int],
        align: int,
        candidates: int = 1,
        reduction_mask: int | None = None,
    ) -> None:
        lib = library()
        handle, _ = handle_and_workspace()
        (trans_a, trans_b), (a_type, b_type, out_type) = trans, types
        self.desc = ctypes.c_void_p()
        status = lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), CUBLAS_COMPUTE_32F, CUDA_R_32F)
        check(status, "DescCreate")
        set_desc = lib.cublasLtMatmulDescSetAttribute
        for attr, t in ((DESC_TRANSA, trans_b), (DESC_TRANSB, trans_a)):  # its A is our b
            set_attribute(set_desc, self.desc, attr, ctypes.c_int32(CUBLAS_OP_T if t else CUBLAS_OP_N))
        b_rows, b_cols = (n, k) if trans_b else (k, n)  # b as stored, row-major
        a_rows, a_cols = (k, m) if trans_a else (m, k)
        self.layouts = []
        for dtype, rows, cols in ((b_type, b_cols, b_rows), (a_type, a_cols, a_rows), (out_type, n, m)):
            layout = ctypes.c_void_p()  # a row-major (r, c) matrix is a column-major c x r one, lead dim c
            status = lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), dtype, rows, cols, rows)
            check(status, "LayoutCreate")
            self.layouts.append(layout)
        pref = ctypes.c_void_p()
        check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "PreferenceCreate")
        set_pref = lib.cublasLtMatmulPreferenceSetAttribute
        set_attribute(set_pref, pref, PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(WORKSPACE_BYTES))
        for attr in PREF_MIN_ALIGNMENT.values():
            set_attribute(set_pref, pref, attr, ctypes.c_uint32(align))
        if reduction_mask is not None:
            set_attribute(set_pref, pref, PREF_REDUCTION_SCHEME_MASK, ctypes.c_uint32(reduction_mask))
        self.results = (ctypes.c_char * (HEURISTIC_RESULT_BYTES * candidates))()
        found = ctypes.c_int(0)
        a_layout, b_layout, c_layout = self.layouts
        status = lib.cublasLtMatmulAlgoGetHeuristic(
            handle, self.desc, a_layout, b_layout, c_layout, c_layout, pref, candidates, self.results,
            ctypes.byref(found),
        )  # fmt: skip
        self.count = found.value if status == 0 else 0

    def run(self, i: int, a: Any, b: Any, out: Any, accumulate: bool) -> int:
        """Candidate i on the current stream: out = op(a) @ op(b), or out += it with accumulate; the cuBLAS
        status (0: done)."""
        import cupy

        handle, workspace = handle_and_workspace()
        algo = ctypes.c_void_p(ctypes.addressof(self.results) + i * HEURISTIC_RESULT_BYTES)  # 64 bytes in
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(1.0 if accumulate else 0.0)  # host scalars
        a_layout, b_layout, c_layout = self.layouts
        return library().cublasLtMatmul(
            handle, self.desc, ctypes.addressof(alpha), b.data.ptr, a_layout, a.data.ptr, b_layout,
            ctypes.addressof(beta), out.data.ptr, c_layout, out.data.ptr, c_layout, algo,
            workspace.data.ptr, WORKSPACE_BYTES, cupy.cuda.get_current_stream().ptr,
        )  # fmt: skip
