"""The quintic Newton-Schulz iteration that Muon uses to orthogonalise an update matrix.

    X_0 = G / max(||G||_F, eps);  for k in 1..steps:  A = X X^T;  B = b A + c A A;  X = a X + B X

with (a, b, c) = (3.4445, -4.7750, 2.0315), chosen for a steep slope at zero: five steps take every
singular value of X_0 into roughly [0.7, 1.2] (not exactly to 1: it approximates U V^T of G's SVD, with
the singular values spread, which Muon does not mind). A tall G (rows > cols) iterates on its transpose,
so A is the smaller Gram matrix. A stack (n, r, c) orthogonalises each of its n matrices on its own (on
the GPU in one batched product per step). NumPy: in G's dtype (float32 or float64); float32 CuPy: in bf16 with
float32 accumulation (cuBLAS), as Muon's reference implementations do.
"""

from __future__ import annotations

from typing import Any

from euler_kernels import cuda
from euler_kernels.backend import get_array_module
from euler_kernels.optim import newton_schulz_cuda

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7


def newton_schulz(
    g: Any,
    steps: int = NS_STEPS,
    coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    eps: float = NS_EPS,
) -> Any:
    """The orthogonalised (r, c) matrix or (n, r, c) stack; float32 CuPy input gives a bf16 (uint16) CuPy
    result.

    >>> import numpy as np
    >>> x = newton_schulz(np.diag([4.0, 1.0, 0.25]))
    >>> bool(np.all((np.diag(x) > 0.6) & (np.diag(x) < 1.3)))  # every singular value near 1
    True
    """
    if g.ndim not in (2, 3):
        raise ValueError(f"newton_schulz: needs a 2-D matrix or a 3-D stack, got shape {g.shape}")
    if cuda.float32_on_gpu(g):
        return newton_schulz_cuda.newton_schulz_bf16(
            g if g.flags.c_contiguous else g.copy(), steps, coefficients, eps
        )
    xp = get_array_module(g)
    a, b, c = coefficients
    tall = g.shape[-2] > g.shape[-1]
    x = g.swapaxes(-1, -2) if tall else g
    x = x / xp.maximum(xp.linalg.norm(x, axis=(-2, -1), keepdims=True), eps)
    for _ in range(steps):
        gram = x @ x.swapaxes(-1, -2)
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.swapaxes(-1, -2) if tall else x
