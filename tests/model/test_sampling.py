"""The sampling helpers on hand-made logits."""

from __future__ import annotations

import numpy as np

from tests.model.host_sampling import apply_repetition_penalty, choose_token, filter_top_k, filter_top_p


def test_top_k_keeps_the_k_largest() -> None:
    z = np.array([0.1, 2.0, -1.0, 1.5, 0.0])
    out = filter_top_k(z, 2)
    assert np.isfinite(out).tolist() == [False, True, False, True, False]
    np.testing.assert_array_equal(filter_top_k(z, None), z)


def test_top_p_keeps_the_smallest_nucleus() -> None:
    p = np.array([0.1, 0.4, 0.2, 0.3])
    out = filter_top_p(p, 0.65)  # 0.4 + 0.3 = 0.7 >= 0.65
    np.testing.assert_allclose(out, [0, 0.4 / 0.7, 0, 0.3 / 0.7])
    np.testing.assert_allclose(filter_top_p(p, 0.01), [0, 1, 0, 0])


def test_repetition_penalty_lowers_seen_tokens() -> None:
    z = np.array([3.0, -1.0, 3.0])
    out = apply_repetition_penalty(z, [0, 1, 0], 1.5)
    np.testing.assert_allclose(out, [2.0, -1.5, 3.0])
    assert choose_token(z, [0], np.random.default_rng(0), temperature=0.0, repetition_penalty=1.5) == 2


def test_sampling_follows_the_distribution() -> None:
    rng = np.random.default_rng(0)
    z = np.log(np.array([0.5, 0.3, 0.2]))
    draws = np.array([choose_token(z, [], rng) for _ in range(4000)])
    freq = np.bincount(draws, minlength=3) / len(draws)
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.2], atol=0.03)
    hot = np.array([choose_token(z, [], rng, temperature=0.25) for _ in range(2000)])
    assert (hot == 0).mean() > 0.8  # low temperature sharpens towards the argmax
