"""The joint q/k/v product on the GPU (qkv.py) and the kernels that read and write heads of a wider row
where they lie: RoPE in place and into columns, the bf16 cast into columns, Hopper attention through strided
tensor maps. Each strided kernel must give the contiguous kernel's bits; the joint op is checked against
float64 on the same bf16-rounded operands, and against the three separate products."""

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek
from euler_kernels.testing import bf16_bits, bf16_values, relative_error
from tests.conftest import cupy_with_a_device

pytestmark = pytest.mark.gpu
cp = cupy_with_a_device()

from euler_kernels.attention.flash_attention import (  # noqa: E402
    flash_attention_backward_bf16,
    flash_attention_forward_bf16,
)
from euler_kernels.cuda import cast  # noqa: E402
from euler_kernels.rope import rope_cuda as rope  # noqa: E402

_HOPPER = cp.cuda.Device().compute_capability.startswith("9")


def joint_rows(rng, b, t, hq, hkv, d, bf16=True):
    """A (B, T, Hq + 2 Hkv, D) array of normal values (bf16 bits, or float32) and its q, k, v head views."""
    values = rng.standard_normal((b, t, hq + 2 * hkv, d)).astype(np.float32)
    rows = cp.asarray(bf16_bits(values) if bf16 else values)
    return rows, (rows[:, :, :hq], rows[:, :, hq : hq + hkv], rows[:, :, hq + hkv :])


@pytest.mark.parametrize("d", [8, 64, 128])  # 8: the kernel reading a value at a time; else 16-byte runs
@pytest.mark.parametrize("bf16", [True, False], ids=["bf16", "float32"])
def test_rope_in_place_on_heads_of_a_wider_row_gives_the_contiguous_bits(d, bf16):
    rng = np.random.default_rng(d)
    b, t, hq, hkv, offset = 2, 37, 4, 2, 5
    _, (q, k, v) = joint_rows(rng, b, t, hq, hkv, d, bf16)
    cos, sin = (cp.asarray(a) for a in ek.rope_tables(d, t + offset, dtype=np.float32))
    want_q, want_k = (rope.rope_rotate(cp.ascontiguousarray(a), cos, sin, offset, 1.0) for a in (q, k))
    v_before = v.copy()
    for a in (q, k):
        assert ek.rope_forward(a, cos, sin, offset, in_place=True)[0] is a
    assert cp.array_equal(q, want_q) and cp.array_equal(k, want_k)
    assert cp.array_equal(v, v_before)  # the heads beside them are left alone


@pytest.mark.parametrize("d", [8, 64])
def test_rope_backward_into_columns_gives_the_contiguous_bits(d):
    """attention's float32 dq rotated back and rounded to bf16 into the joint gradient's q columns."""
    rng = np.random.default_rng(3)
    b, t, hq, hkv = 2, 19, 4, 2
    dq = cp.asarray(rng.standard_normal((b, t, hq, d)).astype(np.float32))
    cos, sin = (cp.asarray(a) for a in ek.rope_tables(d, t, dtype=np.float32))
    _, cache = ek.rope_forward(cp.asarray(bf16_bits(np.ones((b, t, hq, d), np.float32))), cos, sin)
    want = ek.rope_backward(dq, cache)
    drows = cp.zeros((b, t, hq + 2 * hkv, d), cp.uint16)
    out = ek.rope_backward(dq, cache, out=drows[:, :, :hq])
    assert out.dtype == cp.uint16 and cp.array_equal(drows[:, :, :hq], want)
    assert not drows[:, :, hq:].any()


def test_to_bf16_into_columns_gives_the_contiguous_bits():
    rng = np.random.default_rng(4)
    x = cp.asarray(rng.standard_normal((33, 24)).astype(np.float32))
    wide = cp.zeros((33, 40), cp.uint16)
    cast.to_bf16(x, out=wide[:, 8:32])
    assert cp.array_equal(wide[:, 8:32], cast.to_bf16(x))
    assert not wide[:, :8].any() and not wide[:, 32:].any()
    with pytest.raises(ValueError, match="contiguous rows"):
        cast.to_bf16(x, out=cp.zeros((40, 33), cp.uint16).T[:, :24])


