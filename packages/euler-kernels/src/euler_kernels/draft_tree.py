"""The shape of a speculative step's fed tokens: a tree of drafts under each row's last token.

A speculative step feeds each row T tokens: fed token 0 is the row's last token (the root) and fed token
i >= 1 is a draft whose parent, parents[i - 1] < i, is the fed token it follows. A chain of M drafts is
parents (0, 1, .., M - 1); a tree can try two guesses for the same place, e.g. (0, 1, 0): tokens 1 and
3 both follow the root, token 2 follows token 1. Fed token i sits at position pos + depth(i) (the root at
depth 0) and sees the cache slots before pos and the fed tokens on its path from the root (its
ancestors, itself included); its key and value are written to slot pos + i. Parents in increasing order
keep every first child's path in its own slots: a chain, or the first branch of a tree, needs no moving
once accepted (decode/decode_accept.py moves the other branches' slots). T <= MAX_FED.
"""

from __future__ import annotations

MAX_FED = 8  # tokens a step may feed a row in a tree: the ancestor masks are one byte each
MAX_SIBLINGS = 4  # drafts under one parent: a head's best four guesses at most (decode_draft.cu keeps four)


def chain(drafts: int) -> tuple[int, ...]:
    """The parents of M drafts in a chain (each follows the one before it)."""
    return tuple(range(drafts))


def check_parents(parents: tuple[int, ...]) -> None:
    """ValueError unless parents describes a tree of at most MAX_FED fed tokens, at most MAX_SIBLINGS under
    one parent (see the module docstring)."""
    ok = len(parents) < MAX_FED and all(0 <= p < i for i, p in enumerate(parents, start=1))
    if not ok or max((parents.count(p) for p in parents), default=0) > MAX_SIBLINGS:
        raise ValueError(
            f"a draft tree needs parents[i - 1] in 0..i - 1 for fed tokens 1..T - 1, T <= {MAX_FED}, and at "
            f"most {MAX_SIBLINGS} drafts under one parent; got {parents}"
        )


def depths(parents: tuple[int, ...]) -> list[int]:
    """Each fed token's distance from the root (its position minus pos): T values."""
    out = [0]
    for p in parents:
        out.append(out[p] + 1)
    return out


def ancestors(parents: tuple[int, ...]) -> list[int]:
    """Each fed token's bit mask of the fed tokens it sees: bit j set when fed token j is on its path from
    the root (itself included)."""
    out = [1]
    for i, p in enumerate(parents, start=1):
        out.append(out[p] | 1 << i)
    return out


def ranks(parents: tuple[int, ...]) -> list[int]:
    """Each draft's rank among its head's guesses (0 the best): the number of its siblings before it. Draft
    i (fed token i + 1) is the ranks[i]-th best guess of head depth(i + 1) (heads 1..M draft)."""
    return [parents[:i].count(p) for i, p in enumerate(parents)]
