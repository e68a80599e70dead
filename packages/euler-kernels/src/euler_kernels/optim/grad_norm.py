"""Global gradient norm over many arrays, and clipping to a maximum norm."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from euler_kernels import cuda
from euler_kernels.backend import get_array_module
from euler_kernels.cuda.cast import as_float32
from euler_kernels.optim import multi_tensor


def _as_list(grads: Iterable[Any] | Mapping[str, Any]) -> list[Any]:
    return list(grads.values()) if isinstance(grads, Mapping) else list(grads)


def sum_squares_many(grads: Iterable[Any] | Mapping[str, Any]) -> Any:
    """sum over arrays of sum(g ** 2) as a float64 array of shape (1,) where the arrays live (nothing
    is read back: step_control takes it on the device). Float32 or bf16 CuPy arrays: one multi-tensor
    launch.

    >>> import numpy as np
    >>> sum_squares_many([np.array([3.0]), np.array([4.0])]).tolist()
    [25.0]
    """
    arrays = _as_list(grads)
    if cuda.fused_grads(*arrays):
        return multi_tensor.sum_squares_multi(arrays)  # float64 sums per chunk, in a fixed order
    xp = get_array_module(arrays[0]) if arrays else np
    total = xp.zeros((1,), dtype=xp.float64)
    for g in arrays:
        flat = as_float32(g).reshape(-1)
        total += xp.dot(flat, flat).astype(xp.float64)
    return total


def global_grad_norm(grads: Iterable[Any] | Mapping[str, Any]) -> float:
    """sqrt(sum over arrays of sum(g ** 2)) as a Python float (a dict's values count).

    >>> import numpy as np
    >>> global_grad_norm([np.array([3.0]), np.array([4.0])])
    5.0
    """
    return math.sqrt(float(sum_squares_many(grads)[0]))


def clip_grad_norm(grads: Iterable[Any] | Mapping[str, Any], max_norm: float) -> float:
    """Scale every gradient in place so the global norm is at most `max_norm`; return the norm before.

    >>> import numpy as np
    >>> g = [np.array([3.0, 4.0])]
    >>> clip_grad_norm(g, 1.0), g[0].tolist()
    (5.0, [0.6000000000000001, 0.8])
    """
    if not max_norm > 0:
        raise ValueError(f"clip_grad_norm: max_norm must be positive, got {max_norm}")
    arrays = _as_list(grads)
    norm = global_grad_norm(arrays)
    if norm > max_norm:
        scale = max_norm / norm
        for g in arrays:
            g *= scale
    return norm
