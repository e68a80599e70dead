"""The layer code exists once: one change to the layer's definition in blocks.py (the test-only
BRANCH_SCALE: x = x + s f(rmsnorm(x)) for each block) moves the training loss, the prefill's logits and the
decoded tokens together, its gradients still pass the float64 check, and decoding still agrees with the
training forward."""

from __future__ import annotations

import numpy as np

import euler_kernels as ek
from euler_kernels import gradcheck_scalar
from euler_model import blocks, forward_loss, generate, gradcheck_params, logits, loss_and_grads, preset
from euler_model.decode_state import DecodeState, PrefillRows
from euler_model.model import trunk_forward
from tests.model.test_generate import naive_greedy, scaled_params
from tests.model.test_gradcheck import batch

SCALE = 0.5


def everything(cfg, params, tokens, targets, prompt):
    """(training loss, prefill logits (B, V) after each row's last token, greedy tokens after `prompt`)."""
    loss, _ = loss_and_grads(cfg, params, tokens, targets)
    state = DecodeState.allocate(cfg, np, params["embed"].dtype, tokens.shape[0])
    h = trunk_forward(cfg, params, tokens, kv=PrefillRows(state, slice(0, tokens.shape[0])))[0]  # a prefill
    z = ek.linear_forward(h[:, -1], params["heads.0"])[0]
    return loss, z, list(generate(cfg, params, prompt, 10, temperature=0.0))


def test_a_scaled_branch_moves_training_prefill_and_decoding_together(monkeypatch) -> None:
    cfg = preset("tiny")
    params = scaled_params(cfg, 1, np.float64, scale=4.0)
    tokens, targets, _ = batch(cfg, 2, 6, seed=2)
    prompt = [3, 1, 4, 1, 5]
    plain = everything(cfg, params, tokens, targets, prompt)
    monkeypatch.setattr(blocks, "BRANCH_SCALE", SCALE)
    scaled = everything(cfg, params, tokens, targets, prompt)
    assert abs(scaled[0] - plain[0]) > 1e-3  # the training loss moved (rounding: ~1e-15)
    assert not np.allclose(scaled[1], plain[1], rtol=1e-3)  # the prefill's logits too
    assert scaled[2] != plain[2]  # and the decoded tokens
    # the prefill and the decode steps still compute what the training forward computes
    np.testing.assert_allclose(scaled[1], logits(cfg, params, tokens)[:, -1], rtol=1e-10, atol=1e-10)
    assert scaled[2] == naive_greedy(cfg, params, prompt, 10)
    assert list(generate(cfg, params, prompt, 10, temperature=0.0, speculative=True)) == scaled[2]


def test_the_scaled_branch_passes_the_float64_gradient_check(monkeypatch) -> None:
    monkeypatch.setattr(blocks, "BRANCH_SCALE", SCALE)
    cfg = preset("tiny", n_layers=1)
    params = gradcheck_params(cfg, seed=3)
    tokens, targets, mask = batch(cfg, 2, 5, seed=4)
    _, grads = loss_and_grads(cfg, params, tokens, targets, mask)
    report = gradcheck_scalar(lambda p: forward_loss(cfg, p, tokens, targets, mask), params, grads, eps=1e-5)
    assert report.ok(1e-6), report.table(1e-6)
