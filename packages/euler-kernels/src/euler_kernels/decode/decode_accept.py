"""A speculative decode step's bookkeeping: the drafts head 0 agrees with accepted, their tokens recorded.

Each row of a speculative step fed its last token and T - 1 drafts, in a chain or a draft tree
(draft_tree.py), and head 0 picked a token after each fed one: g (B, T). Row b walks from its last token
(fed token 0) to the child whose draft equals head 0's token after the current one, as long as there is
one: in a chain, its drafts up to the first one head 0 disagrees with. The g at each fed token of that
path (1 + a of them, a drafts accepted) are head 0's greedy tokens given every token before each; they are
recorded in order by decode_record's rule (a stop token or the row's limit ends the row, and nothing after
it is emitted). The row's T - 1 drafts count in `drafted` and the accepted ones it emitted in `accepted` (a
row that was done before the step counts nothing). In a tree the path's i-th token was fed at slot pos + c
(c its fed index) but sits at position pos + i: its keys and values move there in every layer of the
caches (a chain's are in place). Returns the path's last fed token (B,), whose hidden state drafts the
next step. On CuPy one kernel does it (decode_accept.cu, a block per row, with decode_record's rule
from decode_record.cuh); on NumPy a loop over the rows in Python scalars.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels import draft_tree
from euler_kernels.backend import get_array_module
from euler_kernels.decode import decode_accept_cuda as accept_cuda
from euler_kernels.decode.decode_record import record_row


def decode_accept(
    g: Any,
    drafts: Any,
    buffers: tuple,
    stop: Any,
    limit: Any,
    drafted: Any,
    accepted: Any,
    tree: tuple[int, ...] | None = None,
    caches: tuple[Any, Any] | None = None,
) -> Any:
    """Accept and record (see the module docstring), in place: g (B, T) and drafts (B, T - 1) int64;
    buffers = (out, last, pos, count, stopped_by, done, seen) as decode_record takes them; stop (B, V)
    bool; limit, drafted, accepted (B,) int64; tree the fed tokens' parents (None: a chain), with the
    caches (k, v), each (L, B, Hkv, S, D), whose slots it moves. Returns (B,) int64. Device operations only.

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
        raise ValueError(f"decode_accept: needs g (B, T) and drafts (B, T - 1), got {shapes}")
    if tree is not None:
        draft_tree.check_parents(tree)
        if len(tree) != drafts.shape[1] or caches is None:
            raise ValueError(
                f"decode_accept: a tree of {len(tree)} drafts needs {len(tree)} drafts a row and the caches"
            )
    xp = get_array_module(g)
    g, drafts = g.astype(np.int64, copy=False), drafts.astype(np.int64, copy=False)
    if xp is not np:
        return accept_cuda.decode_accept(g, drafts, buffers, stop, limit, drafted, accepted, tree, caches)
    parents = draft_tree.chain(drafts.shape[1]) if tree is None else tree
    done, count = buffers[5], buffers[3]
    chosen = np.zeros(g.shape[0], dtype=np.int64)
    for row, (gb, db) in enumerate(zip(g.tolist(), drafts.tolist())):
        path = _path(parents, gb, db)
        chosen[row] = path[-1]
        if done[row]:
            continue
        p, before = int(buffers[2][row]), int(count[row])
        for c in path:  # head 0's token after each fed token of the path
            if not done[row]:
                record_row(row, gb[c], buffers, stop, limit)
        drafted[row] += len(db)
        accepted[row] += max(int(count[row]) - before - 1, 0)
        for i, c in enumerate(path):  # the path's i-th token from slot p + c to p + i (in order)
            if c != i:
                for cache in caches:
                    cache[:, row, :, p + i] = cache[:, row, :, p + c]
    return chosen


def _path(parents: tuple[int, ...], g: list[int], drafts: list[int]) -> list[int]:
    """The fed tokens from the root along the accepted drafts: [0, c1, c2, ..]."""
    path = [0]
    for c, parent in enumerate(parents, start=1):  # children come after their parents: one pass
        if parent == path[-1] and drafts[c - 1] == g[path[-1]]:
            path.append(c)
    return path
