"""A speculative step's drafts: the drafting heads' best guesses, placed in the draft tree.

Heads 1..M guess the tokens 1..M places after the token head 0 picks next (the MTP heads, at the same
hidden state). A chain of drafts takes each head's best guess; a draft tree (draft_tree.py) may also take
a head's second or third best, for siblings: draft i (fed token i + 1) is the ranks[i]-th best guess of
head depth(i + 1). Best means the largest logit, a tie going to the smaller token id; NaN logits are never
chosen (a draft only decides speed: head 0 checks every one). On CuPy one kernel does it
(decode_draft.cu, a block per row and head) for float32 logits; otherwise an argmax per head, or a
sort for ranks > 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels import draft_tree
from euler_kernels.backend import get_array_module
from euler_kernels.decode import decode_draft_cuda as draft_cuda


def decode_draft(z: Any, drafts: Any, tree: tuple[int, ...] | None = None) -> None:
    """Write the drafts (B, T - 1) int64 in place from the drafting heads' logits z (B, M, V), M the tree's
    depth; tree: the fed tokens' parents (draft_tree.py), None a chain of M drafts. Device operations only.

    >>> import numpy as np
    >>> z = np.array([[[0.0, 3.0, 1.0], [2.0, 0.0, 5.0]]])  # (B 1, M 2, V 3)
    >>> drafts = np.zeros((1, 3), np.int64)
    >>> decode_draft(z, drafts, tree=(0, 1, 0))  # head 1's best, head 2's best after it, head 1's second
    >>> drafts.tolist()
    [[1, 2, 2]]
    """
    parents = draft_tree.chain(z.shape[1]) if tree is None else tree
    draft_tree.check_parents(parents)
    heads, ranks = draft_tree.depths(parents)[1:], draft_tree.ranks(parents)
    if z.ndim != 3 or drafts.shape != (z.shape[0], len(parents)) or max(heads) != z.shape[1]:
        shapes = f"z {tuple(z.shape)} and drafts {tuple(drafts.shape)}"
        raise ValueError(
            f"decode_draft: a tree of {len(parents)} drafts, {max(heads)} heads deep, got {shapes}"
        )
    xp = get_array_module(z)
    if xp is not np and z.dtype == np.float32:  # the kernel reads float32 logits
        draft_cuda.decode_draft(z, drafts, heads, ranks)
        return
    z = xp.where(z != z, -np.inf, z)  # NaN: never chosen
    stable = {"kind": "stable"} if xp is np else {}  # CuPy's sort is stable
    order = xp.argsort(-z, axis=-1, **stable) if max(ranks) else None  # ties: the smaller id first
    best = z.argmax(axis=-1) if order is None else order[..., 0]  # (B, M)
    for i, (head, rank) in enumerate(zip(heads, ranks)):
        drafts[:, i] = best[:, head - 1] if rank == 0 else order[:, head - 1, rank]
