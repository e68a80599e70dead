"""A speculative decode step for a batch, the MTP heads drafting: plain decoding's tokens in fewer forwards.

Each row brings T = K tokens: its newest token `last` (at position pos) and the M = K - 1 drafts that
heads 1..M guessed after it (state.drafts). One forward over the T tokens gives head 0's token after each;
the drafts head 0 agrees with, from the first on, are accepted:

    fed    last   d1   d2   d3        head 0 after each: g0 g1 g2 g3
    d1 == g0 and d2 == g1, d3 != g2  ->  emit g0 g1 g2 (2 drafts accepted); g2 is the new `last`

so a step emits 1 + accepted tokens, each head 0's greedy choice given every token before it (what plain
greedy decoding emits). Sampling works the same way along a chain: head 0's token at each fed position is
sampled (Picker.pick_fed) with the draw and the seen tokens it would have were the drafts before it
emitted, and a draft is accepted when it equals that sample; so every emitted token is the one plain
sampled steps would emit, draw for draw.

The keys of the accepted tokens are already in their cache slots; the slots past them hold the rejected
drafts' keys until the next step overwrites them (a token sees only the slots up to its own position, so
they are never read). The next drafts come from heads 1..M at the hidden state of
the position whose head 0 gave the new `last`.

The drafts may also form a draft tree (euler_kernels.draft_tree: each fed draft names its parent), so that
a head's second-best guess is tried beside its best: the step then accepts along the path whose drafts head
0 agrees with, and the keys of that path's drafts are moved to their positions' slots (ek.decode_accept).
Head 1's best two guesses cover more of head 0's choices than its best alone, so a tree of the same T
tokens accepts more drafts than a chain. A chain's rows compute bit for bit what plain steps would (the
same slots, the same sums: the GPU's kernels, and NumPy for up to 8 product rows and one sequence's
attention), so its tokens are plain decoding's exactly; a tree's later branches sit at other
slots than their positions while they are verified, so their sums are grouped differently and a near-tie
that float rounding decides may go the other way (exact in float64; such a flip has been seen in bf16).

The shapes are the same at every step (T tokens for every row, done or not), and nothing is read back to
the host, so the step is captured as CUDA graphs like decode_step (decode_graph.py). A tree's branches
are greedy only (their draws would follow depth, not position: not built).
"""

from __future__ import annotations

from typing import Any

import euler_kernels as ek
from euler_kernels import draft_tree
from euler_model.config import ModelConfig
from euler_model.decode_state import DecodeState
from euler_model.decode_step import Picker, decode_hidden


def default_draft_tree(config: ModelConfig) -> tuple[int, ...]:
    """The draft tree generate_batch uses unless told: head 1's best guess alone (T = 2); with conditioned
    heads a chain of two (heads 1 and 2), whose drafts are accepted often enough to pay for a third fed
    token (docs/benchmarks/generate.md measures each tree and chain)."""
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
    """The draft tree a decoding runs with (None: plain steps, also for a model with one head): the given
    tree checked, by default default_draft_tree(config); a sampled or penalised decoding takes chains only
    (ValueError for a tree with branches)."""
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
    """Set drafts (B, T - 1) (a DecodeState's, or some rows of it) to the drafting heads' guesses at the
    hidden rows h (B, C), placed in the draft tree (None: a chain, each head's best); last (B,): the rows'
    newest tokens. Conditioned heads (config.mtp_conditioned) draft a chain one head after the other: head
    k reads h + P_k e(the token before its guess), the row's newest token for head 1, head k - 1's draft
    after it."""
    if not config.mtp_conditioned:
        z = ek.decode_linear_forward(h, weights["drafters"], precision=precision)  # (B, M V)
        ek.decode_draft(z.reshape(h.shape[0], -1, config.vocab_size), drafts, tree)
        return
    before = last  # (B,) the token head k's guess follows
    for k in range(1, drafts.shape[1] + 1):
        e = weights["embed"].take(before, axis=0)  # (B, C)
        # (B, C): h + P_k e
        a = ek.decode_linear_forward(e, weights[f"heads_cond.{k}"], residual=h, precision=precision)
        z = ek.decode_linear_forward(a, weights[f"heads.{k}"], precision=precision)  # (B, V)
        drafts[:, k - 1] = z.argmax(axis=-1)
        before = drafts[:, k - 1]


def speculative_step(
    config: ModelConfig,
    weights: dict[str, Any],
    state: DecodeState,
    tree: tuple[int, ...] | None,
    picker: Picker,
    precision: ek.Precision,
    window: int,
) -> None:
    """Feed every row its last token and drafts, emit head 0's tokens along the accepted drafts, and draft
    again (device work only, in place); tree: the drafts' parents (None: a chain; a tree takes a greedy
    picker); `window` as for decode_step (above every fed position)."""
    xp = ek.get_array_module(state.pos)
    b, t = state.drafts.shape[0], state.drafts.shape[1] + 1
    tokens = state.fed  # (B, T): last, then the drafts (copies: no host arrays, so a graph can record it)
    tokens[:, 0], tokens[:, 1:] = state.last, state.drafts
    h = decode_hidden(config, weights, state, window, tokens, tree, precision)  # (B T, C)
    z = ek.decode_linear_forward(h, weights["heads.0"], precision=precision)  # (B T, V)
    g = picker.pick_fed(z.reshape(b, t, -1), state)  # (B, T) head 0's token after each fed one
    chosen = state.accept(g, tree)  # (B,) the accepted path's last fed token; the path's tokens recorded
    # the hidden state whose head 0 gave the new last token: row b's fed token chosen[b], row b T + chosen[b]
    picked_at = xp.take(h, state.first_fed + chosen, axis=0)  # (B, C)
    draft(config, weights, state.last, state.drafts, picked_at, tree, precision)
