"""Forward values against plain reference formulas in float64, and float32 against float64."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import euler_kernels as ek
from euler_kernels.testing import attention_shapes, head_dims, normal_arrays, shapes


def naive_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = True) -> np.ndarray:
    """softmax(q k^T / sqrt(D)) v head by head, kv head h // G for query head h, query i at S - T + i."""
    b, t, hq, d = q.shape
    s, hkv = k.shape[1], k.shape[2]
    out = np.zeros_like(q)
    for bi in range(b):
        for h in range(hq):
            kv = h // (hq // hkv)
            scores = q[bi, :, h] @ k[bi, :, kv].T / np.sqrt(d)  # (T, S)
            if causal:
                scores[np.arange(s)[None, :] > (s - t + np.arange(t))[:, None]] = -np.inf
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[bi, :, h] = (p / p.sum(axis=1, keepdims=True)) @ v[bi, :, kv]
    return out


@given(data=st.data(), shape=attention_shapes(max_len=10), causal=st.booleans(),
       block=st.sampled_from([1, 3, 4, 128]))  # fmt: skip
def test_attention_matches_naive_softmax(data, shape, causal, block) -> None:
    q, k, v = (data.draw(normal_arrays(s)) for s in (shape.q, shape.kv, shape.kv))
    out, _ = ek.attention_forward(q, k, v, causal=causal, block_size=block)
    np.testing.assert_allclose(out, naive_attention(q, k, v, causal), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("hq,hkv", [(1, 1), (4, 4), (4, 1), (6, 2)])
def test_attention_head_layouts(hq: int, hkv: int) -> None:
    rng = np.random.default_rng(hq * 10 + hkv)
    q, k, v = (
        rng.standard_normal((2, 7, hq, 8)),
        rng.standard_normal((2, 7, hkv, 8)),
        rng.standard_normal((2, 7, hkv, 8)),
    )
    out, _ = ek.attention_forward(q, k, v, block_size=3)
    np.testing.assert_allclose(out, naive_attention(q, k, v), rtol=1e-12, atol=1e-12)


def test_attention_matches_torch_sdpa() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    q, k, v = (
        rng.standard_normal((2, 9, 4, 8)),
        rng.standard_normal((2, 9, 2, 8)),
        rng.standard_normal((2, 9, 2, 8)),
    )
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(a).transpose(1, 2) for a in (q, k, v)), is_causal=True, enable_gqa=True
    ).transpose(1, 2)
    np.testing.assert_allclose(
        ek.attention_forward(q, k, v, block_size=4)[0], ref.numpy(), rtol=1e-10, atol=1e-12
    )


def test_attention_peak_memory_is_one_block_per_head() -> None:
    # T = S = 1024: one full (T, T) score matrix would be 8 MiB in float64; a 64 x 64 block is 32 KiB,
    # and the O(T * D) arrays (q, k, v, out, their gradients) are 128 KiB each
    rng = np.random.default_rng(0)
    t, d = 1024, 16
    q, k, v = (rng.standard_normal((1, t, 1, d)) for _ in range(3))
    tracemalloc.start()
    out, cache = ek.attention_forward(q, k, v, block_size=64)
    _, peak_fwd = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    ek.attention_backward(np.ones_like(out), cache)
    _, peak_bwd = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    full_scores = t * t * 8
    assert peak_fwd < full_scores / 4 and peak_bwd < full_scores / 4, (peak_fwd, peak_bwd)


def test_attention_block_size_does_not_change_result() -> None:
    rng = np.random.default_rng(1)
    q, k, v = (
        rng.standard_normal((2, 37, 4, 8)),
        rng.standard_normal((2, 45, 2, 8)),
        rng.standard_normal((2, 45, 2, 8)),
    )
    dout = rng.standard_normal(q.shape)
    ref_out, ref_cache = ek.attention_forward(q, k, v, block_size=1000)
    ref_grads = ek.attention_backward(dout, ref_cache)
    for block in (1, 5, 16):
        out, cache = ek.attention_forward(q, k, v, block_size=block)
        np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-13)
        for g, ref in zip(ek.attention_backward(dout, cache), ref_grads):
            np.testing.assert_allclose(g, ref, rtol=1e-11, atol=1e-12)


