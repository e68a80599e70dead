"""Edge cases: length-1 sequences, KV-cache decode steps, single heads, empty and full masks, huge
values; every result must be defined (no NaN, no warnings)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import euler_kernels as ek
from euler_kernels.gradcheck import gradcheck


def _rand(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def test_attention_single_position_returns_v() -> None:
    q, k, v = _rand(0, 2, 1, 3, 4), _rand(1, 2, 1, 1, 4), _rand(2, 2, 1, 1, 4)
    out, cache = ek.attention_forward(q, k, v)
    np.testing.assert_allclose(out, np.repeat(v, 3, axis=2), rtol=1e-14)
    dq, dk, dv = ek.attention_backward(np.ones_like(out), cache)
    assert np.allclose(dq, 0.0) and np.allclose(dk, 0.0) and np.allclose(dv, 3.0)


@pytest.mark.parametrize("hq,hkv", [(1, 1), (4, 4), (4, 1), (4, 2)])
def test_kv_cache_decode_step_matches_full_sequence(hq: int, hkv: int) -> None:
    # decoding token t with keys 0..t equals row t of attention over the whole sequence
    q, k, v = _rand(3, 1, 9, hq, 8), _rand(4, 1, 9, hkv, 8), _rand(5, 1, 9, hkv, 8)
    full, _ = ek.attention_forward(q, k, v, block_size=4)
    for t in range(9):
        step, _ = ek.attention_forward(q[:, t : t + 1], k[:, : t + 1], v[:, : t + 1], block_size=4)
        np.testing.assert_allclose(step[:, 0], full[:, t], rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("t,s", [(1, 1), (1, 7), (3, 3)])
def test_attention_short_sequences_gradcheck(t: int, s: int) -> None:
    inputs = {
        "q": _rand(6, 2, t, 2, 4),
        "k": _rand(7, 2, s, 1, 4),
        "v": _rand(8, 2, s, 1, 4),
        "block_size": 2,
    }
    gradcheck(ek.attention_forward, ek.attention_backward, inputs).raise_if_bad(1e-6)


def test_rope_offset_equals_slice_of_longer_sequence() -> None:
    x = _rand(9, 2, 10, 3, 6)
    cos, sin = ek.rope_tables(6, 10, dtype=np.float64)
    full, _ = ek.rope_forward(x, cos, sin)
    step, _ = ek.rope_forward(x[:, 7:8], cos, sin, offset=7)
    np.testing.assert_allclose(step, full[:, 7:8], rtol=1e-14)
    assert np.array_equal(ek.rope_forward(x[:, :1], cos, sin)[0], x[:, :1])  # position 0 is no rotation


def _ce(logits, targets, mask=None):
    loss, cache = ek.cross_entropy_forward(logits, targets, mask)
    return loss, ek.cross_entropy_backward(1.0, cache)


def test_cross_entropy_all_zero_mask_is_zero_not_nan() -> None:
    logits, targets = _rand(10, 2, 3, 5), np.array([[1, 2, 3], [0, 4, 4]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss, dlogits = _ce(logits, targets, np.zeros((2, 3)))
        loss_ign, dlogits_ign = _ce(logits, np.full((2, 3), -100))
    assert float(loss) == 0.0 and float(loss_ign) == 0.0
    assert not dlogits.any() and not dlogits_ign.any()


def test_cross_entropy_all_one_mask_equals_no_mask() -> None:
    logits, targets = _rand(11, 2, 3, 5), np.array([[1, 2, 3], [0, 4, 4]])
    loss_m, d_m = _ce(logits, targets, np.ones((2, 3)))
    loss, d = _ce(logits, targets)
    assert float(loss_m) == float(loss)
    np.testing.assert_array_equal(d_m, d)


def test_cross_entropy_mask_and_ignore_index_combine() -> None:
    logits, targets = _rand(12, 4, 6), np.array([1, -100, 3, 5])
    loss, _ = ek.cross_entropy_forward(logits, targets, np.array([1.0, 1.0, 0.0, 1.0]))
    keep = [0, 3]  # position 1 ignored, position 2 masked
    nll = [np.logaddexp.reduce(logits[i]) - logits[i, targets[i]] for i in keep]
    assert float(loss) == pytest.approx(np.mean(nll), rel=1e-13)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_huge_logits_are_stable(dtype) -> None:
    logits = np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4], [1e4, 1e4, -1e4]], dtype=dtype)
    targets = np.array([1, 2, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss, dlogits = _ce(logits, targets)
    # row 0: nll = 2e4; row 1: uniform, log 3; row 2: two tied maxima, log 2
    assert float(loss) == pytest.approx((2e4 + np.log(3) + np.log(2)) / 3, rel=1e-6)
    expected = np.array([[1, -1, 0], [1 / 3, 1 / 3, -2 / 3], [-0.5, 0.5, 0]]) / 3
    np.testing.assert_allclose(dlogits, expected, atol=1e-7)
    assert dlogits.dtype == dtype


def test_swiglu_huge_gates_are_finite_and_warning_free() -> None:
    gate = np.array([-1e4, -100.0, 0.0, 100.0, 1e4], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, cache = ek.swiglu_forward(gate, np.ones(5, dtype=np.float32))
        dgate, dup = ek.swiglu_backward(np.ones(5, dtype=np.float32), cache)
    np.testing.assert_allclose(out, [0.0, 0.0, 0.0, 100.0, 1e4], atol=1e-30)
    np.testing.assert_allclose(dgate, [0.0, 0.0, 0.5, 1.0, 1.0], atol=1e-30)
    assert np.array_equal(dup, out)


def test_rmsnorm_zero_input_is_defined() -> None:
    out, cache = ek.rmsnorm_forward(np.zeros((2, 4)), np.ones(4))
    dx, dw = ek.rmsnorm_backward(np.ones((2, 4)), cache)
    assert not out.any() and np.isfinite(dx).all() and not dw.any()
    np.testing.assert_allclose(dx, 1 / np.sqrt(1e-5))  # at x = 0 the op is x / sqrt(eps)


def test_embedding_single_token() -> None:
    out, cache = ek.embedding_forward(np.eye(3, dtype=np.float32), np.array([[2]]))
    assert out.shape == (1, 1, 3) and out.dtype == np.float32
    assert ek.embedding_backward(np.ones((1, 1, 3), dtype=np.float32), cache)[2].tolist() == [1, 1, 1]


@pytest.mark.slow
def test_attention_long_sequence_gradcheck_sampled() -> None:
    # T = 300 with 128-wide blocks: three query blocks, a partial last block, causal tiles skipped
    q, k, v = _rand(13, 1, 300, 2, 8), _rand(14, 1, 300, 1, 8), _rand(15, 1, 300, 1, 8)
    report = gradcheck(ek.attention_forward, ek.attention_backward, {"q": q, "k": k, "v": v}, max_samples=24)
    assert all(r.checked == 24 for r in report.inputs)
    report.raise_if_bad(1e-6)
