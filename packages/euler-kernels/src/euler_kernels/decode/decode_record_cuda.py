"""Launcher of decode_record.cu: a decode step's per-row bookkeeping in one launch."""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda._module import THREADS, blocks, check_in_place, contiguous, get_kernel


def decode_record(*arrays: Any) -> None:
    """ops.decode_record's arrays (token, out, last, pos, count, stopped_by, done, seen, stop, limit), all
    contiguous CuPy arrays, updated in place by one thread per row."""
    token, out, last, pos, count, stopped_by, done, seen, stop, limit = arrays
    # read with C strides (a token column of (B, T) is not contiguous)
    token, stop, limit = contiguous(token, stop, limit)
    check_in_place(
        "decode_record: the buffers it updates in place", out, last, pos, count, stopped_by, done, seen
    )
    b, v = stop.shape
    args = (out, last, pos, count, stopped_by, done, seen, token, stop, limit)  # the kernel's order
    get_kernel("decode_record.cu", "decode_record")(
        (blocks(b, THREADS),), (THREADS,), (*args, np.int32(b), np.int32(v), np.int32(out.shape[1]))
    )