@given(data=st.data(), shape=shapes(1, 3, 6), eps=st.sampled_from([1e-5, 1e-6, 0.0]))
def test_rmsnorm_formula(data, shape, eps) -> None:
    x, w = data.draw(normal_arrays(shape)), data.draw(normal_arrays(shape[-1:]))
    ref = x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + eps) * w
    np.testing.assert_allclose(ek.rmsnorm_forward(x, w, eps=eps)[0], ref, rtol=1e-12, atol=1e-12)


@given(data=st.data(), lead=shapes(1, 3, 4), c_in=st.integers(1, 5), c_out=st.integers(1, 5))
def test_linear_formula(data, lead, c_in, c_out) -> None:
    x, w = data.draw(normal_arrays((*lead, c_in))), data.draw(normal_arrays((c_out, c_in)))
    ref = np.einsum("...i,oi->...o", x, w)  # out = x @ weight.T, weight (C_out, C_in)
    np.testing.assert_allclose(ek.linear_forward(x, w)[0], ref, rtol=1e-12, atol=1e-12)


@given(data=st.data(), shape=shapes(1, 3, 6))
def test_swiglu_formula(data, shape) -> None:
    g, u = data.draw(normal_arrays(shape, scales=(0.1, 1.0, 10.0))), data.draw(normal_arrays(shape))
    ref = g / (1.0 + np.exp(-g)) * u
    out, cache = ek.swiglu_forward(g, u)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-300)
    d = data.draw(normal_arrays(shape))  # the backward's product=True hands the forward's output back
    *grads, again = ek.swiglu_backward(d, cache, product=True)
    np.testing.assert_array_equal(again, out)
    for got, want in zip(grads, ek.swiglu_backward(d, cache)):
        np.testing.assert_array_equal(got, want)


def test_embedding_is_row_lookup_and_backward_counts_repeats() -> None:
    w = np.arange(12.0).reshape(4, 3)
    tokens = np.array([[3, 0, 3], [1, 1, 1]])
    out, cache = ek.embedding_forward(w, tokens)
    assert out.shape == (2, 3, 3) and np.array_equal(out[0, 0], w[3]) and np.array_equal(out[1, 2], w[1])
    dw = ek.embedding_backward(np.ones((2, 3, 3)), cache)
    assert dw[:, 0].tolist() == [1.0, 3.0, 0.0, 2.0]  # token 0 once, 1 three times, 2 never, 3 twice


@given(b=st.integers(1, 2), t=st.integers(1, 5), h=st.integers(1, 3), d=head_dims(8),
       offset=st.integers(0, 9), theta=st.sampled_from([10000.0, 100.0]), data=st.data())  # fmt: skip
def test_rope_matches_hf_rotate_half_and_complex_rotation(b, t, h, d, offset, theta, data) -> None:
    x = data.draw(normal_arrays((b, t, h, d)))
    cos, sin = ek.rope_tables(d, offset + t, theta=theta, dtype=np.float64)
    out, _ = ek.rope_forward(x, cos, sin, offset=offset)
    # HF Llama: x * cat(cos, cos) + rotate_half(x) * cat(sin, sin), rotate_half(x) = cat(-x2, x1)
    c = np.concatenate([cos, cos], axis=-1)[offset : offset + t, None, :]
    s = np.concatenate([sin, sin], axis=-1)[offset : offset + t, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    np.testing.assert_allclose(out, x * c + np.concatenate([-x2, x1], axis=-1) * s, rtol=1e-12, atol=1e-12)
    # the same as multiplying x1 + i x2 by exp(i p theta^(-2j/D)) at position p = offset + t
    pos = np.arange(offset, offset + t)[:, None, None]
    z = (x1 + 1j * x2) * np.exp(1j * pos * theta ** (-np.arange(0, d, 2) / d))
    np.testing.assert_allclose(out, np.concatenate([z.real, z.imag], axis=-1), rtol=1e-10, atol=1e-12)


def _reference_cross_entropy(logits, targets, mask, ignore_index=-100) -> float:
    total, count = 0.0, 0.0
    for row, tgt, m in zip(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), mask.reshape(-1)):
        if tgt == ignore_index or m == 0:
            continue
        total += m * (np.logaddexp.reduce(row) - row[tgt])
        count += m
    return total / max(count, 1.0)


