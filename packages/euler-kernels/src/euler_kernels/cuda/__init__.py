"""Fused CUDA kernels (CuPy RawModule over the `.cu` files in this folder), float32 and bfloat16.

The ops in `euler_kernels.ops` dispatch here when they are given float32 CuPy arrays, or bf16 activations
(uint16 CuPy arrays of bf16 bit patterns, made by the bf16 path: see `bf16_activations`); every other
case (NumPy arrays, float64 on the GPU) runs the NumPy-style reference code. Importing this module
does not import CuPy: kernels are compiled on first use and cached per process.
"""

import os
from typing import Any

import numpy as np

from euler_kernels.backend import is_bf16
from euler_kernels.cuda.flash_bf16 import flash_attention_backward_bf16, flash_attention_forward_bf16
from euler_kernels.cuda.gemm import as_bf16, from_bf16, gemm, gemm_bf16, matmul_precision, to_bf16
from euler_kernels.cuda.launch import (
    adamw_multi,
    adamw_multi_ctl,
    clip_factor,
    cross_entropy_backward,
    cross_entropy_forward,
    embedding_backward,
    flash_attention_backward,
    flash_attention_forward,
    keep_tables,
    residual_rmsnorm_forward,
    rmsnorm_backward,
    rmsnorm_forward,
    rope_rotate,
    step_control,
    sum_squares_multi,
    swiglu_backward,
    swiglu_forward,
    to_bf16_many,
)


def fused(*arrays: Any) -> bool:
    """Whether the fused kernels take these arrays: all float32 CuPy arrays (EULER_FUSED_KERNELS=0 turns
    them off, so the NumPy-style path can be compared with them on the same GPU)."""
    if isinstance(arrays[0], np.ndarray) or os.environ.get("EULER_FUSED_KERNELS", "1") == "0":
        return False
    return all(not isinstance(a, np.ndarray) and a.dtype == np.float32 for a in arrays)


def bf16_activations(*arrays: Any) -> bool:
    """Whether the bf16 path is on for a model on these arrays: float32 CuPy arrays (see `fused`) and
    EULER_MATMUL_PRECISION=bf16. Then norms, projections, RoPE, SwiGLU and attention store their outputs
    as bf16 (half the memory and traffic); the residual stream, weights, gradients of weights, softmax
    statistics and the loss stay float32."""
    return fused(*arrays) and matmul_precision() == "bf16"


def fused_cache(cache: tuple) -> bool:
    """Whether a forward's cache came from the fused path (tagged "cuda" in its first slot)."""
    return isinstance(cache[0], str) and cache[0] == "cuda"


__all__ = [
    "adamw_multi",
    "adamw_multi_ctl",
    "as_bf16",
    "bf16_activations",
    "clip_factor",
    "cross_entropy_backward",
    "cross_entropy_forward",
    "embedding_backward",
    "flash_attention_backward",
    "flash_attention_backward_bf16",
    "flash_attention_forward",
    "flash_attention_forward_bf16",
    "from_bf16",
    "fused",
    "fused_cache",
    "gemm",
    "gemm_bf16",
    "is_bf16",
    "keep_tables",
    "matmul_precision",
    "residual_rmsnorm_forward",
    "rmsnorm_backward",
    "rmsnorm_forward",
    "rope_rotate",
    "step_control",
    "sum_squares_multi",
    "swiglu_backward",
    "swiglu_forward",
    "to_bf16",
    "to_bf16_many",
]
