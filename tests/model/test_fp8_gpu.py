"""The model in the fp8 mode (euler_kernels.Precision("fp8")): the MLP's and the heads' matrices whose sizes
are multiples of 16 are multiplied in FP8, the rest as in bf16; the loss and every gradient stay close to
the bf16 mode's."""

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek
from euler_kernels.matmul.linear_fp8 import LinearFp8Cache
from euler_model import init_params, loss_and_grads, preset

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")


def count_calls(monkeypatch, name: str) -> dict[str, int]:
    """ek.<name> wrapped to count its calls: the returned dict's "calls"."""
    calls, real = {"calls": 0}, getattr(ek, name)

    def counted(*args, **kwargs):
        calls["calls"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(ek, name, counted)
    return calls


def run(mode, cfg, params, tokens, targets):
    loss, grads = loss_and_grads(cfg, params, tokens, targets, precision=ek.Precision(mode))
    return float(loss), {k: g.get() for k, g in grads.items()}


@pytest.mark.parametrize("vocab", [512, 500])  # 500: the heads stay bf16
def test_fp8_mode_follows_bf16(monkeypatch, vocab):
    cfg = preset("small", vocab_size=vocab, context=64, n_heads=2, n_kv_heads=1)  # heads of 64
    params = {k: cp.asarray(v, dtype=cp.float32) for k, v in init_params(cfg, seed=3).items()}
    rng = np.random.default_rng(0)
    tokens = cp.asarray(rng.integers(0, vocab, (4, 64)))
    targets = cp.asarray(rng.integers(0, vocab, (4, 64 + cfg.n_mtp_heads - 1)))
    made = []
    real = ek.fp8_weights
    monkeypatch.setattr(ek, "fp8_weights", lambda ws: made.extend(w.shape for w in ws) or real(ws))
    loss8, g8 = run("fp8", cfg, params, tokens, targets)
    heads = cfg.n_mtp_heads if vocab % 16 == 0 else 0
    assert made.count((cfg.ffn_dim, cfg.dim)) == 2 * cfg.n_layers  # gate and up of every layer
    assert made.count((cfg.dim, cfg.ffn_dim)) == cfg.n_layers
    assert made.count((vocab, cfg.dim)) == heads
    loss16, g16 = run("bf16", cfg, params, tokens, targets)
    assert abs(loss8 - loss16) < 1e-2 * loss16
    diffs = {n: float(np.linalg.norm(g8[n] - g16[n]) / np.linalg.norm(g16[n])) for n in g16}
    assert max(diffs.values()) < 0.2, diffs  # FP8 keeps 3 (e4m3) or 2 (e5m2) mantissa bits
    assert np.linalg.norm(g8["layers.0.w_up"] - g16["layers.0.w_up"]) > 0  # FP8 really ran


def test_fp8_mode_keeps_fp8_copies_instead_of_remaking(monkeypatch):
    """bf16 re-makes each FFN's norm output and SwiGLU product in the backward (the product in SwiGLU's
    backward pass, product=True); fp8 keeps their transposed FP8 copies and re-makes no product. SwiGLU's
    forward runs once a layer in both."""
    cfg = preset("small", vocab_size=512, context=64, n_heads=2, n_kv_heads=1)
    params = {k: cp.asarray(v, dtype=cp.float32) for k, v in init_params(cfg, seed=3).items()}
    rng = np.random.default_rng(1)
    tokens = cp.asarray(rng.integers(0, 512, (4, 64)))
    targets = cp.asarray(rng.integers(0, 512, (4, 64 + cfg.n_mtp_heads - 1)))
    forwards = count_calls(monkeypatch, "swiglu_forward")
    remade, backward = {"calls": 0}, ek.swiglu_backward

    def counted_backward(*args, **kwargs):
        remade["calls"] += bool(kwargs.get("product"))
        return backward(*args, **kwargs)

    monkeypatch.setattr(ek, "swiglu_backward", counted_backward)
    for mode, per_layer in (("bf16", 1), ("fp8", 0)):
        forwards["calls"] = remade["calls"] = 0
        run(mode, cfg, params, tokens, targets)
        assert forwards["calls"] == cfg.n_layers, mode
        assert remade["calls"] == per_layer * cfg.n_layers, mode


def test_fp8_caches_keep_only_the_backwards_parts():
    """After the forward, each FFN product's cache holds its weight's transposed FP8 part (what dx takes)
    and its input's transposed FP8 copy (what dweight takes), no row-major part of either: those were
    the forward's and are freed with it."""
    from euler_model.model import trunk_forward

    cfg = preset("small", vocab_size=512, context=64, n_heads=2, n_kv_heads=1)
    params = {k: cp.asarray(v, dtype=cp.float32) for k, v in init_params(cfg, seed=3).items()}
    tokens = cp.asarray(np.random.default_rng(2).integers(0, 512, (4, 64)))
    _, trunk_cache = trunk_forward(cfg, params, tokens, precision=ek.Precision("fp8"))
    for layer in trunk_cache.layers:
        for c in (layer.ffn.gate, layer.ffn.up, layer.ffn.down):
            assert type(c) is LinearFp8Cache and c.w8.rows is None and c.w8.cols is not None
            assert c.x8.rows is None and c.x8.cols is not None


def test_delayed_fp8_scales_calibrate_on_the_first_step_then_cast_in_swiglu(monkeypatch):
    """With delayed scales (blocks.FP8_SCALES): the first call (not calibrated) is the fp8 mode's step bit
    for bit, and raises the slots' maxima; after the update the SwiGLU kernels cast with those scales,
    nothing saturates on the same batch, and the loss and gradients stay close to the current-scaling ones."""
    from euler_model.blocks import fp8_scale_formats
    from euler_model.model import loss_and_grads_on_device

    cfg = preset("small", vocab_size=512, context=64, n_heads=2, n_kv_heads=1)
    params = {k: cp.asarray(v, dtype=cp.float32) for k, v in init_params(cfg, seed=3).items()}
    rng = np.random.default_rng(4)
    tokens = cp.asarray(rng.integers(0, 512, (4, 64)))
    targets = cp.asarray(rng.integers(0, 512, (4, 64 + cfg.n_mtp_heads - 1)))

    def step(scales, mode="fp8"):
        precision = ek.Precision(mode)
        loss, grads = loss_and_grads_on_device(
            cfg, params, tokens, targets, fp8_scales=scales, precision=precision
        )
        return float(loss), {k: g.get() for k, g in grads.items()}

    loss0, g0 = step(None)  # current scaling
    scales = ek.new_fp8_scales(fp8_scale_formats(cfg))
    loss1, g1 = step(scales)  # calibrating: the same arithmetic
    assert loss1 == loss0
    for n in g0:  # the norms' and the embedding's gradients are summed with atomics: their order varies
        if n == "embed" or n.endswith("norm"):
            np.testing.assert_allclose(g1[n], g0[n], rtol=0, atol=1e-5 * float(np.abs(g0[n]).max()))
        else:
            np.testing.assert_array_equal(g1[n], g0[n], err_msg=n)
    maxima = scales.amax_now.get().view(np.float32)
    assert np.all(maxima > 0) and np.all(np.isfinite(maxima))
    ek.update_fp8_scales(scales)
    scales.calibrated = True
    calls = count_calls(monkeypatch, "swiglu_forward_fp8")
    loss2, g2 = step(scales)
    assert calls["calls"] == cfg.n_layers
    # the same batch: its own maxima fit, but they were measured bf16-rounded in the calibrating step, so a
    # float32 maximum up to 2^-9 above one may saturate (by that much) when it sat at its scale's top
    assert int(scales.saturated.get().sum()) <= len(scales.formats)
    assert abs(loss2 - loss0) < 1e-3 * abs(loss0)
    assert not np.array_equal(g2["layers.0.w_up"], g0["layers.0.w_up"])  # the delayed path really ran
    # each gradient as far from the bf16 mode's as current scaling's is (FP8 rounds another way: its
    # values are cast from float32, not from bf16-rounded ones)
    _, g16 = step(None, "bf16")
    err = {n: [float(np.linalg.norm(g[n] - g16[n]) / np.linalg.norm(g16[n])) for g in (g0, g2)] for n in g0}
    assert all(delayed <= 1.5 * current + 0.01 for current, delayed in err.values()), err
