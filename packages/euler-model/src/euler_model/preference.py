"""Preference tuning (DPO): the loss over pairs of replies and its gradient, by hand.

A batch holds P pairs as 2P sequences, pair i's chosen reply in row 2i and its rejected reply in row 2i + 1
(euler-data's preference sets), each row a prompt and a reply, with targets (the next tokens) and a mask
that is 1 on the reply's tokens. The policy's log-probability of a reply is head 0's (the next-token
model's) summed over the reply's tokens:

    logp_s = sum_t mask[s, t] * log softmax(z[s, t])[targets[s, t]]                z = head 0's logits

and with the reference model's log-probabilities ref_s (the frozen initial weights', computed once),

    m_i  = beta * ((logp_2i - ref_2i) - (logp_2i+1 - ref_2i+1))    (the implicit reward margin)
    loss = mean_i -log sigmoid(m_i) = mean_i softplus(-m_i)

Its gradient, from the loss to the logits, then the model's own backward:

    dloss/dm_i       = -sigmoid(-m_i) / P
    dloss/dlogp_2i   =  beta * dloss/dm_i,     dloss/dlogp_2i+1 = -beta * dloss/dm_i
    dloss/dz[s, t]   =  dloss/dlogp_s * mask[s, t] * (onehot(targets[s, t]) - softmax(z[s, t]))
    dz -> head 0's linear_backward -> trunk_backward (blocks.py), as in training

With sft_weight w > 0 the loss also holds w times the chosen replies' mean negative log-likelihood per
reply token, NLL = -sum_{chosen rows s} logp_s / (their reply tokens), which keeps the chosen replies likely
while the margins grow (DPO alone may lower both replies' log-probabilities, the chosen less): each chosen
reply token's dloss/dlogp gains -w / (the batch's chosen reply tokens), and the same path to the logits
follows.

The other MTP heads take no part (their gradients are zero). float64 central differences check all of it
(tests/model/test_preference.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

import euler_kernels as ek
from euler_model.config import ModelConfig
from euler_model.model import trunk_backward, trunk_forward


def _check_batch(config: ModelConfig, tokens: Any, targets: Any, mask: Any, where: str) -> None:
    if tokens.ndim != 2 or not 1 <= tokens.shape[1] <= config.context:
        raise ValueError(f"{where}: tokens must be (S, T) with 1 <= T <= context={config.context}")
    if tuple(targets.shape) != tuple(tokens.shape) or tuple(mask.shape) != tuple(tokens.shape):
        raise ValueError(
            f"{where}: targets and mask must have the tokens' shape {tuple(tokens.shape)}, got "
            f"{tuple(targets.shape)} and {tuple(mask.shape)}"
        )


def _token_logprobs(z: Any, targets: Any) -> tuple[Any, Any]:
    """(log softmax(z)[target] (N,), softmax(z) (N, V)) of logits z (N, V) in their float dtype."""
    xp = ek.get_array_module(z)
    top = z.max(axis=-1, keepdims=True)
    e = xp.exp(z - top)  # (N, V)
    total = e.sum(axis=-1, keepdims=True)
    picked = xp.take_along_axis(z, targets[:, None], axis=-1)[:, 0]  # (N,)
    return picked - top[:, 0] - xp.log(total[:, 0]), e / total


def sequence_logprobs(
    config: ModelConfig,
    params: dict[str, Any],
    tokens: Any,
    targets: Any,
    mask: Any,
    precision: ek.Precision = ek.EXACT,
) -> Any:
    """Each row's summed log-probability of its masked targets under head 0, (S,) on the parameters'
    device (no gradients; the reference log-probabilities of a DPO run are these of its initial weights).
    """
    _check_batch(config, tokens, targets, mask, "sequence_logprobs")
    h, _ = trunk_forward(config, params, tokens, recompute=True, precision=precision)  # keeps no caches
    z = ek.linear_forward(h.reshape(-1, config.dim), params["heads.0"], precision=precision)[0]  # (N, V)
    logp, _ = _token_logprobs(z, targets.reshape(-1))
    return (logp * mask.reshape(-1)).reshape(tokens.shape).sum(axis=-1)


class PairBatch(NamedTuple):
    """The 2P rows of P preference pairs (module docstring), with the reference's log-probabilities."""

    tokens: Any  # (2P, T) int: row 2i pair i's prompt and chosen reply, row 2i + 1 the rejected one
    targets: Any  # (2P, T) int: the next token of each position
    mask: Any  # (2P, T): 1 where the target is a reply's token
    ref_logps: Any  # (2P,): the reference model's sequence_logprobs of the rows


def reward_margins(logps: Any, ref_logps: Any) -> Any:
    """(P,) each pair's implicit reward margin over beta, from its 2P rows' log-probabilities:
    (logp_2i - ref_2i) - (logp_2i+1 - ref_2i+1)."""
    rewards = logps - ref_logps.astype(logps.dtype)  # (2P,)
    return rewards[0::2] - rewards[1::2]


