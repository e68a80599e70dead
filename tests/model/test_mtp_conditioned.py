"""Conditioned drafting heads (ModelConfig.mtp_conditioned): head k >= 1 reads h + P_k e(x_{t+k}), the
embedding of the token before the one it predicts. The loss against a direct NumPy computation (the whole
model's float64 gradient check with them is in test_gradcheck.py), speculation, the Hugging Face folder."""

from __future__ import annotations

import numpy as np
import pytest

from euler_model import forward_loss, gradcheck_params, logits, loss_and_grads, param_shapes, preset
from euler_model.model import trunk_forward
from tests.model.test_gradcheck import batch, log_softmax


def test_the_conditioned_heads_have_their_matrices_and_need_two_heads() -> None:
    cfg = preset("tiny", mtp_conditioned=True)
    shapes = param_shapes(cfg)
    assert [n for n in shapes if n.startswith("heads_cond.")] == ["heads_cond.1", "heads_cond.2"]
    assert shapes["heads_cond.1"] == (cfg.dim, cfg.dim)
    with pytest.raises(ValueError, match="mtp_conditioned"):
        preset("tiny", n_mtp_heads=1, mtp_conditioned=True)


@pytest.mark.parametrize("use_mask", [False, True])
def test_conditioned_loss_is_each_head_on_h_plus_the_projected_next_embedding(use_mask) -> None:
    cfg = preset("tiny", mtp_conditioned=True)
    params = gradcheck_params(cfg, seed=0)
    tokens, targets, mask = batch(cfg, 3, 9, seed=1, partial_mask=use_mask)
    h = trunk_forward(cfg, params, tokens, recompute=True)[0]  # (B, T, C)
    t = tokens.shape[1]
    every = logits(cfg, params, tokens, all_heads=True, targets=targets)  # (K, B, T, V)
    per_head = []
    for k in range(cfg.n_mtp_heads):
        a = h if k == 0 else h + params["embed"][targets[:, k - 1 : k - 1 + t]] @ params[f"heads_cond.{k}"].T
        z = a @ params[f"heads.{k}"].T
        nll = -np.take_along_axis(log_softmax(z), targets[:, k : k + t][..., None], -1)[..., 0]
        w = np.ones_like(nll) if mask is None else mask[:, k : k + t]
        per_head.append((w * nll).sum() / max(w.sum(), 1.0))
        np.testing.assert_allclose(every[k], z, rtol=1e-10, atol=1e-12)
    loss, _ = loss_and_grads(cfg, params, tokens, targets, mask)
    assert loss == pytest.approx(np.mean(per_head), rel=1e-10)
    with pytest.raises(ValueError, match="needs the targets"):
        logits(cfg, params, tokens, all_heads=True)
    assert forward_loss(cfg, params, tokens, targets, mask) == pytest.approx(loss, rel=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_speculative_decoding_with_conditioned_heads_gives_plain_greedy(dtype) -> None:
    """generate's one-prompt speculation and generate_batch's chain draft with the conditioned heads; the
    tokens are plain greedy's, and drafts are made."""
    from euler_model import GenerationStats, generate, generate_batch, init_params
    from tests.model.test_generate import scaled_params

    cfg = preset("small", mtp_conditioned=True)
    params = scaled_params(cfg, 0, dtype, scale=4.0)
    assert "heads_cond.1" in params and init_params(cfg)["heads_cond.3"].shape == (cfg.dim, cfg.dim)
    prompts = [[1, 2, 3, 4], [7] * 9]
    want = [list(generate(cfg, params, p, 40, temperature=0.0)) for p in prompts]
    for p, w in zip(prompts, want):
        stats = GenerationStats()
        kw = {"speculative": True, "stats": stats, "draft_tree": (0, 1, 2)}
        assert list(generate(cfg, params, p, 40, temperature=0.0, **kw)) == w
        assert stats.drafted > 0
    for tree in [(0,), (0, 1), (0, 1, 2)]:
        stats = GenerationStats()
        out = generate_batch(cfg, params, prompts, 40, 0.0, speculative=True, draft_tree=tree, stats=stats)
        assert [c.tokens for c in out] == want and stats.drafted > 0
    with pytest.raises(ValueError, match="chains only"):
        generate_batch(cfg, params, prompts, 40, 0.0, speculative=True, draft_tree=(0, 0))


def test_conditioned_heads_go_through_the_hugging_face_folder(tmp_path) -> None:
    from euler_model import load_hf, save_hf

    cfg = preset("tiny", mtp_conditioned=True)
    params = gradcheck_params(cfg, seed=7)
    save_hf(cfg, params, tmp_path)
    back_cfg, back = load_hf(tmp_path, dtype=np.float64)
    assert back_cfg == cfg
    assert sorted(back) == sorted(params)
    for name, value in params.items():
        np.testing.assert_array_equal(back[name], value.astype(np.float32))  # save_hf writes float32
    plain = preset("tiny")
    save_hf(plain, gradcheck_params(plain, seed=7), tmp_path)  # the conditioned matrices' file is rewritten
    assert load_hf(tmp_path)[0] == plain
