"""Generation: the prefill's keys in the decode layout, decoding against full recomputation, sampling
options, speculative decoding."""

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek
from euler_kernels.optim.adamw import adamw_update
from euler_model import GenerationStats, generate, init_params, logits, loss_and_grads, preset
from euler_model.decode_batch import Decoder
from euler_model.model import rope_for, trunk_forward
from euler_model.sampling import Picker
from tests.model.host_sampling import choose_token


def naive_greedy(cfg, params, prompt, n, penalty=1.0):
    """Greedy decoding that recomputes the full forward over the whole sequence at every step."""
    seq = list(prompt)
    for _ in range(n):
        z = logits(cfg, params, np.array([seq]))[0, -1].astype(np.float64)
        seen = np.unique(seq)
        z[seen] = np.where(z[seen] > 0, z[seen] / penalty, z[seen] * penalty)
        seq.append(int(np.argmax(z)))
    return seq[len(prompt) :]


def scaled_params(cfg, seed, dtype=np.float64, scale=8.0):
    """Random weights large enough that the logits are far from uniform (no near-ties)."""
    p = init_params(cfg, seed=seed, dtype=dtype)
    return {k: (v if k.endswith("norm") else v * scale) for k, v in p.items()}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_prefill_writes_each_prompts_keys_into_its_rows_of_the_decode_cache(dtype) -> None:
    """Two prompt lengths in three rows: each row's first-layer keys and values are those of its prompt
    alone (the norm, the projection and RoPE at positions 0..T-1), in the (Hkv, S, D) layout the decode
    steps read; the slots after the prompt stay empty."""
    cfg = preset("tiny")
    params = scaled_params(cfg, 0, dtype)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (3, 5, 5)]
    decoder = Decoder(cfg, params, 3, Picker(), None, False, ek.EXACT)
    decoder.begin([(prompt, 0, set(), 0) for prompt in prompts])  # limit 0: no token recorded
    state = decoder.state
    cos, sin = rope_for(cfg, params["embed"])
    hkv, d = cfg.n_kv_heads, cfg.head_dim
    tol = 1e-12 if dtype == np.float64 else 2e-5
    for row, prompt in enumerate(prompts):
        t = len(prompt)
        x = params["embed"][prompt]  # (T, C): the first layer's input
        h = ek.rmsnorm_forward(x, params["layers.0.attn_norm"], cfg.norm_eps)[0]
        k = ek.rope_forward((h @ params["layers.0.wk"].T).reshape(1, t, hkv, d), cos, sin)[0][0]
        v = (h @ params["layers.0.wv"].T).reshape(t, hkv, d)
        np.testing.assert_allclose(state.k[0, row, :, :t], k.transpose(1, 0, 2), rtol=tol, atol=tol)
        np.testing.assert_allclose(state.v[0, row, :, :t], v.transpose(1, 0, 2), rtol=tol, atol=tol)
        assert not state.k[:, row, :, t:].any() and not state.v[:, row, :, t:].any()


def plain_reference(
    cfg,
    params,
    prompt,
    n,
    temperature=1.0,
    top_k=None,
    top_p=None,
    repetition_penalty=1.0,
    stop_tokens=(),
    seed=None,
) -> list[int]:
    """One token at a time with no cache at all: the training forward over the whole sequence for each
    token, choose_token on the host with one rng draw per sampled token (the oracle that generate and
    generate_batch must equal)."""
    rng = np.random.default_rng(seed)
    kw = {
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "repetition_penalty": repetition_penalty,
    }
    history, out = list(prompt), []
    while len(out) < n and len(history) < cfg.context:
        h = trunk_forward(cfg, params, np.asarray([history]))[0][:, -1]  # (1, C)
        z = ek.to_numpy(ek.linear_forward(h, params["heads.0"])[0])[0]
        token = choose_token(z, history, rng, **kw)
        if token in stop_tokens:
            break
        history.append(token)
        out.append(token)
    return out


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_generate_equals_the_per_token_reference(dtype, seed) -> None:
    """Greedy, sampled (every filter), with a stop token and to the end of the context."""
    cfg = preset("tiny")
    params = scaled_params(cfg, seed, dtype, scale=3.0)
    prompt = np.random.default_rng(seed).integers(0, cfg.vocab_size, 4).tolist()
    for kw in (
        {"temperature": 0.0},
        {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "repetition_penalty": 1.3, "seed": seed},
        {"temperature": 1.2, "seed": seed + 10},
    ):
        free = plain_reference(cfg, params, prompt, 30, **kw)  # 12 tokens: the context ends it
        assert len(free) == cfg.context - len(prompt)
        assert list(generate(cfg, params, prompt, 30, **kw)) == free
        stop = [free[5]]
        want = plain_reference(cfg, params, prompt, 30, stop_tokens=stop, **kw)
        assert (
            list(generate(cfg, params, prompt, 30, stop_tokens=stop, **kw))
            == want
            == free[: free.index(stop[0])]
        )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cached_greedy_equals_recomputed_greedy(seed) -> None:
    cfg = preset("tiny")
    params = scaled_params(cfg, seed)
    prompt = [3, 1, 4, 1, 5]
    stats = GenerationStats()
    out = list(generate(cfg, params, prompt, 9, temperature=0.0, stats=stats))
    assert out == naive_greedy(cfg, params, prompt, 9)
    assert stats.generated == 9 and stats.forwards == 9  # prompt forward + one per further token
    penalised = list(generate(cfg, params, prompt, 9, temperature=0.0, repetition_penalty=1.8))
    assert penalised == naive_greedy(cfg, params, prompt, 9, penalty=1.8)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_speculative_greedy_equals_plain_greedy_random_model(seed, dtype) -> None:
    cfg = preset("tiny", n_mtp_heads=1 + seed % 3 + 1)
    params = scaled_params(cfg, seed, dtype)
    prompt = list(np.random.default_rng(seed).integers(0, cfg.vocab_size, 3))
    n = cfg.context - len(prompt)  # run to the end of the context
    plain = list(generate(cfg, params, prompt, n, temperature=0.0))
    stats = GenerationStats()
    spec = list(
        generate(
            cfg,
            params,
            prompt,
            n,
            temperature=0.0,
            speculative=True,
            stats=stats,
            draft_tree=tuple(range(cfg.n_mtp_heads - 1)),
        )
    )
    assert spec == plain and len(plain) == n
    assert stats.drafted > 0 and 0 <= stats.accepted <= stats.drafted


