"""A decode step's bookkeeping: each row's picked token emitted, or the row ended, in place.

Row b of a batch being decoded is still going unless done[b]. A going row that picked one of its stop
tokens (stop[b, token]) ends there, with the token in stopped_by[b] and nothing emitted; otherwise the
token is emitted: written at out[b, count[b]], marked in seen[b], made the row's last token (fed to the
next step at position pos[b] + 1), and the row ends when count[b] reaches limit[b]. A row that is done
changes nothing, so a fixed-shape step (a CUDA graph) can keep computing it. On CuPy one kernel does it
(decode_record.cu, one thread per row); on NumPy a loop over the rows in Python scalars (a row's
record is a few scalar reads and writes, each far cheaper than a NumPy call on a (B,) array).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.backend import get_array_module
from euler_kernels.decode import decode_record_cuda as record_cuda


def decode_record(
    token: Any,
    out: Any,
    last: Any,
    pos: Any,
    count: Any,
    stopped_by: Any,
    done: Any,
    seen: Any,
    stop: Any,
    limit: Any,
) -> None:
    """Record token (B,) int64 into the rows' buffers (see the module docstring), in place: out (B, N + 1)
    int64 with N >= every limit; last, pos, count, stopped_by, limit (B,) int64; done (B,) bool; seen and
    stop (B, V) bool. Device operations only (no host sync).

    >>> import numpy as np
    >>> out, pos = np.zeros((2, 3), np.int64), np.array([4, 9])
    >>> last, count, stopped = np.zeros(2, np.int64), np.zeros(2, np.int64), np.full(2, -1)
    >>> done, seen, stop = np.zeros(2, bool), np.zeros((2, 5), bool), np.zeros((2, 5), bool)
    >>> stop[1, 3] = True  # row 1 stops at token 3
    >>> decode_record(np.array([3, 3]), out, last, pos, count, stopped, done, seen, stop, np.array([2, 2]))
    >>> out[:, 0].tolist(), pos.tolist(), done.tolist(), stopped.tolist()
    ([3, 0], [5, 9], [False, True], [-1, 3])
    """
    xp = get_array_module(token)
    token = token.astype(np.int64, copy=False)
    if xp is not np:
        record_cuda.decode_record(token, out, last, pos, count, stopped_by, done, seen, stop, limit)
        return
    buffers = (out, last, pos, count, stopped_by, done, seen)
    for row, (t, ended) in enumerate(zip(token.tolist(), done.tolist())):
        if not ended:
            record_row(row, t, buffers, stop, limit)


def record_row(row: int, t: int, buffers: tuple, stop: Any, limit: Any) -> None:
    """decode_record for one going row of the NumPy buffers (out, last, pos, count, stopped_by, done, seen)
    and its token t."""
    out, last, pos, count, stopped_by, done, seen = buffers
    if stop[row, t]:
        stopped_by[row], done[row] = t, True
        return
    n = int(count[row])  # tokens emitted before this one: its slot in out
    out[row, n], seen[row, t], last[row] = t, True, t
    count[row], pos[row] = n + 1, pos[row] + 1
    done[row] = n + 1 >= limit[row]
