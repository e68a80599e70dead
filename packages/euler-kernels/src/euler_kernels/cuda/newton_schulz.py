"""Launcher of newton_schulz.cu: the bf16 Newton-Schulz iteration on the GPU, five quintic steps, each two
bf16 x bf16 -> float32 cuBLAS products (gemm_bf16) and a fused combine, with nothing read back to the host
(capturable). A tall matrix (rows > cols) iterates on its transpose through the GEMMs' transpose flags.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda._module import THREADS, get_kernel, grid
from euler_kernels.cuda.gemm import gemm_bf16
from euler_kernels.cuda.multi_tensor import sum_squares_multi


def newton_schulz_bf16(x: Any, steps: int, coefficients: tuple[float, float, float], eps: float) -> Any:
    """The quintic iteration on a float32 (r, c) CuPy matrix in bf16; returns the bf16 (r, c) result."""
    import cupy

    a, b, c = coefficients
    tall = x.shape[0] > x.shape[1]
    x16 = cupy.empty(x.shape, dtype=cupy.uint16)
    args = (x16, x, sum_squares_multi([x]), np.float32(eps), np.int64(x.size))
    get_kernel("newton_schulz.cu", "ns_normalize_bf16")(grid(x.size), (THREADS,), args)
    combine = get_kernel("newton_schulz.cu", "ns_combine_bf16")
    for _ in range(steps):
        gram = gemm_bf16(x16, x16, trans_a=tall, trans_b=not tall, bf16_out=True)  # (s, s), s = min(r, c)
        poly = cupy.empty(gram.shape, dtype=cupy.uint16)
        gram2 = gemm_bf16(gram, gram)  # float32
        combine(
            grid(gram.size),
            (THREADS,),
            (poly, gram, gram2, np.float32(b), np.float32(c), np.int64(gram.size)),
        )
        moved = gemm_bf16(x16, poly) if tall else gemm_bf16(poly, x16)  # (r, c) float32
        new = cupy.empty(x.shape, dtype=cupy.uint16)
        combine(grid(x.size), (THREADS,), (new, x16, moved, np.float32(a), np.float32(1.0), np.int64(x.size)))
        x16 = new
    return x16
