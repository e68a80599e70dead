"""How much memory one training step and one evaluation batch need, before any is allocated.

The estimate counts what the forward pass caches for its backward (blocks.py: per layer and token
6C + 2Ckv + Hq floats in the attention block, q and out also in the grouped layout; 2C + 3F in the FFN
block), the heads' logits (one head's (N, V) logits and gradient at a time in training, all K heads'
stacked at evaluation), the largest backward temporaries, and the weights, their gradients and AdamW's
two moments. Attention is blockwise on
every path, so nothing grows with T * T. tests/model/test_memory.py holds it against the measured peak.

>>> from euler_model import preset
>>> m = step_memory(preset("small"), batch_size=16)
>>> round(m["total"] / 2**20)
121
"""

from __future__ import annotations

from euler_model.config import ModelConfig
from euler_model.params import count_params

FIXED_BYTES = 32 << 20  # attention score tiles, RoPE tables, mask tiles and allocator slack
MARGIN = 1.25  # the estimate is kept above the measured peak by this factor


def _floats_per_token(config: ModelConfig, eval_only: bool) -> int:
    """Activation floats per token alive at the step's peak."""
    c, f, v, k = config.dim, config.ffn_dim, config.vocab_size, config.n_mtp_heads
    attn = 6 * c + 2 * config.kv_dim + config.n_heads  # s, h, q, k, v, out, lse + grouped copies of q, out
    ffn = 2 * c + 3 * f  # s, h, gate, up, their SwiGLU product
    per_layer = attn + ffn
    if eval_only:  # no backward; all heads' logits, stacked (a copy)
        return config.n_layers * per_layer + 2 * k * v + 2 * c
    return config.n_layers * per_layer + 3 * v + 3 * f + 4 * c  # one head's logits + backward temporaries


def step_memory(
    config: ModelConfig, batch_size: int, grad_accum: int = 1, activation_bytes: int = 4
) -> dict[str, int]:
    """Bytes of one optimizer step on one process: {"weights", "gradients", "optimizer", "activations",
    "evaluation", "total"}; `activation_bytes` is 2 for bf16 activations (weights stay float32)."""
    n_params = count_params(config)
    tokens = batch_size * config.context
    weights = 4 * n_params
    gradients = 4 * n_params * (2 if grad_accum > 1 else 1)  # micro-batch gradients + their running sum
    optimizer = 8 * n_params  # AdamW's m and v, float32
    activations = tokens * _floats_per_token(config, eval_only=False) * activation_bytes
    evaluation = tokens * _floats_per_token(config, eval_only=True) * 4  # logits are float32
    peak = weights + optimizer + max(gradients + activations, evaluation)
    return {
        "weights": weights,
        "gradients": gradients,
        "optimizer": optimizer,
        "activations": activations,
        "evaluation": evaluation,
        "total": int(MARGIN * peak) + FIXED_BYTES,
    }
