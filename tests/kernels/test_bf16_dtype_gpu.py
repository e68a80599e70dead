"""CuPy's own bfloat16 arrays (CuPy 14, ml_dtypes.bfloat16) are taken wherever the ops take bf16 activations
(uint16 arrays of bf16 bit patterns): each op gives the same bits for either."""

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek
from euler_kernels.cuda import cast

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    cupy = pytest.importorskip("cupy")
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="CuPy's bfloat16 comes from ml_dtypes")
    try:
        cupy.zeros(2, dtype=ml_dtypes.bfloat16)
    except Exception as err:  # a CuPy without bfloat16
        pytest.skip(f"this CuPy has no bfloat16 arrays: {err}")
    return cupy


def as_bfloat16(cp, bits):
    """The uint16 bit patterns viewed as CuPy's bfloat16 (the same memory)."""
    import ml_dtypes

    return bits.view(ml_dtypes.bfloat16)


def pair(cp, shape, seed):
    """(uint16 bit patterns, the same values as a bfloat16 array) of random values."""
    x = cp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))
    bits = cast.to_bf16(x)
    return bits, as_bfloat16(cp, bits.copy())


def same(cp, a, b):
    np.testing.assert_array_equal(cp.asnumpy(a), cp.asnumpy(b))


def test_bfloat16_is_bf16_and_views_as_bits(cp):
    bits, typed = pair(cp, (3, 4), 0)
    assert ek.is_bf16(typed) and ek.is_bf16(bits)
    assert not ek.is_bf16(np.zeros(2, np.uint16))
    from euler_kernels.backend import bf16_bits

    view = bf16_bits(typed)
    assert view.dtype == np.uint16 and view.data.ptr == typed.data.ptr
    same(cp, view, bits)


def test_linear_rope_swiglu_and_attention_take_bfloat16(cp):
    x16, x_typed = pair(cp, (32, 64), 1)
    w = cp.asarray(np.random.default_rng(2).standard_normal((48, 64)).astype(np.float32))
    bf16 = ek.Precision("bf16")
    out_bits, cache_bits = ek.linear_forward(x16, w, precision=bf16)
    out_typed, cache_typed = ek.linear_forward(x_typed, w, precision=bf16)
    same(cp, out_bits, out_typed)
    g16, g_typed = pair(cp, (32, 48), 3)
    for got, want in zip(ek.linear_backward(g_typed, cache_typed), ek.linear_backward(g16, cache_bits)):
        same(cp, got, want)

    gate16, gate_typed = pair(cp, (8, 96), 4)
    up16, up_typed = pair(cp, (8, 96), 5)
    same(cp, ek.swiglu_forward(gate_typed, up_typed)[0], ek.swiglu_forward(gate16, up16)[0])

    cos, sin = ek.rope_tables(64, 16, xp=cp)
    r16, r_typed = pair(cp, (2, 16, 3, 64), 6)
    same(cp, ek.rope_forward(r_typed, cos, sin)[0], ek.rope_forward(r16, cos, sin)[0])

    q16, q_typed = pair(cp, (2, 16, 4, 64), 7)
    k16, k_typed = pair(cp, (2, 16, 2, 64), 8)
    v16, v_typed = pair(cp, (2, 16, 2, 64), 9)
    a_bits, c_bits = ek.attention_forward(q16, k16, v16, precision=bf16)
    a_typed, c_typed = ek.attention_forward(q_typed, k_typed, v_typed, precision=bf16)
    same(cp, a_typed, a_bits)
    d16, d_typed = pair(cp, (2, 16, 4, 64), 10)
    for got, want in zip(ek.attention_backward(d_typed, c_typed), ek.attention_backward(d16, c_bits)):
        same(cp, got, want)


def test_cross_entropy_and_decode_linear_take_bfloat16(cp):
    z16, z_typed = pair(cp, (16, 50), 11)
    targets = cp.asarray(np.random.default_rng(12).integers(0, 50, 16))
    same(cp, ek.cross_entropy_forward(z_typed, targets)[0], ek.cross_entropy_forward(z16, targets)[0])
    x = cp.asarray(np.random.default_rng(13).standard_normal((2, 64)).astype(np.float32))
    w16, w_typed = pair(cp, (96, 64), 14)
    same(cp, ek.decode_linear_forward(x, w_typed), ek.decode_linear_forward(x, w16))
