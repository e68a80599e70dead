"""step_memory against the measured peak of real steps (tracemalloc sees every NumPy allocation)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from euler_model import count_params, init_params, logits, loss_and_grads, preset, product_params, step_memory

SHAPES = [
    ("tiny", 4, 64, {}),
    ("small", 16, 128, {}),
    ("small", 8, 128, {"vocab_size": 4096}),
    ("small", 8, 128, {"n_mtp_heads": 1}),
    ("small", 4, 256, {"dim": 256, "n_heads": 8, "n_kv_heads": 8, "ffn_dim": 512}),
]


def measured_peaks(cfg, batch: int) -> tuple[int, int]:
    """(peak bytes of loss_and_grads, of the all-heads evaluation forward) beyond the weights."""
    params = init_params(cfg, seed=0)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (batch, cfg.context))
    targets = rng.integers(0, cfg.vocab_size, (batch, cfg.context + cfg.n_mtp_heads - 1))
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        _, grads = loss_and_grads(cfg, params, tokens, targets)
        del grads
        train = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        z = logits(cfg, params, tokens, all_heads=True)  # (K, B, T, V)
        del z
        evaluation = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return train, evaluation


@pytest.mark.parametrize(("name", "batch", "context", "overrides"), SHAPES)
def test_the_estimate_covers_the_measured_peak_without_wasting_much(name, batch, context, overrides) -> None:
    cfg = preset(name, context=context, **overrides)
    train, evaluation = measured_peaks(cfg, batch)
    est = step_memory(cfg, batch)
    need = est["weights"] + est["optimizer"] + max(train, evaluation)  # what the step really holds
    assert need <= est["total"] <= 2.0 * need + (64 << 20), (need, est)


def test_the_estimate_grows_with_batch_and_context_not_with_their_square() -> None:
    cfg = preset("small")
    one = step_memory(cfg, 1)["activations"]
    assert step_memory(cfg, 8)["activations"] == 8 * one
    assert step_memory(preset("small", context=1024), 1)["activations"] == 8 * one
    # bf16: half the bytes a value, and each layer's two norm outputs and SwiGLU product not kept (blocks.py)
    remade = 8 * cfg.context * cfg.n_layers * (2 * cfg.dim + cfg.ffn_dim) * 2
    # and one head's bf16 logits with their gradient written over them: 2 of the float32 path's 3 arrays fewer
    logits = 8 * cfg.context * 2 * cfg.vocab_size * 2
    assert step_memory(cfg, 8, activation_bytes=2)["activations"] == 4 * one - remade - logits


def test_keeping_activations_counts_what_the_bf16_backward_would_re_make() -> None:
    """keep_activations: bf16 keeps each layer's two norm outputs and SwiGLU product (2C + F bf16 values a
    token); fp8 only the attention norm's (C), its FFN keeping FP8 copies either way; float32 re-makes
    nothing, so nothing changes; with recompute one layer's caches count once."""
    cfg = preset("small")
    tokens = 8 * cfg.context
    for fp8, extra in ((False, 2 * cfg.dim + cfg.ffn_dim), (True, cfg.dim)):
        base = step_memory(cfg, 8, activation_bytes=2, fp8=fp8)["activations"]
        kept = step_memory(cfg, 8, activation_bytes=2, fp8=fp8, keep_activations=True)["activations"]
        assert kept - base == tokens * cfg.n_layers * extra * 2, fp8
        one_layer = {"activation_bytes": 2, "recompute": True, "fp8": fp8}
        rerun = [step_memory(cfg, 8, **one_layer, keep_activations=k)["activations"] for k in (False, True)]
        assert rerun[1] - rerun[0] == tokens * extra * 2, fp8
    assert step_memory(cfg, 8, keep_activations=True) == step_memory(cfg, 8)


def test_the_fp8_estimate_counts_the_ffn_copies_it_keeps() -> None:
    """fp8: each layer keeps FP8 copies (a byte a value) of its FFN's h and SwiGLU product that bf16
    re-makes, C + F bytes a token, when the MLP's matrices fit FP8 products (sizes multiples of 16); with
    recompute only one layer's caches are alive, so they count once."""
    cfg = preset("small")  # dim 128, ffn 384: FP8
    bf16 = step_memory(cfg, 8, activation_bytes=2)["activations"]
    fp8 = step_memory(cfg, 8, activation_bytes=2, fp8=True)["activations"]
    assert fp8 - bf16 == 8 * cfg.context * cfg.n_layers * (cfg.dim + cfg.ffn_dim)
    rerun = [step_memory(cfg, 8, activation_bytes=2, recompute=True, fp8=f) for f in (False, True)]
    assert rerun[1]["activations"] - rerun[0]["activations"] == 8 * cfg.context * (cfg.dim + cfg.ffn_dim)
    odd = preset("small", ffn_dim=392)  # 392 is not a multiple of 16: the MLP stays bf16
    assert step_memory(odd, 8, activation_bytes=2, fp8=True) == step_memory(odd, 8, activation_bytes=2)


def test_bf16_gradients_count_two_bytes_a_product_weight() -> None:
    """bf16_grads: the layers' matrices and the heads have bf16 gradients (2 bytes each, not 4); the running
    sum over several micro-batches stays float32."""
    cfg = preset("small")
    products = product_params(cfg)
    assert 0 < products < count_params(cfg)
    for accum in (1, 2):
        f32, b16 = (step_memory(cfg, 8, accum, 2, bf16_grads=g)["gradients"] for g in (False, True))
        assert f32 - b16 == 2 * products
        assert b16 == 4 * count_params(cfg) * (accum - 1) + 4 * count_params(cfg) - 2 * products