def dpo_loss_and_grads(
    config: ModelConfig,
    params: dict[str, Any],
    batch: PairBatch,
    beta: float = 0.1,
    precision: ek.Precision = ek.EXACT,
    grad_scale: Any = None,
    recompute: bool = False,
    fp8_scales: Any = None,
    keep_activations: bool = False,
    bf16_grads: bool = False,
    sft_weight: float = 0.0,
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(loss, gradients keyed like params, statistics) of the DPO loss over a batch of pairs (see the
    module docstring), plus sft_weight times the chosen replies' NLL per token. The loss is a 0-d array;
    statistics (each (P,) on the device): "margin" (m_i / beta, the reward margin), "chosen_logp",
    "rejected_logp" (the policy's). grad_scale, recompute, fp8_scales, keep_activations, bf16_grads: as
    loss_and_grads_on_device's (nothing is read back to the host, so the training step that calls this
    can be captured as a CUDA graph).
    """
    tokens, targets, mask, ref_logps = batch
    _check_batch(config, tokens, targets, mask, "dpo_loss_and_grads")
    s, t = tokens.shape
    if s % 2 or tuple(ref_logps.shape) != (s,):
        shapes = f"got {s} rows and ref_logps {tuple(ref_logps.shape)}"
        raise ValueError(f"dpo_loss_and_grads: needs an even number of rows and ref_logps (rows,); {shapes}")
    xp = ek.get_array_module(params["embed"])
    h, trunk_cache = trunk_forward(
        config, params, tokens, recompute=recompute, fp8_scales=fp8_scales, keep_activations=keep_activations,
        precision=precision,
    )  # fmt: skip
    # (S, T, C) -> (N, V) float32 logits (bf16 products where h is a bf16 activation)
    z, c_head = ek.linear_forward(h.reshape(-1, config.dim), params["heads.0"], precision=precision)
    flat_targets, flat_mask = targets.reshape(-1), mask.reshape(-1).astype(z.dtype)  # (N,)
    logp_tok, probs = _token_logprobs(z, flat_targets)  # (N,), (N, V)
    logps = (logp_tok * flat_mask).reshape(s, t).sum(axis=-1)  # (S,)
    m = beta * reward_margins(logps, ref_logps)  # (P,)
    loss = xp.logaddexp(0.0, -m).mean()  # softplus(-m): no overflow for any m
    dm = -1.0 / (1.0 + xp.exp(m)) / m.shape[0]  # -sigmoid(-m) / P
    scale = None if grad_scale is None else xp.asarray(grad_scale, dtype=dm.dtype)
    if scale is not None:  # the backward is linear: scaling dloss/dlogp scales every gradient
        dm = dm * scale
    dlogp = xp.empty_like(logps)
    dlogp[0::2], dlogp[1::2] = beta * dm, -beta * dm
    if sft_weight:  # + w * NLL of the chosen replies per token: each chosen token's logp weighs -w / count
        chosen_tokens = xp.maximum(mask[0::2].sum(), 1).astype(z.dtype)  # on the device: nothing read back
        loss = loss - sft_weight * logps[0::2].sum() / chosen_tokens
        dlogp[0::2] -= sft_weight / chosen_tokens if scale is None else sft_weight / chosen_tokens * scale
    coef = xp.repeat(dlogp, t) * flat_mask  # (N,) dloss/dlogp of each token's row, where masked
    dz = -coef[:, None] * probs  # (N, V): coef * (onehot - softmax)
    dz[xp.arange(dz.shape[0]), flat_targets] += coef
    dh, dhead = ek.linear_backward(dz, c_head, bf16_dweight=bf16_grads)
    grads = trunk_backward(config, dh.reshape(s, t, config.dim), trunk_cache, bf16_grads)
    grads["heads.0"] = dhead
    for name in params:  # the other heads and their conditioning take no part
        if name not in grads:
            grads[name] = xp.zeros_like(params[name])
    stats = {"margin": m / beta, "chosen_logp": logps[0::2], "rejected_logp": logps[1::2]}
    return loss, {name: grads[name] for name in params}, stats


def dpo_loss(
    config: ModelConfig,
    params: dict[str, Any],
    batch: PairBatch,
    beta: float = 0.1,
    precision: Any = ek.EXACT,
    sft_weight: float = 0.0,
) -> float:
    """The same loss as dpo_loss_and_grads, as a host number, without gradients (the float64 checks')."""
    tokens, targets, mask, ref_logps = batch
    logps = ek.to_numpy(sequence_logprobs(config, params, tokens, targets, mask, precision))  # (2P,)
    loss = float(np.logaddexp(0.0, -beta * reward_margins(logps, ek.to_numpy(ref_logps))).mean())
    if sft_weight:
        loss -= sft_weight * float(logps[0::2].sum()) / max(float(ek.to_numpy(mask)[0::2].sum()), 1.0)
    return loss
