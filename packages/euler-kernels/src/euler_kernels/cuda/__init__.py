"""Shared GPU plumbing of the fused CUDA kernels (CuPy RawModule over the `.cu` files of the op folders),
float32 and bfloat16.

The ops dispatch to their kernels when they are given float32 CuPy arrays, or bf16 activations (uint16
CuPy arrays of bf16 bit patterns, made by the bf16 path: see `Precision.bf16`); every other case (NumPy
arrays, float64 on the GPU) runs the NumPy-style reference code. Importing this package or any module in
it does not import CuPy: kernels are compiled on first use and cached per process.

An op's route to its kernel stays in its folder: `rmsnorm/rmsnorm.py` -> `rmsnorm/rmsnorm_cuda.py` (its
launcher: shapes, grid, kernel choice) -> `rmsnorm/rmsnorm.cu`. Here: `_module` (compiling and loading the
`.cu` files, launch sizes), `tables` (the multi-tensor kernels' tables and their cache), `cast` (float32
<-> bf16), and the shared headers
common.cuh and fp8.cuh. This module holds only the predicates that pick the fused path from the arrays (a
backward picks it from its cache's type); how products are computed is the caller's euler_kernels.Precision.
"""

from typing import Any

import numpy as np


def float32_on_gpu(*arrays: Any) -> bool:
    """Whether these arrays take the float32 GPU kernels: all are float32 CuPy arrays (float64 CuPy arrays
    run the NumPy-style code, the reference the kernels are compared with on the same GPU)."""
    if type(arrays[0]) is np.ndarray or isinstance(arrays[0], np.ndarray):  # no call for an ndarray
        return False
    return all(not isinstance(a, np.ndarray) and a.dtype == np.float32 for a in arrays)


def fused_grads(*grads: Any) -> bool:
    """Whether the multi-tensor kernels take these gradients: C-contiguous CuPy arrays, each float32 or
    bf16 (uint16 bit patterns: the bf16 weight gradients of train.bf16_grads)."""
    if not grads or isinstance(grads[0], np.ndarray):
        return False
    return all(
        not isinstance(g, np.ndarray) and g.dtype in (np.float32, np.uint16) and g.flags.c_contiguous
        for g in grads
    )


__all__ = [
    "float32_on_gpu",
    "fused_grads",
]
