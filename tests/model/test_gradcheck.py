"""Whole-model float64 gradient check, and the MTP loss against a direct NumPy computation."""

from __future__ import annotations

import numpy as np
import pytest

from euler_kernels import gradcheck_scalar
from euler_model import forward_loss, gradcheck_params, init_params, logits, loss_and_grads, preset


def batch(cfg, b, t, seed, partial_mask=True):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab_size, (b, t))
    targets = rng.integers(0, cfg.vocab_size, (b, t + cfg.n_mtp_heads - 1))
    mask = (rng.random(targets.shape) < 0.6).astype(np.float64) if partial_mask else None
    return tokens, targets, mask


@pytest.mark.slow
@pytest.mark.parametrize("conditioned", [False, True], ids=["plain heads", "conditioned heads"])
def test_whole_model_gradcheck_every_tensor(conditioned) -> None:
    cfg = preset("tiny", mtp_conditioned=conditioned)
    params = gradcheck_params(cfg, seed=3)
    tokens, targets, mask = batch(cfg, 2, 7, seed=4)
    loss, grads = loss_and_grads(cfg, params, tokens, targets, mask)
    assert sorted(grads) == sorted(params)
    report = gradcheck_scalar(
        lambda p: forward_loss(cfg, p, tokens, targets, mask), params, grads, max_samples=None, eps=1e-5
    )
    assert len(report.inputs) == len(params)
    assert report.ok(1e-6), report.table(1e-6)
    assert loss == pytest.approx(forward_loss(cfg, params, tokens, targets, mask), rel=1e-12)


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.mark.parametrize("use_mask", [False, True])
def test_mtp_loss_is_mean_over_heads_of_masked_cross_entropy(use_mask) -> None:
    cfg = preset("tiny")
    params = gradcheck_params(cfg, seed=0)
    tokens, targets, mask = batch(cfg, 3, 9, seed=1, partial_mask=use_mask)
    z = logits(cfg, params, tokens, all_heads=True)  # (K, B, T, V)
    t = tokens.shape[1]
    per_head = []
    for k in range(cfg.n_mtp_heads):
        tgt = targets[:, k : k + t]  # head k predicts the token 1 + k ahead
        nll = -np.take_along_axis(log_softmax(z[k]), tgt[..., None], -1)[..., 0]
        w = np.ones_like(nll) if mask is None else mask[:, k : k + t]
        per_head.append((w * nll).sum() / max(w.sum(), 1.0))
    loss, _ = loss_and_grads(cfg, params, tokens, targets, mask)
    assert loss == pytest.approx(np.mean(per_head), rel=1e-10)
    np.testing.assert_allclose(z[0], logits(cfg, params, tokens), rtol=1e-12)


def test_single_head_uses_next_tokens_and_masked_positions_have_no_gradient() -> None:
    cfg = preset("tiny", n_mtp_heads=1)
    params = gradcheck_params(cfg, seed=2)
    tokens, targets, _ = batch(cfg, 2, 6, seed=3)
    mask = np.ones(targets.shape)
    mask[1] = 0.0  # the second sequence does not count
    loss, grads = loss_and_grads(cfg, params, tokens, targets, mask)
    loss0, _ = loss_and_grads(cfg, params, tokens[:1], targets[:1])
    assert loss == pytest.approx(loss0, rel=1e-12)
    emb_rows = np.abs(grads["embed"]).sum(1)
    only_second = np.setdiff1d(tokens[1], tokens[0])
    np.testing.assert_array_equal(emb_rows[only_second], 0.0)


def test_float32_matches_float64() -> None:
    cfg = preset("tiny")
    p64 = gradcheck_params(cfg, seed=7)
    p32 = {k: v.astype(np.float32) for k, v in p64.items()}
    tokens, targets, mask = batch(cfg, 2, 16, seed=8)
    l64, g64 = loss_and_grads(cfg, p64, tokens, targets, mask)
    l32, g32 = loss_and_grads(cfg, p32, tokens, targets, mask.astype(np.float32))
    assert l32 == pytest.approx(l64, rel=1e-5)
    for k in p64:
        assert g32[k].dtype == np.float32
        np.testing.assert_allclose(g32[k], g64[k], rtol=2e-3, atol=2e-5 * np.abs(g64[k]).max(), err_msg=k)


@pytest.mark.parametrize(
    "tokens_shape, targets_shape, mask_shape, message",
    [
        ((2, 5), (2, 5), None, r"targets must be \(B, T \+ K - 1\)"),
        ((2, 5), (2, 7), (2, 5), "loss_mask must have the targets' shape"),
        ((2, 17), (2, 19), None, "context=16"),
        ((5,), (7,), None, r"tokens must be \(B, T\)"),
    ],
)
def test_bad_shapes_raise(tokens_shape, targets_shape, mask_shape, message) -> None:
    cfg = preset("tiny")
    params = init_params(cfg)
    mask = None if mask_shape is None else np.ones(mask_shape)
    with pytest.raises(ValueError, match=message):
        loss_and_grads(cfg, params, np.zeros(tokens_shape, int), np.zeros(targets_shape, int), mask)
