"""Launcher of grad_accumulate.cu: dst[i] = share * src[i] (+ dst[i]) over a list of tensors, one launch."""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda._module import THREADS, get_kernel
from euler_kernels.cuda.tables import bf16_table, chunk_table


def scale_into_many(dst: list[Any], src: list[Any], share: Any, accumulate: bool) -> None:
    """dst[i] = share * src[i], or dst[i] += share * src[i] with accumulate; contiguous arrays, dst float32,
    src[i] float32 or bf16 (uint16) of dst[i]'s size, share a float32 device scalar. The chunk tables are
    dst's; src contributes its pointers and bf16 flags (tables cached as the other multi-tensor kernels')."""
    dst_pointers, chunk_tensor, chunk_start, sizes = chunk_table(dst)
    if chunk_tensor.size == 0:  # every tensor is empty
        return
    src_pointers = chunk_table(src)[0]
    src_tables = (src_pointers, bf16_table(src))
    args = (dst_pointers, *src_tables, chunk_tensor, chunk_start, sizes, share, np.int32(accumulate))
    get_kernel("grad_accumulate.cu", "scale_into_multi")((chunk_tensor.size,), (THREADS,), args)