@given(data=st.data(), n=st.integers(1, 6), v=st.integers(2, 12), scale=st.sampled_from([1.0, 30.0, 1e4]))
def test_cross_entropy_formula(data, n, v, scale) -> None:
    logits = data.draw(normal_arrays((n, v), scales=(scale,)))
    targets = np.array(data.draw(st.lists(st.sampled_from([*range(v), -100]), min_size=n, max_size=n)))
    mask = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n)))
    loss, _ = ek.cross_entropy_forward(logits, targets, mask)
    assert loss.shape == () and loss.dtype == np.float64
    np.testing.assert_allclose(
        float(loss), _reference_cross_entropy(logits, targets, mask), rtol=1e-12, atol=1e-12
    )


def _block_inputs(rng: np.random.Generator) -> dict[str, tuple]:
    cos, sin = ek.rope_tables(8, 16, dtype=np.float64)
    r = rng.standard_normal
    return {
        "rmsnorm": (ek.rmsnorm_forward, ek.rmsnorm_backward, (r((2, 5, 8)), r(8))),
        "linear": (ek.linear_forward, ek.linear_backward, (r((2, 5, 8)), r((6, 8)))),
        "rope": (ek.rope_forward, ek.rope_backward, (r((2, 5, 3, 8)), cos, sin)),
        "attention": (ek.attention_forward, ek.attention_backward,
                      (r((2, 33, 4, 8)), r((2, 33, 2, 8)), r((2, 33, 2, 8)))),
        "swiglu": (ek.swiglu_forward, ek.swiglu_backward, (r((2, 5, 8)), r((2, 5, 8)))),
        "cross_entropy": (ek.cross_entropy_forward, ek.cross_entropy_backward,
                          (r((2, 5, 11)) * 5, rng.integers(0, 11, (2, 5)))),
        "embedding": (ek.embedding_forward, ek.embedding_backward, (r((11, 4)), rng.integers(0, 11, (2, 5)))),
    }  # fmt: skip


@pytest.mark.parametrize("name", list(_block_inputs(np.random.default_rng(0))))
def test_float32_agrees_with_float64(name: str) -> None:
    fwd, bwd, args = _block_inputs(np.random.default_rng(7))[name]
    out64, cache64 = fwd(*args)
    args32 = [a.astype(np.float32) if a.dtype.kind == "f" else a for a in args]
    out32, cache32 = fwd(*args32)
    assert out32.dtype == np.float32
    np.testing.assert_allclose(out32, out64, rtol=2e-5, atol=2e-5)
    dout = np.random.default_rng(8).standard_normal(out64.shape) if out64.shape else np.float64(1.0)
    g64, g32 = bwd(dout, cache64), bwd(np.asarray(dout, dtype=np.float32), cache32)
    for a, b in zip(g64 if isinstance(g64, tuple) else (g64,), g32 if isinstance(g32, tuple) else (g32,)):
        assert b.dtype == np.float32
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)


@given(data=st.data(), shape=attention_shapes(max_len=12), causal=st.booleans(),
       block=st.sampled_from([2, 5, 128]))  # fmt: skip
def test_attention_float32_tracks_float64(data, shape, causal, block) -> None:
    # the float32 path (the GPU kernels' reference numerics) stays within float32 rounding of float64;
    # absolute slack scales with |dout| |v| |k|, the size of the terms that cancel in dP - delta
    q, k, v = (data.draw(normal_arrays(s)) for s in (shape.q, shape.kv, shape.kv))
    dout = data.draw(normal_arrays(shape.q))
    out64, c64 = ek.attention_forward(q, k, v, causal=causal, block_size=block)
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    out32, c32 = ek.attention_forward(q32, k32, v32, causal=causal, block_size=block)
    np.testing.assert_allclose(out32, out64, rtol=1e-4, atol=1e-5 * np.abs(v).max())
    size = np.abs(dout).max() * np.abs(v).max() * max(np.abs(q).max(), np.abs(k).max(), 1.0)
    grads64 = ek.attention_backward(dout, c64)
    for g32, g64 in zip(ek.attention_backward(dout.astype(np.float32), c32), grads64):
        assert g32.dtype == np.float32
        np.testing.assert_allclose(g32, g64, rtol=1e-3, atol=1e-5 * size)
