"""Launcher of newton_schulz.cu: the bf16 Newton-Schulz iteration on the GPU, five quintic steps, each two
bf16 x bf16 -> float32 cuBLAS products (gemm_bf16) and a fused combine, with nothing read back to the host
(capturable). A tall matrix (rows > cols) iterates on its transpose through the GEMMs' transpose flags.
A stack (n, r, c) of matrices iterates as one: each product is one batched cuBLAS call and each
elementwise step one launch, so Muon pays per shape, not per matrix.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda._module import THREADS, get_kernel, grid
from euler_kernels.matmul.gemm import gemm_bf16

NORM_PARTS = 16  # blocks that sum the squares of one matrix


def normalized_bf16(x: Any, eps: float) -> Any:
    """Each matrix of a float32 (r, c) matrix or (n, r, c) stack over max(its Frobenius norm, eps), in
    bf16."""
    import cupy

    size = x.shape[-2] * x.shape[-1]
    n = x.size // size
    partials = cupy.empty((n, NORM_PARTS), dtype=cupy.float64)
    args = (partials, x, np.int64(size))
    get_kernel("newton_schulz.cu", "ns_sum_squares")((NORM_PARTS, n), (THREADS,), args)
    inv = cupy.empty((n,), dtype=cupy.float32)
    args = (inv, partials, np.int32(NORM_PARTS), np.float32(eps), np.int32(n))
    get_kernel("newton_schulz.cu", "ns_inverse_norms")(((n + 127) // 128,), (128,), args)
    x16 = cupy.empty(x.shape, dtype=cupy.uint16)
    args = (x16, x, inv, np.int64(size), np.int64(x.size))
    get_kernel("newton_schulz.cu", "ns_normalize_bf16")(grid(x.size), (THREADS,), args)
    return x16


def newton_schulz_bf16(x: Any, steps: int, coefficients: tuple[float, float, float], eps: float) -> Any:
    """The quintic iteration on a float32 C-contiguous (r, c) CuPy matrix or (n, r, c) stack in bf16;
    returns the bf16 result of the same shape."""
    import cupy

    a, b, c = coefficients
    tall = x.shape[-2] > x.shape[-1]
    x16 = normalized_bf16(x, eps)
    combine = get_kernel("newton_schulz.cu", "ns_combine_bf16")
    for _ in range(steps):
        # ([n,] s, s) with s = min(r, c)
        gram = gemm_bf16(x16, x16, trans_a=tall, trans_b=not tall, bf16_out=True)
        poly = cupy.empty(gram.shape, dtype=cupy.uint16)
        gram2 = gemm_bf16(gram, gram)  # float32
        combine(
            grid(gram.size),
            (THREADS,),
            (poly, gram, gram2, np.float32(b), np.float32(c), np.int64(gram.size)),
        )
        moved = gemm_bf16(x16, poly) if tall else gemm_bf16(poly, x16)  # ([n,] r, c) float32
        new = cupy.empty(x.shape, dtype=cupy.uint16)
        combine(grid(x.size), (THREADS,), (new, x16, moved, np.float32(a), np.float32(1.0), np.int64(x.size)))
        x16 = new
    return x16
