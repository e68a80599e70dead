"""The same model on CuPy arrays: gradients, generation and checkpoints agree with the NumPy path."""

from __future__ import annotations

import numpy as np
import pytest

from euler_model import (
    generate,
    init_params,
    load_checkpoint,
    logits,
    loss_and_grads,
    preset,
    save_checkpoint,
)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    return pytest.importorskip("cupy")


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-9), (np.float32, 2e-3)])
def test_gpu_loss_and_grads_match_cpu(cp, dtype, rtol) -> None:
    cfg = preset("small", n_layers=2)
    cpu = init_params(cfg, seed=0, dtype=dtype)
    gpu = {k: cp.asarray(v) for k, v in cpu.items()}
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (4, 64))
    targets = rng.integers(0, cfg.vocab_size, (4, 64 + cfg.n_mtp_heads - 1))
    mask = (rng.random(targets.shape) < 0.7).astype(dtype)
    l_cpu, g_cpu = loss_and_grads(cfg, cpu, tokens, targets, mask)
    l_gpu, g_gpu = loss_and_grads(cfg, gpu, cp.asarray(tokens), cp.asarray(targets), cp.asarray(mask))
    assert l_gpu == pytest.approx(l_cpu, rel=rtol)
    for k in cpu:
        assert isinstance(g_gpu[k], cp.ndarray)
        scale = np.abs(g_cpu[k]).max()
        np.testing.assert_allclose(cp.asnumpy(g_gpu[k]), g_cpu[k], rtol=rtol, atol=rtol * scale, err_msg=k)
    np.testing.assert_allclose(
        cp.asnumpy(logits(cfg, gpu, cp.asarray(tokens))), logits(cfg, cpu, tokens), rtol=rtol, atol=rtol
    )


def test_gpu_generation_and_checkpoint(cp, tmp_path) -> None:
    cfg = preset("tiny")
    cpu = {k: v * 8 for k, v in init_params(cfg, seed=1, dtype=np.float64).items()}
    gpu = {k: cp.asarray(v) for k, v in cpu.items()}
    plain_cpu = list(generate(cfg, cpu, [1, 2, 3], 12, temperature=0.0))
    assert list(generate(cfg, gpu, [1, 2, 3], 12, temperature=0.0)) == plain_cpu
    assert list(generate(cfg, gpu, [1, 2, 3], 12, temperature=0.0, speculative=True)) == plain_cpu
    save_checkpoint(tmp_path / "m.safetensors", cfg, gpu)
    _, back, _ = load_checkpoint(tmp_path / "m.safetensors", xp=cp)
    assert all(isinstance(v, cp.ndarray) for v in back.values())
    np.testing.assert_array_equal(cp.asnumpy(back["heads.2"]), cpu["heads.2"])
