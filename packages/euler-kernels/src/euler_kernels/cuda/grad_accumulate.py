"""Launcher of grad_accumulate.cu: dst = share * src (+ dst), one pass over each tensor."""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda._module import GRID_CAP, THREADS, blocks, get_kernel


def scale_into(dst: Any, src: Any, share: Any, accumulate: bool) -> None:
    """dst = share * src, or dst += share * src with accumulate; float32 contiguous arrays of one size,
    share a float32 device scalar."""
    name = "scale_add_into" if accumulate else "scale_into"
    grid = (min(blocks(dst.size, THREADS), GRID_CAP),)
    get_kernel("grad_accumulate.cu", name)(grid, (THREADS,), (dst, src, share, np.int64(dst.size)))
