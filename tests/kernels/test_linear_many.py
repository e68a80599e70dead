"""linear_forward_many (one input, several projections) and linear_backward's dx_into accumulation."""

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek


def test_forward_many_and_accumulated_backward_equal_separate_calls():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 8))
    weights = [rng.standard_normal((n, 8)) for n in (8, 4, 4)]
    douts = [rng.standard_normal((2, 5, w.shape[0])) for w in weights]
    many = ek.linear_forward_many(x, weights)
    single = [ek.linear_forward(x, w) for w in weights]
    for (out_m, _), (out_s, _) in zip(many, single):
        np.testing.assert_array_equal(out_m, out_s)
    dx, dws = None, []
    for dout, (_, cache) in zip(douts, many):
        dx, dw = ek.linear_backward(dout, cache, dx_into=dx)
        dws.append(dw)
    separate = [ek.linear_backward(dout, cache) for dout, (_, cache) in zip(douts, single)]
    np.testing.assert_allclose(dx, sum(d for d, _ in separate), rtol=1e-12)
    for dw, (_, dw_ref) in zip(dws, separate):
        np.testing.assert_array_equal(dw, dw_ref)


def test_dx_into_is_updated_in_place_and_returned():
    rng = np.random.default_rng(1)
    x, w, dout = rng.standard_normal((3, 6)), rng.standard_normal((4, 6)), rng.standard_normal((3, 4))
    _, cache = ek.linear_forward(x, w)
    into = np.ones((3, 6))
    dx, _ = ek.linear_backward(dout, cache, dx_into=into)
    assert dx is into
    np.testing.assert_allclose(into, 1.0 + dout @ w, rtol=1e-12)


def test_dx_into_of_the_wrong_shape_is_a_clear_error():
    rng = np.random.default_rng(2)
    _, cache = ek.linear_forward(rng.standard_normal((3, 6)), rng.standard_normal((4, 6)))
    with pytest.raises(ValueError, match="dx_into"):
        ek.linear_backward(rng.standard_normal((3, 4)), cache, dx_into=np.zeros((3, 5)))
    with pytest.raises(ValueError, match="C-contiguous"):
        ek.linear_backward(rng.standard_normal((3, 4)), cache, dx_into=np.zeros((6, 3)).T)


def test_forward_many_checks_every_weight():
    with pytest.raises(ValueError, match="C_in"):
        ek.linear_forward_many(np.ones((2, 3)), [np.ones((4, 3)), np.ones((4, 2))])


@pytest.mark.parametrize("many", [False, True])
def test_a_cache_without_its_input_gives_the_same_gradients_from_the_input_handed_back(many):
    """keep_input=False (activation recomputation): the cache holds no x, and linear_backward with x given
    back gives the kept cache's gradients bit for bit; without x it says what to pass."""
    rng = np.random.default_rng(3)
    x, w, dout = rng.standard_normal((2, 5, 8)), rng.standard_normal((4, 8)), rng.standard_normal((2, 5, 4))
    forward = (lambda keep: ek.linear_forward_many(x, [w], keep_input=keep)[0]) if many else None
    forward = forward or (lambda keep: ek.linear_forward(x, w, keep_input=keep))
    (out, kept), (out_lean, lean) = forward(True), forward(False)
    np.testing.assert_array_equal(out, out_lean)
    assert not any(a is x for a in lean)
    for got, want in zip(ek.linear_backward(dout, lean, x=x.copy()), ek.linear_backward(dout, kept)):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match=r"kept no input.*pass it as x"):
        ek.linear_backward(dout, lean)


@pytest.mark.parametrize("keep", [False, True])
def test_dx_alone_then_the_weight_gradient_equal_one_backward(keep):
    """dweight=False gives dx without x (even when the cache kept none); linear_weight_grad then gives
    dweight from x handed back: the one-call backward's arrays bit for bit."""
    rng = np.random.default_rng(4)
    x, w, dout = rng.standard_normal((3, 6)), rng.standard_normal((5, 6)), rng.standard_normal((3, 5))
    _, cache = ek.linear_forward(x, w, keep_input=keep)
    dx_ref, dw_ref = ek.linear_backward(dout, ek.linear_forward(x, w)[1])
    dx, none = ek.linear_backward(dout, cache, dweight=False)
    assert none is None
    np.testing.assert_array_equal(dx, dx_ref)
    np.testing.assert_array_equal(ek.linear_weight_grad(dout, cache, x=x.copy()), dw_ref)
    with pytest.raises(ValueError, match="dout must be"):
        ek.linear_backward(dout[:, :4], cache, dweight=False)
    if not keep:
        with pytest.raises(ValueError, match=r"kept no input.*pass it as x"):
            ek.linear_weight_grad(dout, cache)
