"""Delayed FP8 scales on the GPU (matmul/fp8_scales.py, fp8_scales.cu) and the SwiGLU kernels that cast their
outputs with them (swiglu.cu's *_fp8): the scale update against fp8_format.delayed_exponent over several
steps of a ring with inf and NaN maxima in it, a checkpoint's round trip, and the FP8 outputs against the
NumPy reference of the float32 kernel's values cast with the slot's scale: bit for bit, row-major and
transposed, padding rows zero, maxima exact, saturated values counted."""

from __future__ import annotations

import numpy as np
import pytest

from euler_kernels.matmul import fp8_format as ref
from tests.conftest import cupy_with_a_device

pytestmark = pytest.mark.gpu
cp = cupy_with_a_device()

from euler_kernels.cuda import cast  # noqa: E402
from euler_kernels.matmul import fp8_scales  # noqa: E402
from euler_kernels.swiglu import swiglu_cuda as swiglu  # noqa: E402


def bits_of(values) -> np.ndarray:
    return np.abs(np.asarray(values, dtype=np.float32)).view(np.uint32)


@pytest.mark.parametrize("margin", [0, 2])
def test_the_update_follows_the_reference_over_a_ring_of_steps(margin):
    formats = ["e4m3", "e5m2", "e4m3"]
    scales = fp8_scales.new_scales(formats, history=4, margin=margin)
    rng = np.random.default_rng(0)
    seen = [[] for _ in formats]
    for step in range(7):  # wraps the ring of 4
        maxima = (np.abs(rng.standard_normal(3)) * 2.0 ** rng.integers(-10, 10, 3)).astype(np.float32)
        if step == 2:
            maxima[1] = np.inf  # an overflowed step: left out of the scale
        if step == 3:
            maxima[2] = np.nan
        scales.amax_now[...] = cp.asarray(bits_of(maxima))
        fp8_scales.update_scales(scales)
        for s, fmt in enumerate(formats):
            seen[s].append(maxima[s])
            k = ref.delayed_exponent(seen[s][-4:], fmt, margin)
            assert int(scales.exponent[s].get()) == k, (step, s)
            assert float(scales.scale_inv[s, 0].get()) == 2.0**-k
        assert int(scales.step.get()[0]) == step + 1
        assert not scales.amax_now.get().any()


def test_a_saved_state_resumes_and_a_mismatched_one_is_refused():
    scales = fp8_scales.new_scales(["e4m3", "e5m2"])
    scales.amax_now[...] = cp.asarray(bits_of([3.0, 70.0]))
    fp8_scales.update_scales(scales)
    saved = fp8_scales.scale_arrays(scales)
    again = fp8_scales.scales_from_arrays(["e4m3", "e5m2"], saved)
    for name, value in fp8_scales.scale_arrays(again).items():
        np.testing.assert_array_equal(value, saved[name])
    np.testing.assert_array_equal(again.scale_inv.get(), scales.scale_inv.get())  # derived, not saved
    assert float(again.scale_inv[1, 0].get()) != 1.0 and again.calibrated
    with pytest.raises(ValueError, match="saved for 2 tensors, need 3"):
        fp8_scales.scales_from_arrays(["e4m3", "e5m2", "e4m3"], saved)


def bf16_inputs(rng, rows, cols, scale=1.0):
    """bf16 bit patterns on the GPU and the float32 values they hold."""
    x16 = cast.to_bf16(cp.asarray((rng.standard_normal((rows, cols)) * scale).astype(np.float32)))
    return x16, cast.from_bf16(x16)


def set_exponents(scales, first, *ks):
    """Slots first, first + 1, ... cast with exponents ks (products read 2^-k), as after an update."""
    for i, k in enumerate(ks):
        scales.exponent[first + i] = k
        scales.scale_inv[first + i, 0] = 2.0**-k