def train_on_cycle(cfg, steps=150, seed=0):
    """A tiny model trained to continue (start + i) % 11: every head can learn its token exactly."""
    params = init_params(cfg, seed=seed)
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(p) for k, p in params.items()}
    rng = np.random.default_rng(seed)
    t, extra = 12, cfg.n_mtp_heads - 1
    for step in range(1, steps + 1):
        seq = (rng.integers(0, 11, (8, 1)) + np.arange(t + 1 + extra)) % 11
        loss, grads = loss_and_grads(cfg, params, seq[:, :t], seq[:, 1:])
        for k in params:
            adamw_update(params[k], m[k], v[k], grads[k], step, lr=1e-2)
    return params, loss


@pytest.fixture(scope="module")
def trained():
    cfg = preset("tiny")
    params, loss = train_on_cycle(cfg)
    return cfg, params, loss


def test_speculative_greedy_equals_plain_greedy_trained_model(trained) -> None:
    cfg, params, loss = trained
    assert loss < 0.5  # it did learn the cycle
    prompt = [4, 5, 6]
    plain = list(generate(cfg, params, prompt, 12, temperature=0.0))
    assert plain == [(7 + i) % 11 for i in range(12)]
    stats = GenerationStats()
    chain = tuple(range(cfg.n_mtp_heads - 1))  # every drafting head
    spec = list(
        generate(cfg, params, prompt, 12, temperature=0.0, speculative=True, stats=stats, draft_tree=chain)
    )
    assert spec == plain
    assert stats.acceptance_rate > 0.8 and stats.tokens_per_forward > 2.5  # drafts mostly right


@pytest.mark.parametrize(
    "kw",
    [
        {"temperature": 1.0, "seed": 9},
        {"temperature": 2.5, "seed": 3},
        {"temperature": 1.5, "top_k": 4, "top_p": 0.9, "seed": 5},
        {"temperature": 1.5, "repetition_penalty": 1.6, "seed": 1},
        {"temperature": 0.0, "repetition_penalty": 1.6},
    ],
)
def test_speculative_sampling_emits_plain_samplings_tokens_draw_for_draw(trained, kw) -> None:
    """The j-th token takes the j-th draw whether it came from a plain step or an accepted draft, and the
    repetition penalty sees the drafts before a position: speculative tokens are plain decoding's."""
    cfg, params, _ = trained
    noisy = {k: v + 0.02 * np.random.default_rng(0).standard_normal(v.shape) for k, v in params.items()}
    for p in (params, noisy):
        plain = list(generate(cfg, p, [4, 5, 6], 30, **kw))
        for tree in [None, (0,), (0, 1)]:
            stats = GenerationStats()
            assert (
                list(generate(cfg, p, [4, 5, 6], 30, speculative=True, stats=stats, draft_tree=tree, **kw))
                == plain
            )
            assert stats.drafted > 0
    stats = GenerationStats()
    list(generate(cfg, params, [4, 5, 6], 30, speculative=True, stats=stats, **kw))
    if kw["temperature"] <= 1.0 and "repetition_penalty" not in kw:
        assert stats.acceptance_rate > 0.5  # the trained model's drafts are mostly sampled again


