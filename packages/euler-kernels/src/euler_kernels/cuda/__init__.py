"""Fused CUDA kernels (CuPy RawModule over the `.cu` files in this folder), float32.

The ops in `euler_kernels.ops` dispatch here when they are given float32 CuPy arrays; every other
case (NumPy arrays, float64 on the GPU) runs the NumPy-style reference code. Importing this module
does not import CuPy: kernels are compiled on first use and cached per process.
"""

from euler_kernels.cuda.launch import (
    adamw_multi,
    clip_factor,
    cross_entropy_backward,
    cross_entropy_forward,
    embedding_backward,
    flash_attention_backward,
    flash_attention_forward,
    rmsnorm_backward,
    rmsnorm_forward,
    rope_rotate,
    sum_squares_multi,
    swiglu_backward,
    swiglu_forward,
)

__all__ = [
    "adamw_multi",
    "clip_factor",
    "cross_entropy_backward",
    "cross_entropy_forward",
    "embedding_backward",
    "flash_attention_backward",
    "flash_attention_forward",
    "rmsnorm_backward",
    "rmsnorm_forward",
    "rope_rotate",
    "sum_squares_multi",
    "swiglu_backward",
    "swiglu_forward",
]
