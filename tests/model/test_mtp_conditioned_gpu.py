"""Conditioned drafting heads on the GPU (written on the CPU; run it on the GPU before merging the branch):
the captured speculative step drafts with them and gives plain greedy's tokens, and the loss and gradients
on CuPy equal NumPy's, in fp32 and with bf16 activations (there to bf16 rounding)."""

from __future__ import annotations

import numpy as np
import pytest

from euler_kernels import Precision
from euler_model import GenerationStats, generate_batch, loss_and_grads, preset
from tests.model.test_generate import scaled_params
from tests.model.test_generate_batch_gpu import on_gpu, prompts_for
from tests.model.test_gradcheck import batch

pytestmark = pytest.mark.gpu
CFG = preset("small", n_heads=2, n_kv_heads=1, mtp_conditioned=True)  # head_dim 64: the flash kernels


@pytest.fixture(scope="module")
def cp():
    return pytest.importorskip("cupy")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("tree", [(0,), (0, 1), (0, 1, 2)])
def test_captured_conditioned_drafts_give_plain_greedy(cp, precision, tree) -> None:
    mode = Precision(precision)
    gpu = on_gpu(cp, scaled_params(CFG, 0, np.float32, scale=4.0))
    prompts = prompts_for(CFG, [16, 1, 40], seed=11)
    want = generate_batch(CFG, gpu, prompts, 60, temperature=0.0, precision=mode)
    for _ in range(2):  # a kept decoder's second call too
        stats = GenerationStats()
        kw = {"speculative": True, "draft_tree": tree, "stats": stats, "precision": mode}
        out = generate_batch(CFG, gpu, prompts, 60, 0.0, **kw)
        assert out == want and stats.decode == "cuda graph" and stats.drafted > 0


@pytest.mark.parametrize(("precision", "tol"), [("fp32", 1e-5), ("bf16", 3e-2)])
def test_conditioned_loss_and_gradients_on_the_gpu_equal_numpy(cp, precision, tol) -> None:
    params = scaled_params(CFG, 1, np.float32, scale=1.0)
    tokens, targets, mask = batch(CFG, 2, 32, seed=3)
    want_loss, want = loss_and_grads(CFG, params, tokens, targets, mask)
    on_device = (cp.asarray(a) for a in (tokens, targets, mask))
    loss, grads = loss_and_grads(CFG, on_gpu(cp, params), *on_device, precision=Precision(precision))
    assert float(loss) == pytest.approx(float(want_loss), rel=tol)
    for name in ("heads_cond.1", "heads_cond.3", "heads.2", "embed", "layers.0.wq"):
        got, ref = cp.asnumpy(grads[name]), want[name]
        assert np.linalg.norm(got - ref) <= tol * np.linalg.norm(ref), name