def test_a_branching_draft_tree_is_greedy_only(trained) -> None:
    cfg, params, _ = trained
    with pytest.raises(
        ValueError, match=r"generate: a draft tree with branches \(\(0, 0\)\) decodes greedily"
    ):
        generate(cfg, params, [1, 2], 4, temperature=1.0, speculative=True, draft_tree=(0, 0))


def test_speculative_sampling_is_reproducible_and_top_k_1_is_greedy(trained) -> None:
    cfg, params, _ = trained
    greedy = list(generate(cfg, params, [1, 2], 10, temperature=0.0))
    top1 = list(generate(cfg, params, [1, 2], 10, temperature=1.3, top_k=1, seed=5, speculative=True))
    assert top1 == greedy
    a = list(generate(cfg, params, [1, 2], 10, temperature=1.0, seed=9, speculative=True))
    b = list(generate(cfg, params, [1, 2], 10, temperature=1.0, seed=9, speculative=True))
    assert a == b


def softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


@pytest.mark.slow
def test_speculative_sampling_has_the_distribution_of_plain_sampling(trained) -> None:
    """The second sampled token: exact marginal from head 0 vs the frequencies of speculative sampling."""
    cfg, params, _ = trained
    prompt, temp, n = [4, 5, 6], 2.5, 1500
    first = softmax(logits(cfg, params, np.array([prompt]))[0, -1] / temp)  # (V,)
    nxt = logits(cfg, params, np.array([[*prompt, t] for t in range(cfg.vocab_size)]))[:, -1] / temp
    exact = first @ np.stack([softmax(z) for z in nxt])  # sum over t1 of p(t1) p(t2 | t1)
    stats = GenerationStats()
    seen = np.zeros(cfg.vocab_size)
    for seed in range(n):
        out = generate(
            cfg,
            params,
            prompt,
            3,  # so that token 2 can come from an accepted draft
            temperature=temp,
            seed=seed,
            speculative=True,
            stats=stats,
        )
        seen[list(out)[1]] += 1
    assert stats.acceptance_rate > 0.2  # drafts were really accepted along the way
    top = np.argsort(-exact)[:4]
    groups = [*top, None]  # the 4 likeliest tokens and everything else
    for g in groups:
        p = exact[top].sum() if g is None else exact[g]
        f = seen[top].sum() if g is None else seen[g]
        p, f = (1 - p, n - f) if g is None else (p, f)
        assert abs(f / n - p) < 4.5 * np.sqrt(p * (1 - p) / n) + 1e-3, (g, f / n, p)


def test_sampling_is_seeded_and_respects_top_k_top_p() -> None:
    cfg = preset("tiny")
    params = scaled_params(cfg, 4)
    runs = [list(generate(cfg, params, [1, 2, 3], 12, temperature=1.0, seed=s)) for s in (7, 7, 8)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    greedy = list(generate(cfg, params, [1, 2, 3], 12, temperature=0.0))
    assert list(generate(cfg, params, [1, 2, 3], 12, temperature=2.0, top_k=1, seed=1)) == greedy
    assert list(generate(cfg, params, [1, 2, 3], 12, temperature=2.0, top_p=1e-9, seed=1)) == greedy


def test_stop_tokens_max_tokens_and_context_limit() -> None:
    cfg = preset("tiny")
    params = scaled_params(cfg, 5)
    greedy = list(generate(cfg, params, [1, 2, 3], 13, temperature=0.0))
    assert len(greedy) == 13  # 3 + 13 = the context length 16
    assert len(list(generate(cfg, params, [1, 2, 3], 100, temperature=0.0))) == 13
    stop = greedy[4]
    cut = list(generate(cfg, params, [1, 2, 3], 13, temperature=0.0, stop_tokens=[stop]))
    assert cut == greedy[: greedy.index(stop)]  # the stop token itself is not yielded
    assert list(generate(cfg, params, [1, 2, 3], 0)) == []


def test_generation_is_streaming() -> None:
    cfg = preset("tiny")
    params = scaled_params(cfg, 6)
    stats = GenerationStats()
    stream = generate(cfg, params, [1, 2, 3], 10, temperature=0.0, stats=stats)
    assert stats.forwards == 0  # nothing computed before the first token is asked for
    first = next(stream)
    assert stats.forwards == 1 and isinstance(first, int)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prompt_ids": []}, "prompt needs"),
        ({"prompt_ids": [64]}, r"prompt ids must be in \[0, 64\)"),
        ({"prompt_ids": list(range(16))}, "prompt needs"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 1.5}, "top_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ],
)
def test_bad_arguments_raise_at_once(kwargs, message) -> None:
    cfg = preset("tiny")
    args = {"prompt_ids": [1, 2], "max_new_tokens": 3} | kwargs
    with pytest.raises(ValueError, match=message):
        generate(cfg, init_params(cfg), **args)
