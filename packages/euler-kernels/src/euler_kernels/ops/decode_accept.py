"""A speculative decode step's bookkeeping: the drafts head 0 agrees with accepted, their tokens recorded.

Each row of a speculative step fed its last token and M drafts, and head 0 picked a token after each fed
one: g (B, M + 1). Row b accepts its drafts up to the first one head 0 disagrees with (a of them), so
g[b, 0..a] are head 0's greedy tokens given every token before each; they are recorded in order by
decode_record's rule (a stop token or the row's limit ends the row, and nothing after it is emitted).
The row's M drafts count in `drafted` and the accepted ones it emitted in `accepted` (a row that was done
before the step counts nothing). Returns a (B,): the fed position whose hidden state drafts the next
step. On CuPy one kernel does it (cuda/decode_accept.cu, one thread per row, with decode_record's rule
from decode_record.cuh); elsewhere decode_record runs once per column.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.backend import get_array_module
from euler_kernels.cuda import decode_accept as accept_cuda
from euler_kernels.ops.decode_record import decode_record


def decode_accept(
    g: Any, drafts: Any, buffers: tuple, stop: Any, limit: Any, drafted: Any, accepted: Any
) -> Any:
    """Accept and record (see the module docstring), in place: g (B, M + 1) and drafts (B, M) int64;
    buffers = (out, last, pos, count, stopped_by, done, seen) as decode_record takes them; stop (B, V)
    bool; limit, drafted, accepted (B,) int64. Returns a (B,) int64. Device operations only.

    >>> import numpy as np
    >>> out, last, pos = np.zeros((1, 4), np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64)
    >>> count, stopped, done = np.zeros(1, np.int64), np.full(1, -1), np.zeros(1, bool)
    >>> seen, stop, limit = np.zeros((1, 9), bool), np.zeros((1, 9), bool), np.array([3])
    >>> drafted, accepted = np.zeros(1, np.int64), np.zeros(1, np.int64)
    >>> buffers = (out, last, pos, count, stopped, done, seen)
    >>> a = decode_accept(np.array([[5, 6, 7]]), np.array([[5, 8]]), buffers, stop, limit, drafted, accepted)
    >>> a.tolist(), out[0, :count[0]].tolist(), drafted.tolist(), accepted.tolist()
    ([1], [5, 6], [2], [1])
    """
    if g.ndim != 2 or drafts.shape != (g.shape[0], g.shape[1] - 1):
        shapes = f"{tuple(g.shape)} and {tuple(drafts.shape)}"
        raise ValueError(f"decode_accept: needs g (B, M + 1) and drafts (B, M), got {shapes}")
    xp = get_array_module(g)
    g, drafts = g.astype(np.int64, copy=False), drafts.astype(np.int64, copy=False)
    if xp is not np:
        return accept_cuda.decode_accept(g, drafts, buffers, stop, limit, drafted, accepted)
    b, m = drafts.shape
    done, count = buffers[5], buffers[3]
    agree = xp.concatenate([g[:, :m] == drafts, xp.zeros((b, 1), dtype=bool)], axis=1)
    chosen = xp.argmin(agree, axis=1)  # the first disagreement (a column of False ends every row)
    going, before = ~done, count.copy()
    for i in range(m + 1):  # column i where i <= chosen, each with its stop and limit checks
        held = (chosen < i) & ~done  # rows with nothing more to emit: done for this record
        done |= held
        decode_record(g[:, i], *buffers, stop, limit)
        done &= ~held
    drafted += going * m
    accepted += xp.maximum(count - before - 1, 0)
    return chosen
