"""Fused CUDA kernels (CuPy RawModule over the `.cu` files in this folder), float32 and bfloat16.

The ops in `euler_kernels.ops` dispatch here when they are given float32 CuPy arrays, or bf16 activations
(uint16 CuPy arrays of bf16 bit patterns, made by the bf16 path: see `Precision.bf16`); every other
case (NumPy arrays, float64 on the GPU) runs the NumPy-style reference code. Importing this package or
any module in it does not import CuPy: kernels are compiled on first use and cached per process.

The route from an op to its kernel is `ops/X.py` -> `cuda/X.py` (its launcher: shapes, grid, kernel
choice) -> `cuda/X.cu` (rmsnorm, rope, swiglu, embedding, cross_entropy; attention's launchers are all in
flash_attention.py, over flash_attention*.cu). Shared plumbing: `_module` (compiling and loading the
`.cu` files, launch sizes), `multi_tensor` (the multi-tensor tables and the kernels over many tensors:
AdamW, sum of squares, clip), `tables` (their cache), `cast` (float32 <-> bf16), `gemm` (cuBLAS). This
module holds only the predicates that pick the fused path from the arrays (a backward picks it from its
cache's type); how products are computed is the caller's euler_kernels.Precision.
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
