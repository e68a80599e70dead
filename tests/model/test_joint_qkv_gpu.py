"""The bf16 attention block takes q, k and v from one product when the weights' bf16 copies lie one after
another (blocks.py, ek.qkv_forward): the model's own cast and the step's kept copies both lay them out so,
whatever order the params list them in. The block must give the separate products' results up to the order
of the float32 sums, and the three weights' gradients are row blocks of one joint gradient."""

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek
import euler_model
from euler_kernels.cuda import cast
from euler_kernels.testing import relative_error
from euler_model import blocks, preset

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu


def _attention_params(rng, cfg, stacked: bool) -> dict:
    c, kv = cfg.dim, cfg.kv_dim
    shapes = [("wq", (c, c)), ("wk", (kv, c)), ("wv", (kv, c)), ("wo", (c, c))]
    w = {k: cp.asarray(rng.standard_normal(s) / np.sqrt(s[1]), dtype=cp.float32) for k, s in shapes}
    copies = ek.to_bf16_many(list(w.values())) if stacked else [cast.to_bf16(v) for v in w.values()]
    p = {"layers.0." + k: v for k, v in zip(w, copies)}
    p["layers.0.attn_norm"] = cp.asarray(1.0 + 0.3 * rng.standard_normal(c), dtype=cp.float32)
    return p


def _block(cfg, p, stream, dout, bt):
    rope = euler_model.model.rope_for(cfg, p["layers.0.attn_norm"], bt[1])
    (_, o), cache = blocks.attention_block_forward(cfg, p, "layers.0.", stream, bt, rope, bf16=True)
    (dx, _, _), grads = blocks.attention_block_backward(dout, cache, "layers.0.")
    return o, dx, grads, cache


def test_the_joint_block_matches_the_separate_products():
    cfg = preset("tiny", dim=256, n_heads=4, n_kv_heads=2, context=128)
    b, t = 2, 128
    n = b * t
    rng = np.random.default_rng(0)
    stream = (cp.asarray(rng.standard_normal((n, cfg.dim)), dtype=cp.float32), None)
    dout = (cp.asarray(rng.standard_normal((n, cfg.dim)), dtype=cp.float32), None, None)
    joint_p = _attention_params(np.random.default_rng(1), cfg, stacked=True)
    separate_p = _attention_params(np.random.default_rng(1), cfg, stacked=False)
    o, dx, grads, cache = _block(cfg, joint_p, stream, dout, (b, t))
    o_s, dx_s, grads_s, cache_s = _block(cfg, separate_p, stream, dout, (b, t))
    assert cache.qkv is not None and cache_s.qkv is None  # the joint path, and the separate one
    assert relative_error(o, o_s) < 1e-2
    assert relative_error(dx, dx_s) < 1e-2
    for name in ("wq", "wk", "wv", "wo", "attn_norm"):
        assert relative_error(grads["layers.0." + name], grads_s["layers.0." + name]) < 1e-2, name
    dwq, dwk, dwv = (grads["layers.0." + k] for k in ("wq", "wk", "wv"))
    assert dwk.data.ptr == dwq.data.ptr + dwq.nbytes and dwv.data.ptr == dwk.data.ptr + dwk.nbytes
    assert all(g.flags.c_contiguous and g.dtype == cp.float32 for g in (dwq, dwk, dwv))


def test_the_bf16_forward_joins_every_layer_whatever_the_params_order(monkeypatch):
    """The model's own cast lays each layer's wq, wk, wv copies one after another even when params list
    them in another order (a checkpoint's), so every layer takes the joint product."""
    cfg = preset("tiny", dim=128, n_heads=2, n_kv_heads=1, context=64)
    params = {k: cp.asarray(v) for k, v in euler_model.init_params(cfg, seed=0).items()}
    params = dict(reversed(list(params.items())))
    calls = []
    real = ek.qkv_forward
    monkeypatch.setattr(ek, "qkv_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    rng = np.random.default_rng(0)
    tokens = cp.asarray(rng.integers(0, cfg.vocab_size, (2, 64)))
    targets = cp.asarray(rng.integers(0, cfg.vocab_size, (2, 64 + cfg.n_mtp_heads - 1)))
    loss, grads = euler_model.loss_and_grads(cfg, params, tokens, targets, precision=ek.Precision("bf16"))
    assert len(calls) == cfg.n_layers and np.isfinite(float(loss))
    assert all(grads[k].shape == params[k].shape for k in params)