@pytest.mark.parametrize("family", ["sm90", "mma"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("b,t,hq,hkv", [(2, 77, 6, 2), (1, 256, 4, 4), (2, 300, 12, 4)])
def test_attention_on_heads_of_one_wider_row_gives_the_contiguous_bits(family, d, b, t, hq, hkv):
    """Hopper's kernels read q, k, v through tensor maps with the row's stride (no copy); the mma.sync kernels
    take C-order copies. Either way out, lse and the gradients keep the contiguous inputs' bits."""
    if family == "sm90" and not _HOPPER:
        pytest.skip("the wgmma kernels need a Hopper GPU")
    rng = np.random.default_rng(t + d)
    _, views = joint_rows(rng, b, t, hq, hkv, d)
    dense = [cp.ascontiguousarray(a) for a in views]
    g16 = cp.asarray(bf16_bits(rng.standard_normal((b, t, hq, d)).astype(np.float32)))
    results = []
    for q, k, v in (views, dense):
        out16, lse = flash_attention_forward_bf16(q, k, v, True, kernel=family)
        grads = flash_attention_backward_bf16(g16, q, k, v, out16, lse, True, kernel=family)
        results.append((out16, lse, *grads))
    for name, got, want in zip(["out", "lse", "dq", "dk", "dv"], *results):
        assert cp.array_equal(got, want), name


def test_stacked_rows_are_copies_made_together():
    rng = np.random.default_rng(6)
    shapes = [(64, 32), (16, 32), (16, 32)]
    wq, wk, wv = (cp.asarray(rng.standard_normal(s), dtype=cp.float32) for s in shapes)
    copies = ek.to_bf16_many([wq, wk, wv])
    joint = ek.stacked_rows(copies)
    assert joint.shape == (96, 32) and joint.data.ptr == copies[0].data.ptr
    assert cp.array_equal(joint, cp.concatenate(copies))
    assert ek.stacked_rows([copies[0], copies[2]]) is None  # not one after another
    assert ek.stacked_rows([cp.asarray(bf16_bits(np.ones((4, 32), np.float32))) for _ in range(2)]) is None


def _separate(h16, w, hq, hkv, bt, cos, sin):
    """q, k, v from three products and RoPE on contiguous arrays: the path without a joint weight."""
    (q, _), (k, _), (v, _) = ek.linear_forward_many(h16, list(w), bf16_out=True)
    b, t = bt
    d = w[0].shape[0] // hq
    q = ek.rope_forward(q.reshape(b, t, hq, d), cos, sin)[0]
    k = ek.rope_forward(k.reshape(b, t, hkv, d), cos, sin)[0]
    return q, k, v.reshape(b, t, hkv, d)


@pytest.mark.parametrize("b,t,c,hq,hkv,d", [(2, 64, 96, 4, 2, 32), (1, 128, 256, 4, 1, 64)])
def test_qkv_on_bf16_copies_matches_float64_and_the_separate_products(b, t, c, hq, hkv, d):
    """Forward and backward of the joint op on to_bf16_many's copies of wq, wk, wv against float64 on the
    same bf16 operands (out and dx are rounded to bf16 once: 2^-8 relative each, bound 1e-2), and against
    the three separate products and RoPE (the same sums in another order)."""
    rng = np.random.default_rng(b * t + c)
    n = b * t
    h = bf16_bits(rng.standard_normal((n, c)).astype(np.float32))
    ws = [(rng.standard_normal((r, c)) * c**-0.5).astype(np.float32) for r in (hq * d, hkv * d, hkv * d)]
    douts = [rng.standard_normal((b, t, m, d)).astype(np.float32) for m in (hq, hkv, hkv)]
    cos32, sin32 = ek.rope_tables(d, t, dtype=np.float32)
    cos, sin = cp.asarray(cos32), cp.asarray(sin32)
    copies = ek.to_bf16_many([cp.asarray(w) for w in ws])
    joint = ek.stacked_rows(copies)
    h16 = cp.asarray(h)
    (q, k, v), cache = ek.qkv_forward(h16, joint, hq, hkv, (b, t), cos, sin, 0, True, False)
    dx, dw = ek.qkv_backward(tuple(cp.asarray(g) for g in douts), cache, x=h16, bf16_dx=True)
    assert dx.dtype == cp.uint16 and dw.dtype == cp.float32 and dw.shape == ((hq + 2 * hkv) * d, c)

    # float64 on the same bf16 operands: the op's own CPU path
    h64, w64 = bf16_values(h).astype(np.float64), bf16_values(joint).astype(np.float64)
    cos64, sin64 = ek.rope_tables(d, t, dtype=np.float64)
    (q64, k64, v64), c64 = ek.qkv_forward(h64, w64, hq, hkv, (b, t), cos64, sin64)
    dx64, dw64 = ek.qkv_backward(tuple(g.astype(np.float64) for g in douts), c64)
    for got, want in [(q, q64), (k, k64), (v, v64), (dx, dx64)]:
        assert relative_error(bf16_values(got), want) < 1e-2
    assert relative_error(dw, dw64) < 1e-2

    sq, sk, sv = _separate(h16, copies, hq, hkv, (b, t), cos, sin)
    for got, want in [(q, sq), (k, sk), (v, sv)]:
        assert relative_error(bf16_values(got), bf16_values(want)) < 1e-2
