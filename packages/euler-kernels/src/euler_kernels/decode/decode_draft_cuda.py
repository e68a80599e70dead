"""Launcher of decode_draft.cu: a speculative step's drafts picked from the drafting heads' logits."""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda._module import check_in_place, contiguous, get_kernel

_THREADS = 256


def decode_draft(z: Any, drafts: Any, heads: list[int], ranks: list[int]) -> None:
    """ops.decode_draft on CuPy arrays: z (B, M, V) float32, drafts (B, n) int64 C-contiguous, written in
    place; draft i is head heads[i]'s (1..M) guess of rank ranks[i]."""
    (z,) = contiguous(z)
    check_in_place("decode_draft: the drafts it writes in place", drafts)
    b, m, v = z.shape
    packed = [sum(x << (4 * i) for i, x in enumerate(values)) for values in (heads, ranks)]  # 4 bits each
    args = (drafts, z, np.int32(m), np.int32(v), np.int32(len(heads)), *(np.uint64(p) for p in packed))
    get_kernel("decode_draft.cu", "decode_draft")((m, b), (_THREADS,), args)
