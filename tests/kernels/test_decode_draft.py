"""decode_draft: the drafting heads' ranked guesses placed in a draft tree, against Python's sorted on
random logits with ties and NaNs; the GPU kernel against the same."""

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek
from euler_kernels import draft_tree

TREES = [None, (0, 1, 0), (0, 1, 0, 3), (0, 0, 0, 0, 4), (0, 1, 2, 0, 4, 0)]


def random_logits(seed: int, b: int, m: int, v: int) -> np.ndarray:
    """(B, M, V) float32 logits on a coarse grid (many ties), a few NaNs."""
    rng = np.random.default_rng(seed)
    z = rng.integers(-20, 20, (b, m, v)).astype(np.float32) / 4
    z[rng.random(z.shape) < 0.01] = np.nan
    return z


def sorted_drafts(z: np.ndarray, parents: tuple) -> np.ndarray:
    """Draft i: head depth(i + 1)'s ranks[i]-th best token, by larger logit then smaller id, NaN never."""
    heads, ranks = draft_tree.depths(parents)[1:], draft_tree.ranks(parents)
    out = np.zeros((z.shape[0], len(parents)), dtype=np.int64)
    for row in range(z.shape[0]):
        for i, (head, rank) in enumerate(zip(heads, ranks)):
            logits = z[row, head - 1]
            order = sorted((-x, t) for t, x in enumerate(logits.tolist()) if x == x)
            out[row, i] = order[rank][1]
    return out


def depth(parents) -> int:
    return max(draft_tree.depths(parents))


@pytest.mark.parametrize("tree", TREES)
def test_drafts_are_each_heads_ranked_guesses(tree) -> None:
    parents = draft_tree.chain(3) if tree is None else tree
    z = random_logits(len(parents), 5, depth(parents), 64)
    drafts = np.full((5, len(parents)), -1, dtype=np.int64)
    ek.decode_draft(z, drafts, tree)
    np.testing.assert_array_equal(drafts, sorted_drafts(z, parents))


def test_bad_trees_and_shapes_are_named() -> None:
    z = np.zeros((2, 2, 8), np.float32)
    with pytest.raises(ValueError, match="a tree of 3 drafts, 2 heads deep"):
        ek.decode_draft(z, np.zeros((2, 2), np.int64), (0, 1, 0))
    with pytest.raises(ValueError, match="at most 4 drafts under one parent"):
        ek.decode_draft(z[:, :1], np.zeros((2, 5), np.int64), (0, 0, 0, 0, 0))


@pytest.mark.gpu
@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("v", [4096, 50, 32768])
def test_the_kernel_equals_the_ranked_guesses(tree, v) -> None:
    cp = pytest.importorskip("cupy")
    parents = draft_tree.chain(3) if tree is None else tree
    z = random_logits(v + len(parents), 7, depth(parents), v)
    drafts = cp.full((7, len(parents)), -1, dtype=cp.int64)
    ek.decode_draft(cp.asarray(z), drafts, tree)
    np.testing.assert_array_equal(cp.asnumpy(drafts), sorted_drafts(z, parents))


@pytest.mark.gpu
@pytest.mark.parametrize("tree", TREES)
def test_float64_logits_on_the_gpu_take_the_array_operations(tree) -> None:
    """The kernel reads float32; float64 CuPy logits (a float64 model on the GPU) are ranked as NumPy's."""
    cp = pytest.importorskip("cupy")
    parents = draft_tree.chain(3) if tree is None else tree
    z = random_logits(50 + len(parents), 5, depth(parents), 50).astype(np.float64)
    drafts = cp.full((5, len(parents)), -1, dtype=cp.int64)
    ek.decode_draft(cp.asarray(z), drafts, tree)
    np.testing.assert_array_equal(cp.asnumpy(drafts), sorted_drafts(z, parents))
