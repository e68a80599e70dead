"""Residual connection: out = x + branch."""

from __future__ import annotations

from typing import Any, NamedTuple

from euler_kernels.backend import check_float, shape_error


class ResidualCache(NamedTuple):
    """residual_forward's cache: the shape its gradient must have."""

    shape: tuple


def residual_forward(x: Any, branch: Any) -> tuple[Any, ResidualCache]:
    """out = x + branch (same shape and dtype).

    >>> import numpy as np
    >>> residual_forward(np.ones(2), np.arange(2.0))[0].tolist()
    [1.0, 2.0]
    """
    check_float("residual_forward", x=x, branch=branch)
    if x.shape != branch.shape:
        raise shape_error("residual_forward", "x and branch must have the same shape", x=x, branch=branch)
    return x + branch, ResidualCache(x.shape)


def residual_backward(dout: Any, cache: ResidualCache) -> tuple[Any, Any]:
    """(dx, dbranch): both are dout itself, not copies (a copy would cost a full pass over the residual
    stream per block); do not modify one in place while the other is still needed."""
    shape = cache.shape
    if dout.shape != shape:
        raise ValueError(f"residual_backward: dout{tuple(dout.shape)} must match x{tuple(shape)}")
    return dout, dout
