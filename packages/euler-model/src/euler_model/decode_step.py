"""One decode step of a batch, written for CUDA-graph capture: every row's last token in, its next out.

    last (B,) at pos (B,) -> embed -> n_layers x [decode attention block, ffn block] -> rmsnorm -> head 0
    -> logits (B, V) -> pick (greedy or sampled, on the device) -> DecodeState.record

Everything that changes from step to step (tokens, positions, counts, the KV cache) lives in the
DecodeState's preallocated device buffers and is updated in place; the step reads no value back to the
host and has the same shapes at every step with the same attention window (the cache slots it may read,
which the host picks from the step count alone: attention_window), so the same code runs eagerly (NumPy,
or CuPy uncaptured) and captured as one CUDA graph per window (decode_graph.py; with the decode attention
kernel, which reads each row's own slots, one window and one graph serve a generation). Each layer runs
its blocks' decode step (blocks.layer_decode, beside their training forward and backward): each product
through ek.decode_linear_forward, which takes the norm in front of it and SwiGLU or the residual addition
after it (one kernel on the GPU); attention through ek.decode_attention_forward, which applies RoPE at each
row's own position, writes the new key and value into the static cache and attends over the row's slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import euler_kernels as ek
from euler_model.blocks import layer_decode
from euler_model.config import ModelConfig
from euler_model.decode_state import DecodeState
from euler_model.model import rope_for
from euler_model.sampling import inverse_cdf, penalize_rows, sampling_probs

WINDOW = 64  # attention reads the cache in multiples of this many slots (one CUDA graph per multiple)


@dataclass(frozen=True)
class Picker:
    """How the next token is chosen from logits (B, V): greedy when temperature == 0, else sampled."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0

    @property
    def greedy(self) -> bool:
        """Whether the pick is the plain argmax of the logits (no sampling, no penalty)."""
        return self.temperature == 0.0 and self.repetition_penalty == 1.0

    def pick(self, z: Any, state: DecodeState) -> Any:
        """Token ids (B,) from logits z (B, V), on z's device; a sampled row's draw is uniforms[b, count[b]]
        (so row b's j-th sampled token uses its j-th draw, whatever the other rows do)."""
        if self.greedy:
            return z.argmax(axis=-1)  # in float64 the order, and so the first maximum, is the same
        return self.choose(z, state.seen, state.uniforms[state.rows, state.count], state.bad)

    def pick_fed(self, z: Any, state: DecodeState) -> Any:
        """Token ids (B, T) from the logits z (B, T, V) after each token a speculative step fed along a
        chain (last, then the drafts): the token at position i is what `pick` would choose there were the
        drafts before it emitted, the row's (count[b] + i)-th draw and its tokens so far plus drafts 1..i
        (the repetition penalty's). So the tokens a step accepts are the ones plain steps would emit."""
        if self.greedy:
            return z.argmax(axis=-1)
        tokens, bad = self.pick_fed_rows(z, state.count, state.seen, state.drafts, state.uniforms, state.rows)
        state.bad |= bad
        return tokens

    def pick_fed_rows(
        self, z: Any, count: Any, seen: Any, drafts: Any, uniforms: Any, rows: Any, local: Any = None
    ) -> tuple[Any, Any]:
        """pick_fed for G rows of a state: z (G, T, V) their logits, count (G,), seen (G, V) and drafts
        (G, T - 1) theirs, uniforms the state's (B, W), rows (G,) their rows in it, local (G,) arange(G)
        (default: rows, when they are every row in order). Returns (tokens (G, T), bad (G,): rows whose
        probabilities were not finite)."""
        xp = ek.get_array_module(z)
        g, t, v = z.shape
        if self.greedy:
            return z.argmax(axis=-1), xp.zeros(g, dtype=bool)
        local = rows if local is None else local
        at = count[:, None] + xp.arange(t)  # (G, T) the draw of each position
        fed_seen = xp.repeat(seen[:, None, :], t, axis=1)  # (G, T, V)
        for i in range(1, t):  # positions i.. have also seen draft i
            fed_seen[local[:, None], i:, drafts[:, i - 1 : i]] = True
        draws = uniforms[rows[:, None], at]  # (G, T)
        bad = xp.zeros(g * t, dtype=bool)
        tokens = self.choose(z.reshape(g * t, v), fed_seen.reshape(g * t, v), draws.reshape(-1), bad)
        return tokens.reshape(g, t), bad.reshape(g, t).any(axis=1)

    def choose(self, z: Any, seen: Any, draws: Any, bad: Any) -> Any:
        """Token ids (N,) from logits z (N, V): penalised for the tokens seen (N, V), then greedy or sampled
        with draws (N,); bad (N,) |= the rows whose probabilities are not finite."""
        xp = ek.get_array_module(z)
        z = penalize_rows(z.astype(xp.float64), seen, self.repetition_penalty)
        if self.temperature == 0.0:
            return z.argmax(axis=-1)
        probs = sampling_probs(z, self.temperature, self.top_k, self.top_p)
        bad |= ~xp.isfinite(probs).all(axis=-1)
        return inverse_cdf(probs, draws)


def _bf16(w: dict) -> bool:
    """Whether the products take bf16 weight copies (inference_weights): then each product rounds its
    operand to bf16 (decode_linear_forward) and attention and the final norm write bf16 activations."""
    return ek.is_bf16(w["heads.0"])


