"""Batched generation on the CPU: every row equals the one-prompt generator token for token."""

from __future__ import annotations

import numpy as np
import pytest

from euler_model import GenerationStats, generate, generate_batch, preset
from euler_model.sampling import top_k_rows, top_p_rows
from tests.model.host_sampling import choose_token, filter_top_k, filter_top_p
from tests.model.test_generate import plain_reference, scaled_params, train_on_cycle


def reference(cfg, params, prompts, limits, **kw) -> list[list[int]]:
    """The per-token reference once per prompt (test_generate.plain_reference; generate() itself now
    streams a batch of one, so it is not an independent oracle)."""
    seeds = kw.pop("seeds", [None] * len(prompts))
    return [
        plain_reference(cfg, params, p, n, seed=s, **kw)
        for p, n, s in zip(prompts, limits, seeds, strict=True)
    ]


def random_prompts(cfg, lengths, seed) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, cfg.vocab_size, n).tolist() for n in lengths]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_rows_equal_one_prompt_generation(dtype, seed) -> None:
    cfg = preset("tiny")  # context 16
    params = scaled_params(cfg, seed, dtype)
    prompts = random_prompts(cfg, [5, 1, 12, 15, 3, 2, 5, 3], seed)  # equal lengths prefill together
    limits = [9, 20, 20, 4, 0, 1, 11, 7]  # rows 1-3 and 6 run into the context, row 4 asks for nothing
    stats = GenerationStats()
    out = generate_batch(cfg, params, prompts, limits, temperature=0.0, stats=stats)
    want = reference(cfg, params, prompts, limits, temperature=0.0)
    assert [c.tokens for c in out] == want
    assert [len(t) for t in want] == [9, 15, 4, 1, 0, 1, 11, 7]  # the limits and the context both cut
    assert all(c.stop is None for c in out)
    assert stats.generated == sum(len(t) for t in want) and stats.decode == "eager"
    assert stats.forwards == len(prompts) + max(len(t) for t in want) - 1  # prefills + decode steps


def test_rows_across_attention_windows_equal_one_prompt_generation() -> None:
    """`small` (context 128) reads its cache in windows of 64 slots, then 128, as the rows grow."""
    cfg = preset("small")
    params = scaled_params(cfg, 5, np.float32, scale=3.0)
    prompts = random_prompts(cfg, [60, 5, 70], 5)
    out = generate_batch(cfg, params, prompts, [20, 20, 58], temperature=0.0)
    assert [c.tokens for c in out] == reference(cfg, params, prompts, [20, 20, 58], temperature=0.0)
    assert len(out[2].tokens) == 58  # row 2 ends at the context's last position


def test_stop_tokens_per_row_and_shared(seed=3) -> None:
    cfg = preset("tiny")
    params = scaled_params(cfg, seed)
    prompts = random_prompts(cfg, [4, 6, 2], seed)
    free = reference(cfg, params, prompts, [12] * 3, temperature=0.0)
    stops = [[free[0][3]], [], [free[2][5], free[2][7]]]  # row 0 stops at its 4th token, row 2 at its 6th
    out = generate_batch(cfg, params, prompts, 12, temperature=0.0, stop_tokens=stops)
    for c, row, row_stops, p in zip(out, free, stops, prompts, strict=True):
        assert c.tokens == list(generate(cfg, params, p, 12, temperature=0.0, stop_tokens=row_stops))
        cut = next((i for i, t in enumerate(row) if t in row_stops), None)
        assert c.tokens == row[:cut] and c.stop == (None if cut is None else row[cut])
    shared = generate_batch(cfg, params, prompts, 12, temperature=0.0, stop_tokens=[free[1][2]])
    for c, p in zip(shared, prompts, strict=True):
        assert c.tokens == list(generate(cfg, params, p, 12, temperature=0.0, stop_tokens=[free[1][2]]))
    assert shared[1].stop == free[1][2]


@pytest.mark.parametrize(
    "kw",
    [
        {"temperature": 1.0},
        {"temperature": 0.7, "top_k": 5},
        {"temperature": 1.3, "top_p": 0.8},
        {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "repetition_penalty": 1.5},
        {"temperature": 1.0, "top_k": 1},  # greedy by another road
    ],
)
def test_seeded_sampling_rows_equal_one_prompt_generation(kw) -> None:
    cfg = preset("tiny")
    params = scaled_params(cfg, 0, scale=2.0)  # flatter distributions: sampling has choices to make
    prompts = random_prompts(cfg, [3, 1, 7, 10], 5)
    seeds = [11, 12, 13, 11]  # a seed may repeat: rows draw from their own generators
    out = generate_batch(cfg, params, prompts, [10, 12, 6, 5], seeds=seeds, **kw)
    assert [c.tokens for c in out] == reference(cfg, params, prompts, [10, 12, 6, 5], seeds=seeds, **kw)
    again = generate_batch(cfg, params, prompts, [10, 12, 6, 5], seeds=seeds, **kw)
    assert again == out
    if "top_k" not in kw:  # different seeds give different samples
        other = generate_batch(cfg, params, prompts, [10, 12, 6, 5], seeds=[1, 2, 3, 4], **kw)
        assert [c.tokens for c in other] != [c.tokens for c in out]


