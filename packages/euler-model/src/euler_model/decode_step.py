"""One decode step of a batch, written for CUDA-graph capture: every row's fed tokens in, its next out.

    last (B,) [+ drafts (B, M)] at pos (B,) -> embed -> n_layers x blocks.layer_decode -> rmsnorm -> head 0
    -> logits (B, T, V) -> DecodeState.pick -> DecodeState.record (or .accept, then the next drafts)

Everything that changes from step to step lives in the DecodeState's buffers and is updated in place; the
step reads nothing back to the host and has the same shapes at every step with the same attention window
(the cache slots it reads, picked by the host from the step count alone), so the same code runs eagerly
and captured as one CUDA graph per window (decode_graph.py). The layers run their blocks' decode step
(blocks.py, beside their training forward and backward) on the inference form of the weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import euler_kernels as ek
from euler_model.blocks import layer_decode
from euler_model.config import ModelConfig
from euler_model.decode_speculative import draft
from euler_model.decode_state import DecodeState
from euler_model.model import rope_for

WINDOW = 64  # attention reads the cache in multiples of this many slots (one CUDA graph per multiple)


def inference_weights(
    config: ModelConfig,
    params: dict[str, Any],
    drafters: int = 0,
    into: dict[str, Any] | None = None,
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


def decode_hidden(
    config: ModelConfig,
    weights: dict[str, Any],
    state: DecodeState,
    window: int,
    tokens: Any = None,
    tree: tuple[int, ...] | None = None,
    precision: ek.Precision = ek.EXACT,
) -> Any:
    """The final-normed hidden states (B T, C) after feeding each row T tokens at slots pos[b]..pos[b] +
    T - 1: tokens (B, T), by default its last token (T = 1); tree: the fed tokens' parents (None: a chain).
    Attention reads the first `window` slots of the cache. precision: how float32 weights are multiplied."""
    bf16 = ek.is_bf16(weights["heads.0"])  # bf16 copies: attention and the final norm write bf16
    rope = (*rope_for(config, weights["embed"], state.k.shape[3]), window, bf16)  # (S, D/2) tables, ...
    ids = state.last if tokens is None else tokens.reshape(-1)  # (B T,)
    x = weights["embed"].take(ids, axis=0)  # (B T, C): the residual stream
    for i in range(config.n_layers):
        x = layer_decode(config, weights, i, x, state, rope, tree, precision)
    bf16_out = bf16 and not config.mtp_conditioned  # conditioned heads add to it: float32
    return ek.rmsnorm_forward(x, weights["norm"], config.norm_eps, bf16_out=bf16_out)[0]


def decode_logits(
    config: ModelConfig,
    weights: dict[str, Any],
    state: DecodeState,
    window: int,
    tree: tuple[int, ...] | None,
    precision: ek.Precision,
) -> tuple[Any, Any]:
    """Feed every row its last token and its M drafts after it (T = M + 1): the hidden states (B T, C) and
    head 0's logits (B, T, V) after each fed token."""
    b, t = state.fed.shape
    tokens = None
    if t > 1:  # (B, T): last, then the drafts (copies: no host arrays, so a graph can record them)
        tokens = state.fed
        tokens[:, 0], tokens[:, 1:] = state.last, state.drafts
    h = decode_hidden(config, weights, state, window, tokens, tree, precision)  # (B T, C)
    z = ek.decode_linear_forward(h, weights["heads.0"], precision=precision)  # (B T, V)
    return h, z.reshape(b, t, -1)


def decode_step(
    config: ModelConfig,
    weights: dict[str, Any],
    state: DecodeState,
    picker: Any,
    tree: tuple[int, ...] | None,
    precision: ek.Precision,
    window: int,
) -> None:
    """One step for every row (device work only, in place): plain, its next token recorded; speculative
    (M > 0 drafts), head 0's tokens emitted along the drafts it agrees with (decode_speculative.py) and
    the next drafts made. picker: a sampling.Picker; tree and window as in decode_hidden."""
    h, z = decode_logits(config, weights, state, window, tree, precision)
    g = state.pick(picker, z)  # (B, T) head 0's token after each fed one
    if g.shape[1] == 1:
        state.record(g[:, 0])
        return
    chosen = state.accept(g, tree)  # (B,) the accepted path's last fed token; the path's tokens recorded
    # the hidden state whose head 0 gave the new last token: row b's fed token chosen[b], row b T + chosen[b]
    picked_at = ek.get_array_module(h).take(h, state.first_fed + chosen, axis=0)  # (B, C)
    draft(config, weights, state.last, state.drafts, picked_at, tree, precision)