def decode_hidden(
    config: ModelConfig,
    weights: dict[str, Any],
    state: DecodeState,
    window: int,
    tokens: Any = None,
    tree: tuple[int, ...] | None = None,
    precision: ek.Precision = ek.EXACT,
) -> Any:
    """The final-normed hidden states (B T, C) after feeding each row T new tokens at slots pos[b]..
    pos[b] + T - 1: tokens (B, T), or by default its last token (T = 1); a chain, or a draft tree
    (tree: the fed tokens' parents); attention reads the first `window` slots of the cache, which must
    exceed every new slot. precision: how float32 weights are multiplied (bf16 copies are bf16 products)."""
    bf16 = _bf16(weights)  # attention's output, the final norm's: bf16 (see _bf16)
    rope = (*rope_for(config, weights["embed"], state.k.shape[3]), window, bf16)  # (S, D/2) tables, ...
    ids = state.last if tokens is None else tokens.reshape(-1)  # (B T,); ids are the model's own
    x = weights["embed"].take(ids, axis=0)  # (B T, C): the residual stream
    for i in range(config.n_layers):
        x = layer_decode(config, weights, i, x, state, rope, tree, precision)
    bf16_out = bf16 and not config.mtp_conditioned  # conditioned heads add to it: float32 (products round it)
    return ek.rmsnorm_forward(x, weights["norm"], config.norm_eps, bf16_out=bf16_out)[0]


def decode_step(
    config: ModelConfig,
    weights: dict[str, Any],
    state: DecodeState,
    picker: Picker,
    precision: ek.Precision,
    window: int,
) -> None:
    """Feed each row's last token, then pick and record its next one (device work only, in place); the
    host passes a `window` of cache slots above every row's position (see attention_window)."""
    h = decode_hidden(config, weights, state, window, precision=precision)  # (B, C)
    z = ek.decode_linear_forward(h, weights["heads.0"], precision=precision)  # (B, V)
    state.record(picker.pick(z, state))


def attention_window(config: ModelConfig, last_position: int, kernel: bool = False, slots: int = 0) -> int:
    """The cache slots a step attends to when no new token is past last_position: that bound rounded up to
    a multiple of WINDOW (at most the cache's `slots`, default the context), so a few captured graphs serve
    a whole generation while attention reads little more than the filled slots. With the decode attention
    kernel (kernel=True: ek.decode_attention_kernel), which reads each row's own slots, always all: one
    graph.

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


def inference_weights(
    config: ModelConfig,
    params: dict[str, Any],
    drafters: int = 0,
    into: dict[str, Any] | None = None,
    precision: ek.Precision = ek.EXACT,
) -> dict[str, Any]:
    """The decode step's weights, made once per batch: params plus each layer's q/k/v projections as one
    matrix `wqkv` and its gate/up projections as `w_gate_up` (one product each instead of three and two);
    with drafters = M > 0, heads 1..M stacked as `drafters` (M V, C), the speculative step's one product
    (conditioned heads, config.mtp_conditioned, stay apart: each reads its own input).
    Under a bf16 precision on the GPU (euler_kernels.Precision.bf16) the block matrices and heads are bf16
    copies, half the bytes each decode product reads (a few rows: decode_linear's kernel; more: the bf16
    tensor cores), with no cast per token; the residual stream and the cache stay float32.
    into: what an earlier call returned for these params: its joined matrices and copies are rewritten in
    place from params' current values and it is returned. The values are written by copy and cast kernels
    alone (no host arrays), so a CUDA graph can record the rewrite.
    """
    xp = ek.get_array_module(params["embed"])
    joined = {}
    for i in range(config.n_layers):
        p = f"layers.{i}."
        joined[p + "wqkv"] = [params[p + "wq"], params[p + "wk"], params[p + "wv"]]
        joined[p + "w_gate_up"] = [params[p + "w_gate"], params[p + "w_up"]]
    heads = ["heads.0"]
    if drafters and config.mtp_conditioned:  # each head after its own conditioning: no stack
        heads += [f"heads.{k}" for k in range(1, drafters + 1)]
    elif drafters:
        joined["drafters"] = [params[f"heads.{k}"] for k in range(1, drafters + 1)]
        heads.append("drafters")
    copies = precision.bf16 and ek.float32_on_gpu(params["embed"])  # bf16 copies of these:
    names = [f"layers.{i}.{n}" for i in range(config.n_layers) for n in ("wqkv", "wo", "w_gate_up", "w_down")]
    names = [*names, *heads] if copies else []
    blocks = {**{n: [params[n]] for n in names if n not in joined}, **joined}  # made matrix: its source rows
    weights = _weight_buffers(xp, params, blocks, names) if into is None else into
    sources, targets = [], []  # every source matrix and the rows it fills
    for name, parts in blocks.items():
        start = 0
        for part in parts:
            sources.append(part)
            targets.append(weights[name][start : start + part.shape[0]])
            start += part.shape[0]
    bf16 = [i for i, t in enumerate(targets) if t.dtype == np.uint16]
    for source, target in zip(sources, targets):
        if target.dtype != np.uint16:
            target[...] = source  # a copy kernel (no host arrays: a CUDA graph can record it)
    if bf16:  # rounded to bf16 into their rows, one launch
        ek.to_bf16_many([sources[i] for i in bf16], out=[targets[i] for i in bf16])
    return weights


def _weight_buffers(xp: Any, params: dict[str, Any], blocks: dict[str, list], names: list[str]) -> dict:
    """params with an empty buffer for each matrix made of `blocks`, uint16 for the bf16 copies (`names`)."""
    weights = dict(params)
    for name, parts in blocks.items():
        shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
        weights[name] = xp.empty(shape, dtype=np.uint16 if name in names else parts[0].dtype)
    return weights