def test_a_row_does_not_depend_on_the_other_rows() -> None:
    cfg = preset("tiny")
    params = scaled_params(cfg, 4, scale=2.0)
    prompts = random_prompts(cfg, [2, 9, 4], 7)
    kw = {"temperature": 1.0, "top_p": 0.95}
    together = generate_batch(cfg, params, prompts, 8, seeds=[5, 6, 7], **kw)
    alone = [generate_batch(cfg, params, [p], 8, seeds=[s], **kw)[0] for p, s in zip(prompts, [5, 6, 7])]
    assert together == alone


def test_a_trained_model_continues_its_cycle_in_every_row() -> None:
    cfg = preset("tiny")
    params, loss = train_on_cycle(cfg)
    assert loss < 0.5
    prompts = [[4, 5, 6], [0], [8, 9, 10, 0, 1]]
    out = generate_batch(cfg, params, prompts, [12, 14, 10], temperature=0.0)
    assert [c.tokens for c in out] == reference(cfg, params, prompts, [12, 14, 10], temperature=0.0)
    assert out[0].tokens == [(7 + i) % 11 for i in range(12)]
    assert out[2].tokens == [(2 + i) % 11 for i in range(10)]
    stopped = generate_batch(cfg, params, prompts, 12, temperature=0.0, stop_tokens=[[9], [3], [5]])
    assert [c.tokens for c in stopped] == [[7, 8], [1, 2], [2, 3, 4]]
    assert [c.stop for c in stopped] == [9, 3, 5]


def test_choose_token_draws_what_numpy_choice_draws() -> None:
    """The inverse-CDF rule is NumPy's Generator.choice(p=...) with one draw: a seed samples what it did
    before sampling worked on rows."""
    for seed in range(200):
        z = np.random.default_rng(seed).standard_normal(40) * 3
        probs = np.exp(z - z.max())
        old = np.random.default_rng(seed + 1).choice(40, p=probs / probs.sum())
        assert choose_token(z, [], np.random.default_rng(seed + 1)) == old
    with pytest.raises(ValueError, match="not finite"):
        choose_token(np.array([0.0, np.nan, 1.0]), [], np.random.default_rng(0))


def test_row_filters_equal_the_one_row_filters() -> None:
    rng = np.random.default_rng(1)
    z = rng.standard_normal((5, 30))
    z[2, :4] = 1.5  # ties at the top-k boundary are kept
    probs = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    for k in (1, 3, 30):
        np.testing.assert_array_equal(top_k_rows(z, k), np.stack([filter_top_k(r, k) for r in z]))
    for p in (0.1, 0.5, 0.99):
        np.testing.assert_array_equal(top_p_rows(probs, p), np.stack([filter_top_p(r, p) for r in probs]))
    assert np.isfinite(top_k_rows(z, 3)[2]).sum() == 4


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prompts": []}, "no prompts"),
        ({"prompts": [[1], []]}, "prompt 1 needs"),
        ({"prompts": [[1], [64]]}, r"prompt 1 ids must be in \[0, 64\)"),
        ({"max_new_tokens": [3]}, r"one per prompt \(2\)"),
        ({"max_new_tokens": -1}, "ints >= 0"),
        ({"seeds": [1, 2, 3]}, "seeds needs"),
        ({"stop_tokens": [[1], [2], [3]]}, "stop_tokens needs"),
        ({"top_p": 0.0}, "top_p"),
    ],
)
def test_bad_arguments_raise(kwargs, message) -> None:
    cfg = preset("tiny")
    args = {"prompts": [[1, 2], [3]], "max_new_tokens": 3} | kwargs
    with pytest.raises(ValueError, match=message):
        generate_batch(cfg, scaled_params(cfg, 0), **args)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("seed", [0, 1])
def test_speculative_rows_equal_plain_greedy(dtype, seed) -> None:
    """Random weights (drafts mostly rejected): the same tokens, also where the drafts run past the
    context (rows 1-3) and at the limits."""
    cfg = preset("tiny")  # context 16, K = 3: two drafts a step
    params = scaled_params(cfg, seed, dtype)
    prompts = random_prompts(cfg, [5, 1, 12, 15, 3, 2, 5, 3], seed)
    limits = [9, 20, 20, 4, 0, 1, 11, 7]
    stats = GenerationStats()
    out = generate_batch(cfg, params, prompts, limits, temperature=0.0, speculative=True, stats=stats)
    assert [c.tokens for c in out] == reference(cfg, params, prompts, limits, temperature=0.0)
    assert stats.drafted > 0


