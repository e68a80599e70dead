"""The CUDA BLAS libraries' shared pieces (gemm.py's cuBLAS, cublaslt.py's cuBLASLt): loading the library CuPy
loaded, the cuBLAS type, compute and operation numbers, the size of our workspaces."""

from __future__ import annotations

import ctypes
from typing import Any

CUDA_R_32F = 0
CUDA_R_16BF = 14
CUBLAS_COMPUTE_32F = 68
CUBLAS_COMPUTE_32F_FAST_16BF = 75
CUBLAS_COMPUTE_32F_FAST_TF32 = 77
CUBLAS_GEMM_DEFAULT = -1
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
WORKSPACE_BYTES = 32 * 2**20


def load_cuda_library(sonames: tuple[str, ...], wheel_name: str) -> Any:
    """A CUDA library CuPy loads too (libcublas, libcublasLt), by soname, or where CuPy's loader finds the
    pip wheel's copy (cuda.pathfinder's name for it: `wheel_name`)."""
    import cupy

    cupy.cuda.device.get_cublas_handle()  # makes CuPy load libcublas (and its libcublasLt) into the process
    errors = []
    for name in sonames:
        try:
            return ctypes.CDLL(name)
        except OSError as err:
            errors.append(str(err))
    try:  # CUDA from pip wheels: ask where CuPy's loader found it
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return ctypes.CDLL(load_nvidia_dynamic_lib(wheel_name).abs_path)
    except Exception as err:
        errors.append(str(err))
        raise RuntimeError(f"euler_kernels: cannot load {sonames[-1]} ({'; '.join(errors)})") from err