def check_output(t, want, k, fmt, rows):
    """An Fp8Tensor against the reference cast of want (rows, cols) float32 with scale 2^k; returns the
    reference's count of saturated values."""
    q, saturated = ref.quantize_fp8_scaled(want, k, fmt)
    got = ref.fp8_values(fmt)[t.rows.get().astype(np.int64)]
    np.testing.assert_array_equal(got[:rows], q)
    np.testing.assert_array_equal(np.signbit(got[:rows]), np.signbit(q))
    assert not t.rows.get()[rows:].any()  # padding rows are zero
    np.testing.assert_array_equal(t.cols.get(), t.rows.get().T)
    assert float(t.scale_inv.get()) == 2.0**-k
    return saturated


@pytest.mark.parametrize(("rows", "cols"), [(128, 256), (100, 48), (1, 16), (300, 2048)])
@pytest.mark.parametrize("stale", [False, True], ids=["fitting", "stale"])
def test_swiglu_forward_fp8_is_the_float32_kernel_cast_with_the_slots_scale(rows, cols, stale):
    rng = np.random.default_rng(rows + cols)
    (gate, gate32), (up, up32) = bf16_inputs(rng, rows, cols, 2.0), bf16_inputs(rng, rows, cols)
    want = swiglu.swiglu_forward(gate32, up32).get()  # float32 storage: the values before any rounding
    scales = fp8_scales.new_scales(["e5m2", "e4m3"])  # slot 1, so a wrong slot shows
    amax = float(np.abs(want).max())
    k = ref.scale_exponent(amax / 8 if stale else amax, "e4m3")  # stale: a scale 8x too large saturates
    set_exponents(scales, 1, k)
    t = swiglu.swiglu_forward_fp8(gate, up, scales, 1)
    assert t.shape == (-(-rows // 16) * 16, cols) and t.fmt == "e4m3"
    saturated = check_output(t, want, k, "e4m3", rows)
    assert int(scales.saturated[1].get()) == saturated and (saturated > 0) == stale
    assert int(scales.amax_now[1].get()) == int(bits_of(amax))
    assert int(scales.amax_now[0].get()) == 0 and int(scales.saturated[0].get()) == 0


@pytest.mark.parametrize(("rows", "cols"), [(128, 256), (100, 48), (300, 2048)])
def test_swiglu_backward_fp8_is_the_float32_kernel_cast_with_the_slots_scales(rows, cols):
    rng = np.random.default_rng(7 * rows + cols)
    (gate, gate32), (up, up32), (dout, dout32) = (bf16_inputs(rng, rows, cols, s) for s in (2.0, 1.0, 1e-3))
    want_g, want_u = (a.get() for a in swiglu.swiglu_backward(dout32, gate32, up32))
    scales = fp8_scales.new_scales(["e5m2", "e5m2"])
    k_g = ref.scale_exponent(float(np.abs(want_g).max()), "e5m2")
    k_u = ref.scale_exponent(float(np.abs(want_u).max()), "e5m2") + 2  # dup's scale stale by 4x
    set_exponents(scales, 0, k_g, k_u)
    dg, du = swiglu.swiglu_backward_fp8(dout, gate, up, scales, (0, 1))
    assert check_output(dg, want_g, k_g, "e5m2", rows) == int(scales.saturated[0].get()) == 0
    assert check_output(du, want_u, k_u, "e5m2", rows) == int(scales.saturated[1].get()) > 0
    maxima = [bits_of(np.abs(want).max()) for want in (want_g, want_u)]
    np.testing.assert_array_equal(scales.amax_now.get(), maxima)


def test_a_wrong_slot_format_is_refused():
    gate = cp.zeros((16, 16), cp.uint16)
    scales = fp8_scales.new_scales(["e5m2"])
    with pytest.raises(ValueError, match="slot 0 must be an e4m3 slot"):
        swiglu.swiglu_forward_fp8(gate, gate, scales, 0)


def test_the_update_replays_in_a_cuda_graph():
    scales = fp8_scales.new_scales(["e4m3"], history=2)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        fp8_scales.update_scales(scales)
        graph = stream.end_capture()
        for value in (4.0, 1.0, 0.5):  # each step's maximum, then the captured update
            scales.amax_now[...] = int(bits_of(value))
            graph.launch(stream)
    stream.synchronize()
    assert int(scales.step.get()[0]) == 3
    want = ref.scale_exponent(1.0, "e4m3") - fp8_scales.MARGIN  # the ring holds 1.0 and 0.5
    assert int(scales.exponent[0].get()) == want


def assert_product(got, a, b) -> None:
    """got ~ a @ b.T in float64: sums of exact products of FP8 values. Hopper's FP8 products keep about 14
    bits of their running sums within a 32-product step of K: the bound is 32 x 2^-14 of the |products|."""
    exact = a @ b.T
    bound = 2.0**-9 * (np.abs(a) @ np.abs(b).T) + 1e-30
    if got.dtype == cp.uint16:  # and a bf16 output's own rounding
        bound = bound + 2.0**-8 * np.abs(exact)
    got = (cast.from_bf16(got) if got.dtype == cp.uint16 else got).get().astype(np.float64)
    assert np.all(np.abs(got.reshape(exact.shape) - exact) <= bound)


def test_the_linear_op_takes_operands_the_swiglu_kernels_cast():
    """The down projection of an FP8 SwiGLU product, and the gate projection's backward from an FP8 dgate:
    the products of the FP8 values as cast, nothing cast again; 100 tokens (padded to 112)."""
    import euler_kernels as ek

    rng = np.random.default_rng(11)
    n, c, f = 100, 64, 96
    (gate, gate32), (up, up32) = bf16_inputs(rng, n, f, 2.0), bf16_inputs(rng, n, f)
    scales = fp8_scales.new_scales(["e4m3", "e5m2", "e5m2"])
    gated = swiglu.swiglu_forward(gate32, up32).get()
    set_exponents(scales, 0, ref.scale_exponent(float(np.abs(gated).max()), "e4m3"))
    gated8 = swiglu.swiglu_forward_fp8(gate, up, scales, 0)
    w_down = cp.asarray((rng.standard_normal((c, f)) * 0.1).astype(np.float32))
    (w8,) = ek.fp8_weights([w_down])
    out, cache = ek.linear_forward(gated8, w8, bf16_out=True)
    assert out.shape == (n, c)
    k = int(scales.exponent[0].get())
    x_q = ref.quantize_fp8_scaled(gated, k, "e4m3")[0] * 2.0**-k
    w_q = ref.quantize_fp8(w_down.get(), "e4m3")
    assert_product(out, x_q, w_q[0] * w_q[1])
    with pytest.raises(ValueError, match="keep_input=False"):
        ek.linear_forward(gated8, w8, keep_input=False)

    (dout, dout32) = bf16_inputs(rng, n, f, 1e-3)
    dg32 = swiglu.swiglu_backward(dout32, gate32, up32)[0].get()
    set_exponents(scales, 1, ref.scale_exponent(float(np.abs(dg32).max()), "e5m2"))
    dg8, _ = swiglu.swiglu_backward_fp8(dout, gate, up, scales, (1, 2))
    h = cast.to_bf16(cp.asarray(rng.standard_normal((n, c)).astype(np.float32)))
    w_gate = cp.asarray((rng.standard_normal((f, c)) * 0.1).astype(np.float32))
    (wg8,) = ek.fp8_weights([w_gate])
    _, cache = ek.linear_forward(h, wg8, bf16_out=True)
    dh, dw = ek.linear_backward(dg8, cache)
    k_g = int(scales.exponent[1].get())
    d_q = ref.quantize_fp8_scaled(dg32, k_g, "e5m2")[0] * 2.0**-k_g
    h_q = ref.quantize_fp8(cast.from_bf16(h).get(), "e4m3")
    wg_q = ref.quantize_fp8(w_gate.get(), "e4m3")
    assert_product(dh, d_q, (wg_q[0] * wg_q[1]).T)
    assert_product(dw, d_q.T, (h_q[0] * h_q[1]).T)
