"""keep_activations (train.keep_activations): the bf16 caches keep each norm's output h and the SwiGLU
product instead of the backward re-making them (blocks.py). The re-made arrays have the forward's bits, so
keeping them changes memory and time only: the same loss, and gradients within the spread of the
backward's atomic additions (attention's dq, the norms' weight gradients)."""

from __future__ import annotations

import numpy as np
import pytest

from euler_kernels import Precision
from euler_model import init_params, loss_and_grads, preset
from euler_model.model import trunk_forward

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu


def _batch(cfg, b: int, t: int, seed: int):
    rng = np.random.default_rng(seed)
    tokens = cp.asarray(rng.integers(0, cfg.vocab_size, (b, t)))
    targets = cp.asarray(rng.integers(0, cfg.vocab_size, (b, t + cfg.n_mtp_heads - 1)))
    return tokens, targets


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
@pytest.mark.parametrize("recompute", [False, True])
def test_kept_activations_give_the_gradients_of_re_made_ones(precision, recompute) -> None:
    cfg = preset("gpu", n_layers=3, context=128)
    params = init_params(cfg, seed=0, xp=cp)
    tokens, targets = _batch(cfg, 4, 128, seed=0)
    kw = {"recompute": recompute, "precision": Precision(precision)}
    loss, grads = loss_and_grads(cfg, params, tokens, targets, **kw)
    loss_k, grads_k = loss_and_grads(cfg, params, tokens, targets, keep_activations=True, **kw)
    assert loss_k == loss
    for key, g in grads.items():
        g, g_k = cp.asnumpy(g), cp.asnumpy(grads_k[key])
        assert np.linalg.norm(g_k - g) <= 1e-3 * np.linalg.norm(g), key


def test_the_caches_keep_what_the_backward_would_re_make() -> None:
    """Each block's cache says what re-makes h (its remake): None when it is kept."""
    cfg = preset("gpu", n_layers=2, context=64)
    params = init_params(cfg, seed=0, xp=cp)
    tokens, _ = _batch(cfg, 2, 64, seed=1)
    for keep in (False, True):
        _, cache = trunk_forward(cfg, params, tokens, keep_activations=keep, precision=Precision("bf16"))
        for layer in cache.layers:
            assert (layer.attention.remake is None) is keep and (layer.ffn.remake is None) is keep
