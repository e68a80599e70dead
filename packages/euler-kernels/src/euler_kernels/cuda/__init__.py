"""Fused CUDA kernels (CuPy RawModule over the `.cu` files in this folder), float32 and bfloat16.

The ops in `euler_kernels.ops` dispatch here when they are given float32 CuPy arrays, or bf16 activations
(uint16 CuPy arrays of bf16 bit patterns, made by the bf16 path: see `bf16_activations`); every other
case (NumPy arrays, float64 on the GPU) runs the NumPy-style reference code. Importing this package or
any module in it does not import CuPy: kernels are compiled on first use and cached per process.

The route from an op to its kernel is `ops/X.py` -> `cuda/X.py` (its launcher: shapes, grid, kernel
choice) -> `cuda/X.cu` (rmsnorm, rope, swiglu, embedding, cross_entropy; attention's launchers are all in
flash_attention.py, over flash_attention*.cu). Shared plumbing: `_module` (compiling and loading the
`.cu` files, launch sizes), `multi_tensor` (the multi-tensor tables and the kernels over many tensors:
AdamW, sum of squares, clip), `tables` (their cache), `cast` (float32 <-> bf16), `gemm` (cuBLAS). This
module holds only the predicates that pick the fused path, and the settings that choose kernels.
"""

import os
from typing import Any

import numpy as np

from euler_kernels.cuda.gemm import BF16_MODES, matmul_precision


def float32_on_gpu(*arrays: Any) -> bool:
    """Whether these arrays take the float32 GPU kernels: all are float32 CuPy arrays, and the kernels are
    on (EULER_FUSED_KERNELS=0 turns them off, so the NumPy-style path can be compared with them on the
    same GPU)."""
    if isinstance(arrays[0], np.ndarray) or not kernels_on():
        return False
    return all(not isinstance(a, np.ndarray) and a.dtype == np.float32 for a in arrays)


def fused_grads(*grads: Any) -> bool:
    """Whether the multi-tensor kernels take these gradients: C-contiguous CuPy arrays, each float32 or
    bf16 (uint16 bit patterns: the bf16 weight gradients of train.bf16_grads), kernels on."""
    if not grads or isinstance(grads[0], np.ndarray) or not kernels_on():
        return False
    return all(
        not isinstance(g, np.ndarray) and g.dtype in (np.float32, np.uint16) and g.flags.c_contiguous
        for g in grads
    )


def kernels_on() -> bool:
    """Whether the fused kernels may run at all (EULER_FUSED_KERNELS is not 0)."""
    return os.environ.get("EULER_FUSED_KERNELS", "1") != "0"


KERNEL_SETTINGS = (
    "EULER_FUSED_KERNELS",
    "EULER_MATMUL_PRECISION",
    "CUPY_TF32",
    "EULER_FLASH_KERNEL",
    "EULER_GEMM_TUNE",
)


def kernel_settings() -> tuple:
    """The environment variables that choose kernels and precisions, as they are set now: what a CUDA graph
    recorded from the ops depends on beyond its arrays (a graph kept across calls is keyed on them)."""
    return tuple(os.environ.get(name) for name in KERNEL_SETTINGS)


def bf16_activations(*arrays: Any) -> bool:
    """Whether the bf16 path is on for a model on these arrays: float32 CuPy arrays (see `float32_on_gpu`) and
    EULER_MATMUL_PRECISION=bf16 or fp8. Then norms, projections, RoPE, SwiGLU and attention store their
    outputs as bf16 (half the memory and traffic); the residual stream, weights, gradients of weights (unless
    bf16 ones are asked for: train.bf16_grads), softmax statistics and the loss stay float32."""
    return float32_on_gpu(*arrays) and matmul_precision() in BF16_MODES


def fp8_products(*arrays: Any) -> bool:
    """Whether a model on these arrays multiplies its MLP and heads in FP8 (e4m3 activations and weights,
    e5m2 gradients; see ops/linear_fp8.py): float32 CuPy arrays and EULER_MATMUL_PRECISION=fp8. The rest
    is the bf16 path (`bf16_activations` holds too)."""
    return float32_on_gpu(*arrays) and matmul_precision() == "fp8"


def fused_cache(cache: tuple) -> bool:
    """Whether a forward's cache came from the fused path (tagged "cuda" in its first slot)."""
    return isinstance(cache[0], str) and cache[0] == "cuda"


__all__ = [
    "bf16_activations",
    "float32_on_gpu",
    "fp8_products",
    "fused_cache",
    "fused_grads",
    "kernel_settings",
    "kernels_on",
]
