"""One decode step of a batch, plain or speculative, written for CUDA-graph capture:

    last (B,) [+ drafts (B, M)] at pos (B,) -> embed -> n_layers x blocks.layer_decode -> rmsnorm -> head 0
    -> logits (B, T, V) -> Picker.pick -> DecodeState.record (or .accept, then the next drafts)

The step updates the DecodeState in place, reads nothing back to the host and keeps its shapes from step
to step, so it runs eagerly or as a CUDA graph replayed (decode_graph.py). Each layer runs its blocks'
decode step (blocks.py, beside their forward and backward) on the weights' inference form.

Speculative: the MTP heads 1..M draft M tokens after each row's `last`; the step feeds them all, picks head
0's token after each as a plain step would there (its draw, its seen tokens), and accepts the drafts head
0 agrees with, from the first on, so the tokens are plain decoding's in fewer steps:

    fed    last   d1   d2   d3        head 0 after each: g0 g1 g2 g3
    d1 == g0 and d2 == g1, d3 != g2  ->  emit g0 g1 g2 (2 drafts accepted); g2 is the new `last`

Rejected drafts' keys sit past the row's position until overwritten. A draft tree (euler_kernels.draft_tree)
tries a head's second guess beside its best; it decodes greedily, and its branches, verified at other slots
than their positions, may flip a near-tie that rounding decides (a chain computes bit for bit what plain
steps do).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import euler_kernels as ek
from euler_kernels import draft_tree
from euler_model.blocks import layer_decode
from euler_model.config import ModelConfig
from euler_model.decode_state import DecodeState
from euler_model.model import rope_for

WINDOW = 64  # attention reads the cache in multiples of this many slots (one CUDA graph per multiple)
Tree = tuple[int, ...] | None  # a draft tree: each draft's parent (None: plain steps, or a chain)


def inference_weights(
    config: ModelConfig,
    params: dict,
    drafters: int = 0,
    into: dict | None = None,
    precision: ek.Precision = ek.EXACT,
) -> dict[str, Any]:
    """The decode step's weights: params plus each layer's q/k/v projections joined as `wqkv` and its
    gate/up projections as `w_gate_up` (one product each); with drafters = M > 0, heads 1..M stacked as
    `drafters` (M V, C) (conditioned heads, config.mtp_conditioned, stay apart: each reads its own input).
    Under a bf16 precision on the GPU the block matrices and heads are bf16 copies (half the bytes a decode
    product reads); the residual stream and the cache stay float32. into: what an earlier call returned
    for these params, rewritten in place from their current values by copy and cast kernels alone (so a
    CUDA graph can record the rewrite) and returned."""
    xp = ek.get_array_module(params["embed"])
    joined = {}  # a made matrix -> the params whose rows it stacks
    for i in range(config.n_layers):
        p = f"layers.{i}."
        joined[p + "wqkv"] = [params[p + "wq"], params[p + "wk"], params[p + "wv"]]
        joined[p + "w_gate_up"] = [params[p + "w_gate"], params[p + "w_up"]]
    heads = ["heads.0"]
    if drafters and config.mtp_conditioned:
        heads += [f"heads.{k}" for k in range(1, drafters + 1)]
    elif drafters:
        joined["drafters"] = [params[f"heads.{k}"] for k in range(1, drafters + 1)]
        heads.append("drafters")
    bf16 = [f"layers.{i}.{n}" for i in range(config.n_layers) for n in ("wqkv", "wo", "w_gate_up", "w_down")]
    bf16 = [*bf16, *heads] if precision.bf16 and ek.float32_on_gpu(params["embed"]) else []
    blocks = {**{n: [params[n]] for n in bf16 if n not in joined}, **joined}
    weights = into
    if weights is None:
        weights = dict(params)
        for name, parts in blocks.items():
            shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
            weights[name] = xp.empty(shape, dtype=np.uint16 if name in bf16 else parts[0].dtype)
    pairs = []  # (a source matrix, the rows of a weight it fills)
    for name, parts in blocks.items():
        starts = np.cumsum([0] + [part.shape[0] for part in parts])
        pairs += [(part, weights[name][a:z]) for part, a, z in zip(parts, starts, starts[1:])]
    for source, target in pairs:
        if target.dtype != np.uint16:
            target[...] = source  # a copy kernel (no host arrays: a CUDA graph can record it)
    rounded = [(s, t) for s, t in pairs if t.dtype == np.uint16]
    if rounded:  # rounded to bf16 into their rows, one launch
        ek.to_bf16_many([s for s, _ in rounded], out=[t for _, t in rounded])
    return weights


def attention_window(config: ModelConfig, last_position: int, kernel: bool = False, slots: int = 0) -> int:
    """The cache slots a step attends to when no fed token is past last_position: that bound rounded up to
    a multiple of WINDOW (at most the cache's `slots`, default the context), so a few captured graphs serve
    a generation while attention reads little more than the filled slots; all of them with the decode
    attention kernel (kernel=True: ek.decode_attention_kernel), which reads each row's own slots.

    >>> from euler_model.config import preset
    >>> [attention_window(preset("gpu"), p) for p in (16, 63, 64, 600)]
    [64, 64, 128, 512]
    >>> attention_window(preset("gpu"), 16, kernel=True)
    512
    """
    slots = slots or config.context
    if kernel:
        return slots
    return min(slots, (last_position // WINDOW + 1) * WINDOW)


def decode_logits(
    config: ModelConfig, weights: dict, state: DecodeState, window: int, tree: Tree, precision: ek.Precision
) -> tuple[Any, Any]:
    """Feed every row its last token and its M drafts after it (T = M + 1 tokens at slots pos[b]..pos[b] +
    M), attention reading the first `window` slots: the final-normed hidden states (B T, C) and head 0's
    logits (B, T, V) after each fed token."""
    b, t = state.fed.shape
    ids = state.last  # (B T,)
    if t > 1:  # last, then the drafts (copies: no host arrays, so a graph can record them)
        state.fed[:, 0], state.fed[:, 1:] = state.last, state.drafts
        ids = state.fed.reshape(-1)
    bf16 = ek.is_bf16(weights["heads.0"])  # bf16 weight copies: attention and the final norm write bf16
    rope = (*rope_for(config, weights["embed"], state.k.shape[3]), window, bf16)  # (S, D/2) tables, ...
    x = weights["embed"].take(ids, axis=0)  # (B T, C): the residual stream
    for i in range(config.n_layers):
        x = layer_decode(config, weights, i, x, state, rope, tree, precision)
    bf16_out = bf16 and not config.mtp_conditioned  # conditioned heads add to it: float32
    h = ek.rmsnorm_forward(x, weights["norm"], config.norm_eps, bf16_out=bf16_out)[0]  # (B T, C)
    z = ek.decode_linear_forward(h, weights["heads.0"], precision=precision)  # (B T, V)
    return h, z.reshape(b, t, -1)


def decode_step(
    config: ModelConfig,
    weights: dict,
    state: DecodeState,
    picker: Any,
    tree: Tree,
    precision: ek.Precision,
    window: int,
) -> None:
    """One step for every row, device work only: head 0's token picked (sampling.Picker) after each fed
    token and recorded; when speculating, the drafts head 0 agrees with accepted and the next ones made."""
    h, z = decode_logits(config, weights, state, window, tree, precision)
    g = picker.pick(z, state)  # (B, T) head 0's token after each fed one
    if g.shape[1] == 1:
        state.record(g[:, 0])
        return
    chosen = state.accept(g, tree)  # (B,) the accepted path's last fed token; the path's tokens recorded
    draft_next(config, weights, state, chosen, h, tree, precision)


def draft_next(
    config: ModelConfig,
    weights: dict,
    state: DecodeState,
    chosen: Any,
    h: Any,
    tree: Tree,
    precision: ek.Precision,
) -> None:
    """A speculative step's next drafts, from the hidden state whose head 0 gave each row's new last token:
    row b's fed token chosen[b] (B,), row b T + chosen[b] of the step's h (B T, C)."""
    picked_at = ek.get_array_module(h).take(h, state.first_fed + chosen, axis=0)  # (B, C)
    draft(config, weights, state.last, state.drafts, picked_at, tree, precision)


def draft(
    config: ModelConfig, weights: dict, last: Any, drafts: Any, h: Any, tree: Tree, precision: ek.Precision
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


def default_draft_tree(config: ModelConfig) -> tuple[int, ...]:
    """The draft tree used unless told: head 1's best guess alone; with conditioned heads a chain of two,
    accepted often enough to pay for a third fed token (docs/benchmarks/generate.md)."""
    return draft_tree.chain(min(2, config.n_mtp_heads - 1) if config.mtp_conditioned else 1)


def checked_draft_tree(config: ModelConfig, tree: Tree) -> tuple[int, ...]:
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
    config: ModelConfig, tree: Tree, speculative: bool, temperature: float, penalty: float
) -> Tree:
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


def drafting_heads(tree: Tree) -> int:
    """How many heads (1..M) a draft tree's drafts come from: its depth (0 for None: plain steps)."""
    return 0 if tree is None else max(draft_tree.depths(tree))