def test_speculative_steps_accept_a_trained_models_drafts_and_stop_where_plain_stops() -> None:
    cfg = preset("tiny")
    params, loss = train_on_cycle(cfg)
    assert loss < 0.5
    prompts = [[4, 5, 6], [0], [8, 9, 10, 0, 1]]
    plain, fast = GenerationStats(), GenerationStats()
    want = generate_batch(cfg, params, prompts, [12, 14, 10], temperature=0.0, stats=plain)
    chain = {"speculative": True, "draft_tree": (0, 1)}  # both drafting heads, each its best guess
    got = generate_batch(cfg, params, prompts, [12, 14, 10], temperature=0.0, stats=fast, **chain)
    assert got == want
    assert fast.accepted > 0.8 * fast.drafted  # the cycle is easy to guess: nearly every draft is kept
    assert fast.forwards - 3 < 0.5 * (plain.forwards - 3)  # decode steps (after 3 prefills): ~3 tokens each
    stops = [[9], [3], [5]]
    kept = generate_batch(cfg, params, prompts, 12, temperature=0.0, stop_tokens=stops, **chain)
    assert kept == generate_batch(cfg, params, prompts, 12, temperature=0.0, stop_tokens=stops)
    assert [c.stop for c in kept] == [9, 3, 5]


@pytest.mark.parametrize("tree", [(0, 1, 0), (0, 0, 1), (0, 1, 0, 3)])
def test_speculative_rows_with_a_draft_tree_equal_plain_greedy(tree) -> None:
    """Random weights, a tree of drafts (head 1's best and second best): the same tokens as plain greedy."""
    cfg = preset("tiny")
    params = scaled_params(cfg, 3)
    prompts = random_prompts(cfg, [5, 1, 12, 15, 3, 2], 3)
    limits = [9, 20, 20, 4, 1, 11]
    stats = GenerationStats()
    out = generate_batch(cfg, params, prompts, limits, 0.0, speculative=True, draft_tree=tree, stats=stats)
    assert [c.tokens for c in out] == reference(cfg, params, prompts, limits, temperature=0.0)
    assert stats.drafted > 0


def test_a_trained_models_tree_drafts_are_moved_into_place_when_accepted() -> None:
    """Tree (0, 0, 1): fed tokens 1 and 2 are head 1's two best guesses, 3 head 2's after token 1, so an
    accepted path 0 -> 1 -> 3 has its second draft's keys moved from slot p + 3 to p + 2: the tokens stay
    plain greedy's, with most drafts of the easy cycle accepted."""
    cfg = preset("tiny")
    params, _ = train_on_cycle(cfg)
    prompts = [[4, 5, 6], [0], [8, 9, 10, 0, 1]]
    plain, fast = GenerationStats(), GenerationStats()
    want = generate_batch(cfg, params, prompts, [12, 14, 10], temperature=0.0, stats=plain)
    tree = {"speculative": True, "draft_tree": (0, 0, 1)}
    got = generate_batch(cfg, params, prompts, [12, 14, 10], temperature=0.0, stats=fast, **tree)
    assert got == want
    assert fast.accepted > 0.5 * fast.drafted  # two of the three drafts of a step are on the cycle's path
    assert fast.forwards - 3 < 0.5 * (plain.forwards - 3)


@pytest.mark.parametrize(
    ("tree", "message"), [((0, 1, 2), "1 to 2 levels"), ((0, 2), "parents"), ((0, 0, 0, 0, 0), "at most 4")]
)
def test_bad_draft_trees_are_named(tree, message) -> None:
    cfg = preset("tiny")
    with pytest.raises(ValueError, match=message):
        generate_batch(cfg, scaled_params(cfg, 0), [[1, 2]], 4, 0.0, speculative=True, draft_tree=tree)


def test_sampled_speculation_takes_chains_and_one_head_decodes_plainly() -> None:
    cfg = preset("tiny")
    params = scaled_params(cfg, 0)
    with pytest.raises(ValueError, match="decodes greedily only"):
        generate_batch(cfg, params, [[1, 2]], 4, temperature=0.8, speculative=True, draft_tree=(0, 0))
    sampled = generate_batch(cfg, params, [[1, 2], [3]], [9, 7], temperature=0.8, seeds=[1, 2])
    assert generate_batch(cfg, params, [[1, 2], [3]], [9, 7], 0.8, seeds=[1, 2], speculative=True) == sampled
    one = preset("tiny", n_mtp_heads=1)
    p1 = scaled_params(one, 0)
    stats = GenerationStats()
    out = generate_batch(one, p1, [[1, 2]], 4, temperature=0.0, speculative=True, stats=stats)
    assert out == generate_batch(one, p1, [[1, 2]], 4, temperature=0.0) and stats.drafted == 0
