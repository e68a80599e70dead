"""One decode step of a batch, written for CUDA-graph capture: every row's last token in, its next out.

    last (B,) at pos (B,) -> embed -> n_layers x [decode attention block, ffn block] -> rmsnorm -> head 0
    -> logits (B, V) -> pick (greedy or sampled, on the device) -> DecodeState.record

Everything that changes from step to step (tokens, positions, counts, the KV cache) lives in the
DecodeState's preallocated device buffers and is updated in place; the step reads no value back to the
host and has the same shapes at every step with the same attention window (the cache slots it reads,
which the host picks from the step count alone: attention_window), so the same code runs eagerly (NumPy,
or CuPy uncaptured) and captured as one CUDA graph per window (decode_graph.py). The blocks are the
training blocks' (blocks.py: the norms, projections, RoPE and SwiGLU of euler-kernels); only attention
differs: the queries of the batch sit at different positions, RoPE reads each row's position from the
device (the rows of the batch play the part of RoPE's time axis, with tables gathered at their
positions), and attention reads the static cache (decode_attention.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import euler_kernels as ek
from euler_model.blocks import norm_in
from euler_model.config import ModelConfig
from euler_model.decode_attention import decode_attention, key_bias
from euler_model.decode_state import DecodeState
from euler_model.model import _with_bf16_copies, rope_for
from euler_model.sampling import inverse_cdf, penalize_rows, sampling_probs

WINDOW = 64  # attention reads the cache in multiples of this many slots (one CUDA graph per multiple)


@dataclass(frozen=True)
class Picker:
    """How the next token is chosen from logits (B, V): greedy when temperature == 0, else sampled."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0

    def pick(self, z: Any, state: DecodeState) -> Any:
        """Token ids (B,) from logits z (B, V), on z's device; a sampled row's draw is uniforms[b, count[b]]
        (so row b's j-th sampled token uses its j-th draw, whatever the other rows do)."""
        xp = ek.get_array_module(z)
        z = penalize_rows(z.astype(xp.float64), state.seen, self.repetition_penalty)
        if self.temperature == 0.0:
            return z.argmax(axis=-1)
        probs = sampling_probs(z, self.temperature, self.top_k, self.top_p)
        state.bad |= ~xp.isfinite(probs).all(axis=-1)
        return inverse_cdf(probs, state.uniforms[state.rows, state.count])


def _attention_block(
    config: ModelConfig, w: dict, prefix: str, stream: tuple, state: DecodeState, layer: int, rope_rows: tuple
) -> tuple[Any, Any]:
    """blocks.attention_block_forward for one new token per row: (x, branch) (B, C) -> (s, o)."""
    b, hq, hkv, d = state.rows.shape[0], config.n_heads, config.n_kv_heads, config.head_dim
    s, h, _ = norm_in(config, w[prefix + "attn_norm"], stream, False)  # (B, C) each
    qkv, _ = ek.linear_forward(h, w[prefix + "wqkv"])  # (B, (Hq + 2 Hkv) D): q, k, v side by side
    qk, _ = ek.rope_forward(qkv[:, : (hq + hkv) * d].reshape(1, b, hq + hkv, d), *rope_rows[:2])
    state.k[layer, state.rows, :, state.pos] = qk[0, :, hq:]  # slot pos[b] of row b: (B, Hkv, D)
    state.v[layer, state.rows, :, state.pos] = qkv[:, (hq + hkv) * d :].reshape(b, hkv, d)
    window = rope_rows[2].shape[-1]  # the keys attended to: slots 0..window-1 hold every row's
    k, v = state.k[layer, :, :, :window], state.v[layer, :, :, :window]  # (B, Hkv, W, D) views
    a = decode_attention(qk[0, :, :hq], k, v, rope_rows[2])  # (B, Hq, D)
    o, _ = ek.linear_forward(a.reshape(b, hq * d), w[prefix + "wo"])  # (B, C)
    return s, o


