"""How much memory one training step and one evaluation batch need, before any is allocated.

The estimate counts what the forward pass caches for its backward (blocks.py: per layer and token
6C + 2Ckv + Hq floats in the attention block, q and out also in the grouped layout; 2C + 3F in the FFN
block; with bf16 activations each norm's output h and the SwiGLU product are re-made in the backward
instead, 2C + F fewer, unless keep_activations; in the fp8 mode the FFN keeps FP8 copies of its h and
SwiGLU product instead, C + F bytes), the heads' logits (one head's (N, V) logits and gradient at a time
in training, the gradient written over bf16 logits; all K heads' stacked at evaluation), the largest
backward temporaries, and the weights, their gradients and AdamW's two moments. With activation
recomputation (recompute.py) the step keeps the float32 stream entering each layer (2C per token and
layer) and one layer's caches at a time instead of every layer's; an evaluation forward keeps no caches
either way. Attention is blockwise on every path, so nothing grows with T * T. tests/model/test_memory.py
and test_recompute.py hold it against the measured peak.

>>> from euler_model import preset
>>> m = step_memory(preset("small"), batch_size=16)
>>> round(m["total"] / 2**20)
175
>>> step_memory(preset("small"), batch_size=16, recompute=True)["activations"] < m["activations"]
True
"""

from __future__ import annotations

import numpy as np

import euler_kernels as ek
from euler_model.config import ModelConfig
from euler_model.params import count_params, product_params

FIXED_BYTES = 32 << 20  # attention score tiles, RoPE tables, mask tiles and allocator slack
MARGIN = 1.25  # the estimate is kept above the measured peak by this factor


def _layer_floats(config: ModelConfig, bf16: bool = False) -> int:
    """Floats per token of one layer's caches (bf16: without the two norms' h and the SwiGLU product,
    which the bf16 backward re-makes)."""
    c, f = config.dim, config.ffn_dim
    attn = 6 * c + 2 * config.kv_dim + config.n_heads  # s, h, q, k, v, out, lse + grouped copies of q, out
    ffn = 2 * c + 3 * f  # s, h, gate, up, their SwiGLU product
    return attn + ffn - (2 * c + f if bf16 else 0)


def _stream_floats(config: ModelConfig) -> int:
    """Float32 per token of the streams (x, branch) entering every layer, kept when layers are re-run."""
    return config.n_layers * 2 * config.dim


def _fp8_layer_bytes(config: ModelConfig) -> int:
    """Bytes per token of one layer's FP8 copies in the fp8 mode (blocks.py: the FFN's h and SwiGLU
    product, a byte a value), or 0 when the MLP's matrices do not fit FP8 products (they stay bf16)."""
    gate = np.broadcast_to(np.float32(0), (config.ffn_dim, config.dim))  # a (F, C) stand-in, no memory
    return config.dim + config.ffn_dim if ek.fp8_fits(gate) else 0


def _train_bytes_per_token(
    config: ModelConfig, activation_bytes: int, recompute: bool, fp8: bool, keep: bool = False
) -> int:
    """Activation bytes per token alive at the training step's peak (keep: the bf16 caches keep the norms'
    outputs and the SwiGLU product; in the fp8 mode only the attention norm's, the FFN's being FP8 copies)."""
    c, f, v = config.dim, config.ffn_dim, config.vocab_size
    # one head's logits and their gradient (bf16: written over the logits) + backward temporaries
    logit_floats = v if activation_bytes == 2 else 3 * v
    temporaries = activation_bytes * (logit_floats + 3 * f + 4 * c)
    fp8_bytes = _fp8_layer_bytes(config) if fp8 else 0
    remade = activation_bytes == 2 and not (keep and not fp8_bytes)
    layer = activation_bytes * _layer_floats(config, bf16=remade)
    layer += fp8_bytes + (activation_bytes * c if keep and fp8_bytes else 0)
    if recompute:  # the streams, then one layer's caches at a time
        return 4 * _stream_floats(config) + layer + temporaries
    return config.n_layers * layer + temporaries


def _eval_bytes_per_token(config: ModelConfig) -> int:
    """Bytes per token of an evaluation forward: the streams, one layer's caches and all heads' logits,
    stacked (a copy); counted as float32."""
    c, v, k = config.dim, config.vocab_size, config.n_mtp_heads
    return 4 * (_stream_floats(config) + _layer_floats(config) + 2 * k * v + 2 * c)


def step_memory(
    config: ModelConfig,
    batch_size: int,
    grad_accum: int = 1,
    activation_bytes: int = 4,
    recompute: bool = False,
    fp8: bool = False,
    keep_activations: bool = False,
    bf16_grads: bool = False,
) -> dict[str, int]:
    """Bytes of one optimizer step on one process: {"weights", "gradients", "optimizer", "activations",
    "evaluation", "total"}; `activation_bytes` is 2 for bf16 activations (weights and the residual stream
    stay float32); `recompute`: the layers are re-run in the backward (loss_and_grads(recompute=True));
    `fp8`: the fp8 mode (with activation_bytes 2), whose FFN keeps FP8 copies where bf16 re-makes;
    `keep_activations`: the bf16 caches keep what the backward would re-make (trunk_forward's);
    `bf16_grads`: the products' weight gradients are bf16 (loss_and_grads_on_device's; a running sum over
    micro-batches stays float32)."""
    n_params = count_params(config)
    tokens = batch_size * config.context
    weights = 4 * n_params
    micro = 4 * n_params - (2 * product_params(config) if bf16_grads else 0)  # one micro-batch's gradients
    gradients = micro + (4 * n_params if grad_accum > 1 else 0)  # + their running sum, float32
    optimizer = 8 * n_params  # AdamW's m and v, float32
    activations = tokens * _train_bytes_per_token(config, activation_bytes, recompute, fp8, keep_activations)
    evaluation = tokens * _eval_bytes_per_token(config)
    peak = weights + optimizer + max(gradients + activations, evaluation)
    return {
        "weights": weights,
        "gradients": gradients,
        "optimizer": optimizer,
        "activations": activations,
        "evaluation": evaluation,
        "total": int(MARGIN * peak) + FIXED_BYTES,
    }
