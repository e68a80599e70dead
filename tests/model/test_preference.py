"""The DPO loss and its hand-written gradient: float64 central differences through the whole tiny model
(every parameter tensor), values by hand, and PyTorch autograd on the exported transformers Llama."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file

import euler_kernels as ek
from euler_model import gradcheck_params, preset, save_hf
from euler_model.preference import PairBatch, dpo_loss, dpo_loss_and_grads, sequence_logprobs


def pair_batch(cfg, pairs: int, t: int, seed: int):
    """2P rows (chosen 2i, rejected 2i + 1) sharing a prompt per pair, replies masked after it."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab_size, (2 * pairs, t))
    tokens[1::2, : t // 2] = tokens[0::2, : t // 2]  # one prompt, two replies
    targets = rng.integers(0, cfg.vocab_size, (2 * pairs, t))
    mask = np.zeros((2 * pairs, t))
    mask[:, t // 2 - 1 :] = 1.0  # the reply's tokens (the targets after the prompt)
    return tokens, targets, mask


def reference(cfg, params, batch, seed):
    """Reference log-probabilities of a nearby model, so that the rewards are not zero."""
    rng = np.random.default_rng(seed)
    other = {k: v + 0.05 * rng.standard_normal(v.shape) for k, v in params.items()}
    return sequence_logprobs(cfg, other, *batch)


@pytest.mark.parametrize(("beta", "sft_weight"), [(0.1, 0.0), (2.0, 0.0), (0.1, 0.7)])
def test_dpo_gradient_is_the_loss_derivative_float64(beta, sft_weight) -> None:
    cfg = preset("tiny")
    params = gradcheck_params(cfg, seed=0)  # float64, weights large enough that every path has a gradient
    batch = pair_batch(cfg, 2, 7, seed=1)
    ref = reference(cfg, params, batch, seed=2)
    pairs = PairBatch(*batch, ref)
    loss, grads, stats = dpo_loss_and_grads(cfg, params, pairs, beta=beta, sft_weight=sft_weight)
    want = dpo_loss(cfg, params, pairs, beta=beta, sft_weight=sft_weight)
    assert float(loss) == pytest.approx(want, rel=1e-12)
    assert np.abs(stats["margin"]).max() > 1e-3  # a real margin, not the symmetric point
    report = ek.gradcheck_scalar(
        lambda p: dpo_loss(cfg, p, pairs, beta=beta, sft_weight=sft_weight),
        params,
        grads,
        max_samples=12,
        eps=1e-5,
        label="dpo",
    )
    assert report.ok(1e-6), report.table(1e-6)
    assert all(not grads[f"heads.{k}"].any() for k in range(1, cfg.n_mtp_heads))  # only head 0 scores


def test_the_sft_term_adds_the_chosen_replies_nll_per_token() -> None:
    cfg = preset("tiny")
    params = gradcheck_params(cfg, seed=5)
    tokens, targets, mask = pair_batch(cfg, 3, 6, seed=6)
    pairs = PairBatch(tokens, targets, mask, reference(cfg, params, (tokens, targets, mask), seed=7))
    plain, _, _ = dpo_loss_and_grads(cfg, params, pairs, beta=0.3)
    both, _, stats = dpo_loss_and_grads(cfg, params, pairs, beta=0.3, sft_weight=0.5)
    nll = -stats["chosen_logp"].sum() / mask[0::2].sum()
    assert float(both) == pytest.approx(float(plain) + 0.5 * nll, rel=1e-12) and nll > 0


def test_the_loss_at_the_reference_is_log_2_and_the_margins_are_the_reward_gaps() -> None:
    cfg = preset("tiny")
    params = gradcheck_params(cfg, seed=3)
    batch = pair_batch(cfg, 3, 6, seed=4)
    own = sequence_logprobs(cfg, params, *batch)
    loss, _, stats = dpo_loss_and_grads(cfg, params, PairBatch(*batch, own), beta=0.5)
    assert float(loss) == pytest.approx(np.log(2.0), abs=1e-12) and not stats["margin"].any()
    shifted = own.copy()
    shifted[1::2] += 2.0  # the reference liked the rejected replies more: the policy's margin is +2
    loss, _, stats = dpo_loss_and_grads(cfg, params, PairBatch(*batch, shifted), beta=0.5)
    np.testing.assert_allclose(stats["margin"], 2.0, atol=1e-12)
    assert float(loss) == pytest.approx(np.log1p(np.exp(-1.0)), rel=1e-12)
    np.testing.assert_array_equal(stats["chosen_logp"], own[0::2])


def test_bad_batches_are_named() -> None:
    cfg = preset("tiny")
    params = gradcheck_params(cfg, seed=0)
    tokens, targets, mask = pair_batch(cfg, 1, 5, seed=0)
    with pytest.raises(ValueError, match="even number of rows"):
        dpo_loss_and_grads(cfg, params, PairBatch(tokens[:1], targets[:1], mask[:1], np.zeros(1)))
    with pytest.raises(ValueError, match="targets and mask must have the tokens' shape"):
        dpo_loss_and_grads(cfg, params, PairBatch(tokens, targets[:, :3], mask, np.zeros(2)))


def test_dpo_equals_pytorch_autograd_on_the_exported_llama(tmp_path) -> None:
    """The exported model in transformers (float64, with the parts transformers keeps in float32 made
    float64), the DPO loss written with torch ops, autograd's gradients: euler's loss and every exported
    gradient agree to float64 rounding."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = preset("tiny")
    params = gradcheck_params(cfg, seed=5)
    batch = pair_batch(cfg, 2, 8, seed=6)
    ref = reference(cfg, params, batch, seed=7)
    beta = 0.3
    loss, grads, _ = dpo_loss_and_grads(cfg, params, PairBatch(*batch, ref), beta=beta)
    save_hf(cfg, params, tmp_path / "model", dtype=np.float64)
    save_hf(cfg, grads, tmp_path / "grads", dtype=np.float64)  # the gradients, named as the weights are
    model = transformers.LlamaForCausalLM.from_pretrained(
        tmp_path / "model", torch_dtype=torch.float64, attn_implementation="sdpa"
    )
    d = cfg.head_dim
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)

    def rope_float64(x, position_ids):  # transformers makes its tables in float32 whatever the dtype
        angles = torch.cat([position_ids[..., None].double() * inv_freq] * 2, dim=-1)  # (B, T, D)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    model.model.rotary_emb.forward = rope_float64

    def rms_float64(x, m):  # its RMSNorm statistics too (and the eager attention's softmax: SDPA instead)
        return m.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.variance_epsilon)

    for module in model.modules():
        if type(module).__name__ == "LlamaRMSNorm":
            module.forward = lambda x, m=module: rms_float64(x, m)
    tokens, targets, mask = (torch.from_numpy(a) for a in batch)
    logp = torch.log_softmax(model(tokens).logits, dim=-1).gather(-1, targets[..., None])[..., 0]
    logps = (logp * mask).sum(-1)
    rewards = logps - torch.from_numpy(ref)
    theirs = torch.nn.functional.softplus(-beta * (rewards[0::2] - rewards[1::2])).mean()
    theirs.backward()
    assert float(theirs.detach()) == pytest.approx(float(loss), rel=1e-12)
    want = load_file(str(tmp_path / "grads" / "model.safetensors"))
    for name, p in model.named_parameters():
        got = p.grad.numpy()
        worst = np.abs(got - want[name]).max() / np.abs(want[name]).max()
        assert worst < 1e-10, name


def test_a_few_dpo_steps_raise_the_margins_of_training_and_held_out_pairs() -> None:
    """AdamW on the hand-written gradient: the loss falls and the chosen replies gain on the rejected ones,
    on the pairs trained and on held-out pairs that share their pattern (reply token 1 preferred to 2)."""
    from euler_kernels.optim.adamw import adamw_update
    from euler_model import init_params

    cfg = preset("tiny")
    params = init_params(cfg, seed=0, dtype=np.float64)
    ref_params = {k: v.copy() for k, v in params.items()}

    def pairs(seed: int, n: int = 8, t: int = 8):
        rng = np.random.default_rng(seed)
        tokens = np.repeat(rng.integers(3, cfg.vocab_size, (n, 1, t)), 2, axis=1).reshape(2 * n, t)
        tokens[0::2, t // 2 :], tokens[1::2, t // 2 :] = 1, 2  # chosen replies say 1, rejected ones 2
        targets = np.concatenate([tokens[:, 1:], tokens[:, -1:]], axis=1)
        mask = np.zeros((2 * n, t))
        mask[:, t // 2 - 1 : -1] = 1.0
        return PairBatch(tokens, targets, mask, sequence_logprobs(cfg, ref_params, tokens, targets, mask))

    train, held_out = pairs(0), pairs(1)
    m, v = ({k: np.zeros_like(p) for k, p in params.items()} for _ in range(2))
    first = None
    for step in range(1, 31):
        loss, grads, _ = dpo_loss_and_grads(cfg, params, train, beta=0.5)
        first = float(loss) if first is None else first
        for k in params:
            adamw_update(params[k], m[k], v[k], grads[k], step, lr=3e-3)
    last, _, stats = dpo_loss_and_grads(cfg, params, train, beta=0.5)
    _, _, held = dpo_loss_and_grads(cfg, params, held_out, beta=0.5)
    assert first == pytest.approx(np.log(2.0)) and float(last) < 0.5 * first
    assert (stats["margin"] > 0).all() and (held["margin"] > 0).mean() >= 0.75


@pytest.mark.gpu
@pytest.mark.parametrize("matmul, tol", [("fp32", 1e-4), ("tf32", 1e-2), ("bf16", 3e-2)])
def test_the_gpu_dpo_loss_and_gradient_equal_the_float64_ones(matmul, tol) -> None:
    """The GPU path (float32 CuPy weights, the fused attention kernel at head_dim 64) against the float64
    NumPy loss and gradient that the central differences above prove: every parameter tensor within the
    precision's rounding (relative to the tensor's norm)."""
    cp = pytest.importorskip("cupy")
    cfg = preset("tiny", dim=128, n_heads=2, n_kv_heads=1, context=32)
    params = gradcheck_params(cfg, seed=5)
    batch = pair_batch(cfg, 4, 24, seed=6)
    ref = reference(cfg, params, batch, seed=7)
    want_loss, want, want_stats = dpo_loss_and_grads(cfg, params, PairBatch(*batch, ref), beta=0.5)
    on_gpu = {k: cp.asarray(v, dtype=cp.float32) for k, v in params.items()}
    gpu_batch = PairBatch(*(cp.asarray(a) for a in batch[:2]), cp.asarray(batch[2], dtype=cp.float32),
                          cp.asarray(ref))  # fmt: skip
    loss, grads, stats = dpo_loss_and_grads(cfg, on_gpu, gpu_batch, beta=0.5, precision=ek.Precision(matmul))
    assert float(loss) == pytest.approx(float(want_loss), rel=tol)
    np.testing.assert_allclose(stats["margin"].get(), want_stats["margin"], rtol=tol, atol=tol)
    for name, w in want.items():
        err = np.linalg.norm(grads[name].get().astype(np.float64) - w)
        assert err <= tol * max(np.linalg.norm(w), 1e-12), (name, err / max(np.linalg.norm(w), 1e-12))
