"""The whole model on the GPU through the fused kernels (head_dim 64, so FlashAttention runs) against
the float64 CPU model: loss and every parameter's gradient (verification ladder, step 3)."""

from __future__ import annotations

import numpy as np
import pytest

from euler_model import init_params, loss_and_grads, preset

pytestmark = pytest.mark.gpu


# bf16: every matmul operand and every stored activation is rounded to bf16 (8-bit mantissa, relative
# rounding 2**-9 per value), products of a few hundred terms: a few 1e-3 per gradient, 2e-2 with margin.
@pytest.mark.parametrize(
    "precision, rtol",
    [("fp32", 1e-4), ("tf32", 2e-2), ("bf16", 3e-2)],
    ids=["fp32", "tf32", "bf16"],
)
def test_fused_gpu_gradients_match_float64_cpu(precision, rtol) -> None:
    cp = pytest.importorskip("cupy")
    import euler_kernels as ek
    from euler_kernels import cuda as kc
    from euler_model.model import trunk_forward

    mode = ek.Precision(precision)  # tf32 and bf16: float32 attention on the TF32 tensor cores too
    cfg = preset("small", dim=256, n_heads=4, n_kv_heads=2, n_layers=2, ffn_dim=512)  # head_dim 64
    cpu = init_params(cfg, seed=3, dtype=np.float64)
    gpu = {k: cp.asarray(v, dtype=cp.float32) for k, v in cpu.items()}
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (4, cfg.context))
    targets = rng.integers(0, cfg.vocab_size, (4, cfg.context + cfg.n_mtp_heads - 1))
    mask = (rng.random(targets.shape) < 0.7).astype(np.float64)
    l_cpu, g_cpu = loss_and_grads(cfg, cpu, tokens, targets, mask)
    l_gpu, g_gpu = loss_and_grads(
        cfg, gpu, cp.asarray(tokens), cp.asarray(targets), cp.asarray(mask, dtype=cp.float32), precision=mode
    )
    assert kc.float32_on_gpu(gpu["embed"])
    hidden, _ = trunk_forward(cfg, gpu, cp.asarray(tokens), precision=mode)
    assert ek.is_bf16(hidden) == (precision == "bf16")  # the bf16 path really stores bf16 activations
    assert l_gpu == pytest.approx(l_cpu, rel=rtol / 10)
    for name in cpu:
        got, ref = cp.asnumpy(g_gpu[name]).astype(np.float64), g_cpu[name]
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert err < rtol, (name, err)