def _ffn_block(config: ModelConfig, w: dict, prefix: str, stream: tuple) -> tuple[Any, Any]:
    """blocks.ffn_block_forward with the gate and up projections as one product: (x, branch) -> (s, o)."""
    s, h, _ = norm_in(config, w[prefix + "ffn_norm"], stream, False)  # (B, C) each
    gate_up, _ = ek.linear_forward(h, w[prefix + "w_gate_up"])  # (B, 2F)
    gated, _ = ek.swiglu_forward(gate_up[:, : config.ffn_dim], gate_up[:, config.ffn_dim :])  # (B, F)
    o, _ = ek.linear_forward(gated, w[prefix + "w_down"])  # (B, C)
    return s, o


def decode_hidden(config: ModelConfig, weights: dict[str, Any], state: DecodeState, window: int) -> Any:
    """The final-normed hidden state (B, C) after feeding each row's last token at its position; attention
    reads the first `window` slots of the cache, which must exceed every row's position."""
    xp = ek.get_array_module(state.pos)
    cos, sin = rope_for(config, weights["embed"])  # (context, D/2) each
    # row b's RoPE angles (B, D/2) twice, and the mask (B, 1, 1, W) of the keys it sees: shared by the layers
    at_pos = (xp.take(cos, state.pos, axis=0), xp.take(sin, state.pos, axis=0))
    at_pos += (key_bias(state.keys[:window], state.pos, state.k.dtype),)
    stream = (xp.take(weights["embed"], state.last, axis=0), None)  # (B, C); ids are the model's own
    for i in range(config.n_layers):
        prefix = f"layers.{i}."
        stream = _attention_block(config, weights, prefix, stream, state, i, at_pos)
        stream = _ffn_block(config, weights, prefix, stream)
    _, h, _ = norm_in(config, weights["norm"], stream, False)
    return h


def decode_step(
    config: ModelConfig, weights: dict[str, Any], state: DecodeState, picker: Picker, window: int
) -> None:
    """Feed each row's last token, then pick and record its next one (device work only, in place); the
    host passes a `window` of cache slots above every row's position (see attention_window)."""
    z, _ = ek.linear_forward(decode_hidden(config, weights, state, window), weights["heads.0"])  # (B, V)
    state.record(picker.pick(z, state))


def attention_window(config: ModelConfig, last_position: int) -> int:
    """The cache slots a step attends to when no row is past last_position: that bound rounded up to a
    multiple of WINDOW (at most the context), so a few captured graphs serve a whole generation while
    attention reads little more than the filled slots.

    >>> from euler_model.config import preset
    >>> [attention_window(preset("gpu"), p) for p in (16, 63, 64, 600)]
    [64, 64, 128, 512]
    """
    return min(config.context, (last_position // WINDOW + 1) * WINDOW)


def inference_weights(config: ModelConfig, params: dict[str, Any]) -> dict[str, Any]:
    """The decode step's weights, made once per batch: params plus each layer's q/k/v projections as one
    matrix `wqkv` and its gate/up projections as `w_gate_up` (one product each instead of three and two).
    In the GPU's bf16 mode (euler_kernels.bf16_activations) the block matrices and head 0 are bf16 copies,
    so the products run on the bf16 tensor cores with no cast per token; activations and cache stay float32.
    """
    xp = ek.get_array_module(params["embed"])
    weights = dict(params)
    for i in range(config.n_layers):
        p = f"layers.{i}."
        weights[p + "wqkv"] = xp.concatenate([params[p + "wq"], params[p + "wk"], params[p + "wv"]])
        weights[p + "w_gate_up"] = xp.concatenate([params[p + "w_gate"], params[p + "w_up"]])
    if xp is np or not ek.bf16_activations(params["embed"]):
        return weights
    names = [f"layers.{i}.{n}" for i in range(config.n_layers) for n in ("wqkv", "wo", "w_gate_up", "w_down")]
    return _with_bf16_copies(weights, [*names, "heads.0"])
