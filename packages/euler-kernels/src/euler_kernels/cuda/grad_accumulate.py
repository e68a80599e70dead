"""Launcher of grad_accumulate.cu: dst[i] = share * src[i] (+ dst[i]) over a list of tensors, one launch."""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda._module import THREADS, get_kernel
from euler_kernels.cuda.multi_tensor import chunk_table


def scale_into_many(dst: list[Any], src: list[Any], share: Any, accumulate: bool) -> None:
    """dst[i] = share * src[i], or dst[i] += share * src[i] with accumulate; float32 contiguous arrays,
    src[i] the size of dst[i], share a float32 device scalar. The chunk tables are dst's; src contributes
    its pointers (both lists' tables are cached by address, as the other multi-tensor kernels' are)."""
    dst_pointers, chunk_tensor, chunk_start, sizes = chunk_table(dst)
    if chunk_tensor.size == 0:  # every tensor is empty
        return
    src_pointers = chunk_table(src)[0]
    args = (dst_pointers, src_pointers, chunk_tensor, chunk_start, sizes, share, np.int32(accumulate))
    get_kernel("grad_accumulate.cu", "scale_into_multi")((chunk_tensor.size,), (THREADS,), args)
