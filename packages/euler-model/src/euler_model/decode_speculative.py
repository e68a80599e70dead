"""Speculative decoding with the MTP heads: plain decoding's tokens in fewer forwards.

A speculative step (decode_step.decode_step with M drafts) feeds each row its newest token `last` and the
M drafts that heads 1..M guessed after it; one forward gives head 0's token after each, and the drafts
head 0 agrees with, from the first on, are accepted:

    fed    last   d1   d2   d3        head 0 after each: g0 g1 g2 g3
    d1 == g0 and d2 == g1, d3 != g2  ->  emit g0 g1 g2 (2 drafts accepted); g2 is the new `last`

Each emitted token is head 0's choice given every token before it, sampled with the draw and the seen
tokens it would have in a plain step (sampling.Picker.pick), so the tokens are plain decoding's, greedy or
sampled. The rejected drafts' keys stay in slots past the row's position, never read before the next step
overwrites them. The drafts may also form a draft tree (euler_kernels.draft_tree: each draft names its
parent), so that a head's second guess is tried beside its best; a tree's branches sit at other slots than
their positions while verified, so their sums are grouped differently and a near-tie that float rounding
decides may flip (a chain computes bit for bit what plain steps do). Trees decode greedily only.
"""

from __future__ import annotations

from typing import Any

import euler_kernels as ek
from euler_kernels import draft_tree
from euler_model.config import ModelConfig


def default_draft_tree(config: ModelConfig) -> tuple[int, ...]:
    """The draft tree used unless told: head 1's best guess alone; with conditioned heads a chain of two,
    accepted often enough to pay for a third fed token (docs/benchmarks/generate.md)."""
    return draft_tree.chain(min(2, config.n_mtp_heads - 1) if config.mtp_conditioned else 1)


def checked_draft_tree(config: ModelConfig, tree: tuple[int, ...] | None) -> tuple[int, ...]:
    """The draft tree to use (None: the default), checked against the model's heads; ValueError if bad."""
    tree = default_draft_tree(config) if tree is None else tuple(int(p) for p in tree)
    draft_tree.check_parents(tree)
    if not tree or drafting_heads(tree) > config.n_mtp_heads - 1:
        raise ValueError(
            f"a draft tree needs 1 to {config.n_mtp_heads - 1} levels (the model's drafting heads), "
            f"got {tree}"
        )
    if config.mtp_conditioned and tree != draft_tree.chain(len(tree)):
        raise ValueError(f"conditioned heads (mtp_conditioned) draft chains only, got the tree {tree}")
    return tree


def speculation(
    config: ModelConfig, tree: tuple[int, ...] | None, speculative: bool, temperature: float, penalty: float
) -> tuple[int, ...] | None:
    """The checked draft tree a decoding runs with, or None for plain steps (also for a model with one
    head); a sampled or penalised decoding takes chains only."""
    if not speculative or config.n_mtp_heads < 2:
        return None
    tree = checked_draft_tree(config, tree)
    if (temperature != 0.0 or penalty != 1.0) and tree != draft_tree.chain(len(tree)):
        raise ValueError(
            f"a draft tree with branches ({tree}) decodes greedily only (temperature 0, repetition_penalty "
            "1); sampling drafts chains"
        )
    return tree


def drafting_heads(tree: tuple[int, ...] | None) -> int:
    """How many heads (1..M) a draft tree's drafts come from: its depth (0 for None: plain steps)."""
    return 0 if tree is None else max(draft_tree.depths(tree))


def draft(
    config: ModelConfig,
    weights: dict[str, Any],
    last: Any,
    drafts: Any,
    h: Any,
    tree: tuple[int, ...] | None,
    precision: ek.Precision,
) -> None:
    """Set drafts (B, M) to the drafting heads' guesses at the hidden rows h (B, C), placed in the draft
    tree (None: a chain, each head's best); last (B,): the rows' newest tokens. Conditioned heads draft
    one after the other: head k reads h + P_k e(the token before its guess)."""
    if not config.mtp_conditioned:
        z = ek.decode_linear_forward(h, weights["drafters"], precision=precision)  # (B, M V)
        ek.decode_draft(z.reshape(h.shape[0], -1, config.vocab_size), drafts, tree)
        return
    before = last  # (B,) the token head k's guess follows
    for k in range(1, drafts.shape[1] + 1):
        e = weights["embed"].take(before, axis=0)  # (B, C)
        a = ek.decode_linear_forward(
            e, weights[f"heads_cond.{k}"], residual=h, precision=precision
        )  # h + P_k e
        z = ek.decode_linear_forward(a, weights[f"heads.{k}"], precision=precision)  # (B, V)
        drafts[:, k - 1] = z.argmax(axis=-1)
        before = drafts[:, k - 1]
