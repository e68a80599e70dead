"""The linear op's FP8 path (matmul/linear_fp8.py): with an FP8 weight copy, out, dx and dweight equal the
float64 products of the operands' FP8 values (x and the weight e4m3, the output gradient e5m2, one
power-of-two scale per tensor, as fp8_format.py's reference rounds them) within float32-summation error,
for float32 and bf16 inputs, token counts that are not multiples of 16 (padded), dx_into and bf16
outputs."""

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek
from euler_kernels.matmul import fp8_format as ref

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

from euler_kernels.cuda import cast  # noqa: E402


def values(a) -> np.ndarray:
    """The float32 values a GPU float32 or bf16 array holds, as float64."""
    return (cast.from_bf16(a) if a.dtype == cp.uint16 else a).get().astype(np.float64)


def fp8_of(a: np.ndarray, fmt: str) -> np.ndarray:
    """What the FP8 path multiplies for a tensor of these values: its FP8 values times its scale."""
    q, scale_inv = ref.quantize_fp8(a.astype(np.float32), fmt)
    return q * scale_inv


def assert_product(got, a, b, base=None) -> None:
    """got ~ a @ b.T (+ base) in float64; bound: float32 sums of exact products, plus got's own rounding."""
    exact = a @ b.T + (0.0 if base is None else base)
    bound = 2.0**-12 * (np.abs(a) @ np.abs(b).T) + 1e-30
    if got.dtype == cp.uint16:
        bound = bound + 2.0**-8 * np.abs(exact)
    err = np.abs(values(got).reshape(exact.shape) - exact)
    assert np.all(err <= bound), float(np.max(err / bound))


@pytest.mark.parametrize("lead", [(64,), (3, 7), (2, 16)])  # 64 and 32 tokens, and 21 (padded to 32)
@pytest.mark.parametrize("bf16_in", [True, False])
def test_forward_and_backward_are_the_products_of_the_fp8_values(lead, bf16_in):
    rng = np.random.default_rng(sum(lead))
    c_in, c_out = 48, 80
    x = cp.asarray(rng.standard_normal((*lead, c_in)).astype(np.float32))
    x = cast.to_bf16(x) if bf16_in else x
    w = cp.asarray((rng.standard_normal((c_out, c_in)) * 0.1).astype(np.float32))
    (w8,) = ek.fp8_weights([w])
    out, cache = ek.linear_forward(x, w8, bf16_out=bf16_in)
    assert out.shape == (*lead, c_out) and out.dtype == (cp.uint16 if bf16_in else cp.float32)
    x_q = fp8_of(values(x).reshape(-1, c_in), "e4m3")
    w_q = fp8_of(w.get(), "e4m3")
    assert_product(out, x_q, w_q)

    dout = cp.asarray((rng.standard_normal((*lead, c_out)) * 1e-4).astype(np.float32))
    dout = cast.to_bf16(dout) if bf16_in else dout
    dx, dw = ek.linear_backward(dout, cache, bf16_dx=bf16_in)
    d_q = fp8_of(values(dout).reshape(-1, c_out), "e5m2")
    assert dx.shape == x.shape and dw.shape == w.shape and dw.dtype == cp.float32
    assert_product(dx, d_q, w_q.T)
    assert_product(dw, d_q.T, x_q.T)


@pytest.mark.parametrize("n", [32, 21])  # dx_into is added into by cuBLASLt, or after the padded product
def test_dx_into_adds_and_many_shares_one_cast(n):
    rng = np.random.default_rng(n)
    x = cast.to_bf16(cp.asarray(rng.standard_normal((n, 64)).astype(np.float32)))
    ws = [cp.asarray(rng.standard_normal((s, 64)).astype(np.float32) * 0.1) for s in (32, 96)]
    w8s = ek.fp8_weights(ws)
    many = ek.linear_forward_many(x, w8s, bf16_out=True)
    for (out, _), w8 in zip(many, w8s):
        np.testing.assert_array_equal(out.get(), ek.linear_forward(x, w8, bf16_out=True)[0].get())
    douts = [cast.to_bf16(cp.asarray(rng.standard_normal((n, s)).astype(np.float32))) for s in (32, 96)]
    dx0, _ = ek.linear_backward(douts[0], many[0][1])
    dx1, _ = ek.linear_backward(douts[1], many[1][1])
    base = dx0.get().astype(np.float64)
    summed, _ = ek.linear_backward(douts[1], many[1][1], dx_into=dx0)
    assert summed is dx0
    np.testing.assert_allclose(summed.get(), base + dx1.get(), rtol=1e-5, atol=1e-6)


def test_weights_of_other_sizes_and_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="multiples of 16"):
        ek.fp8_weights([cp.ones((24, 32), dtype=cp.float32)])
    (w8,) = ek.fp8_weights([cp.ones((32, 32), dtype=cp.float32)])
    with pytest.raises(ValueError, match="must end in C_in = 32"):
        ek.linear_forward(cp.ones((4, 16), dtype=cp.float32), w8)
    with pytest.raises(ValueError, match="float32 or bf16 CuPy"):
        ek.linear_forward(np.ones((4, 32), dtype=np.float32), w8)


@pytest.mark.parametrize("n", [48, 21])
def test_keep_input_false_with_x_made_again_gives_the_same_bits(n):
    """keep_input=False keeps only x's maximum; the backward casts the x it is handed with it."""
    rng = np.random.default_rng(n)
    x = cast.to_bf16(cp.asarray(rng.standard_normal((n, 64)).astype(np.float32)))
    (w8,) = ek.fp8_weights([cp.asarray(rng.standard_normal((32, 64)).astype(np.float32))])
    dout = cast.to_bf16(cp.asarray(rng.standard_normal((n, 32)).astype(np.float32)))
    kept_out, kept = ek.linear_forward(x, w8, bf16_out=True)
    out, cache = ek.linear_forward(x, w8, bf16_out=True, keep_input=False)
    np.testing.assert_array_equal(out.get(), kept_out.get())
    with pytest.raises(ValueError, match="pass it as x"):
        ek.linear_backward(dout, cache)
    for a, b in zip(ek.linear_backward(dout, cache, x=x.copy()), ek.linear_backward(dout, kept)):
        np.testing.assert_array_equal(a.get(), b.get())


def test_a_given_maximum_gives_the_same_bits_as_a_measured_one():
    """x_amax and dout_amax (from the kernel that made the tensor) replace the FP8 path's own pass."""
    from euler_kernels.matmul import fp8

    rng = np.random.default_rng(9)
    x = cast.to_bf16(cp.asarray(rng.standard_normal((40, 64)).astype(np.float32)))
    dout = cast.to_bf16(cp.asarray(rng.standard_normal((40, 32)).astype(np.float32)))
    (w8,) = ek.fp8_weights([cp.asarray(rng.standard_normal((32, 64)).astype(np.float32))])
    out, cache = ek.linear_forward(x, w8, bf16_out=True, x_amax=fp8.amax_bits(x))
    ref_out, ref_cache = ek.linear_forward(x, w8, bf16_out=True)
    np.testing.assert_array_equal(out.get(), ref_out.get())
    given = ek.linear_backward(dout, cache, dout_amax=fp8.amax_bits(dout))
    for a, b in zip(given, ek.linear_backward(dout, ref_cache)):
        np.testing.assert_array_equal(a.get(), b.get())
