"""The NumPy reference of the FP8 operands (fp8_format.py): the bit patterns' values, rounding to nearest even
with saturation, and the power-of-two scale; checked against PyTorch's float8 types (a test oracle) and
against the formats' definitions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from euler_kernels.matmul import fp8_format as fp8

torch = pytest.importorskip("torch")
TORCH_TYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_values_of_every_pattern_match_torch(fmt):
    codes = torch.arange(256, dtype=torch.uint8)
    theirs = codes.view(TORCH_TYPES[fmt]).to(torch.float64).numpy()
    np.testing.assert_array_equal(fp8.fp8_values(fmt), theirs)  # NaNs in the same places
    assert np.nanmax(fp8.fp8_values(fmt)[np.isfinite(fp8.fp8_values(fmt))]) == fp8.largest(fmt)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), log_scale=st.floats(-14, 8))
def test_rounding_matches_torch_within_range(fmt, seed, log_scale):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(4000) * 2.0**log_scale).astype(np.float32)
    x = x[np.abs(x) <= fp8.largest(fmt)]  # torch's cast does not saturate: beyond the range it makes NaN/inf
    theirs = torch.from_numpy(x).to(TORCH_TYPES[fmt]).to(torch.float64).numpy()
    ours = fp8.round_to_fp8(x, fmt)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(np.signbit(ours), np.signbit(theirs))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_midpoints_round_to_even_and_large_values_saturate(fmt):
    values = fp8.fp8_values(fmt)
    finite = np.unique(values[np.isfinite(values) & (values >= 0)])  # ascending
    mid = (finite[:-1] + finite[1:]) / 2
    codes_even = [int(np.flatnonzero(values == v)[0]) % 2 == 0 for v in finite]
    expected = np.where(codes_even[:-1], finite[:-1], finite[1:])  # the neighbour with an even pattern
    np.testing.assert_array_equal(fp8.round_to_fp8(mid, fmt), expected)
    np.testing.assert_array_equal(fp8.round_to_fp8(-mid, fmt), -expected)
    big = np.array([fp8.largest(fmt) * 1.2, np.inf, -np.inf, 1e30])
    np.testing.assert_array_equal(fp8.round_to_fp8(big, fmt), np.sign(big) * fp8.largest(fmt))
    assert np.isnan(fp8.round_to_fp8(np.array([np.nan]), fmt)).all()


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@settings(max_examples=60, deadline=None)
@given(amax=st.floats(1e-30, 1e30))
def test_scale_is_the_largest_power_of_two_that_fits(fmt, amax):
    amax = float(np.float32(amax))  # the kernels hold amax as a float32
    k = fp8.scale_exponent(amax, fmt)
    if -126 < k < 126:
        assert amax * 2.0**k <= fp8.largest(fmt) < amax * 2.0 ** (k + 1)


def test_scale_of_zero_inf_nan_is_one_and_quantize_round_trips():
    assert [fp8.scale_exponent(a, "e4m3") for a in (0.0, np.inf, np.nan)] == [0, 0, 0]
    x = np.array([0.75, -0.001, 3.0], dtype=np.float32)
    q, scale_inv = fp8.quantize_fp8(x, "e4m3")
    assert scale_inv == 2.0**-7 and np.max(np.abs(q)) <= 448  # 3 * 2^7 = 384 fits, 3 * 2^8 does not
    np.testing.assert_allclose(q * scale_inv, x, rtol=2**-4)  # e4m3: 3 mantissa bits, half an ulp


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="format must be one of"):
        fp8.round_to_fp8(np.zeros(1), "e3m4")


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_a_delayed_scale_of_the_tensors_own_maximum_casts_as_current_scaling(fmt):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(3000) * 7.0).astype(np.float32)
    k = fp8.delayed_exponent([np.abs(x).max()], fmt)
    q, saturated = fp8.quantize_fp8_scaled(x, k, fmt)
    want, scale_inv = fp8.quantize_fp8(x, fmt)
    np.testing.assert_array_equal(q, want)
    assert saturated == 0 and scale_inv == 2.0**-k


def test_a_delayed_scale_comes_from_the_largest_finite_maximum_of_the_history():
    assert fp8.delayed_exponent([1.0, 3.0, 0.5], "e4m3") == fp8.scale_exponent(3.0, "e4m3")
    assert fp8.delayed_exponent([1.0, np.inf, np.nan], "e4m3") == fp8.scale_exponent(1.0, "e4m3")
    assert fp8.delayed_exponent([0.0] * 16, "e5m2") == 0  # an empty history: scale 1
    assert fp8.delayed_exponent([np.nan], "e5m2") == 0
    assert fp8.delayed_exponent([1.0, 3.0], "e5m2", margin=2) == fp8.scale_exponent(3.0, "e5m2") - 2
    assert fp8.delayed_exponent([0.0], "e5m2", margin=2) == 0  # still scale 1 with nothing measured


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_values_beyond_a_stale_scale_saturate_and_are_counted(fmt):
    x = np.array([1.0, -3.0, 5.0, np.nan, 0.25], dtype=np.float32)
    k = fp8.scale_exponent(1.0, fmt)  # a scale from an earlier, smaller maximum
    q, saturated = fp8.quantize_fp8_scaled(x, k, fmt)
    assert saturated == 2  # -3 and 5; NaN is not counted
    assert q[1] == -fp8.largest(fmt) and q[2] == fp8.largest(fmt) and np.isnan(q[3])
    assert q[4] == fp8.round_to_fp8(0.25 * 2.0**k, fmt)
