"""FP8 operands and products on the GPU (matmul/fp8.cu, matmul/gemm_fp8.py): the cast kernel gives the NumPy
reference's values bit for bit (row-major and transposed), amax is the exact largest |value|, and the
cuBLASLt FP8 product of the FP8 copies equals the float64 product of their values within float32-summation
error (and a bf16 rounding for bf16 outputs); also inside a CUDA graph."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from euler_kernels.matmul import fp8_format as ref

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

from euler_kernels.cuda import cast  # noqa: E402
from euler_kernels.matmul import fp8  # noqa: E402
from euler_kernels.matmul.gemm_fp8 import gemm_fp8, transposed  # noqa: E402


def decoded(bits, fmt) -> np.ndarray:
    return ref.fp8_values(fmt)[bits.get().astype(np.int64)]


def source(rng, rows, cols, log_scale, bf16):
    """(the GPU array the cast reads: float32, or bf16 bit patterns; the float32 values it holds)."""
    x = (rng.standard_normal((rows, cols)) * 2.0**log_scale).astype(np.float32)
    if not bf16:
        return cp.asarray(x), x
    x16 = cast.to_bf16(cp.asarray(x))
    return x16, cast.from_bf16(x16).get()


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 200), cols=st.integers(1, 200), log_scale=st.floats(-20, 20),
    fmt=st.sampled_from(["e4m3", "e5m2"]), bf16=st.booleans(), seed=st.integers(0, 2**31),
)  # fmt: skip
@example(rows=128, cols=64, log_scale=0.0, fmt="e4m3", bf16=True, seed=1)  # whole tiles, 16-byte paths
@example(rows=1, cols=1, log_scale=3.0, fmt="e5m2", bf16=False, seed=2)
def test_cast_matches_the_reference_bit_for_bit(rows, cols, log_scale, fmt, bf16, seed):
    x_gpu, x = source(np.random.default_rng(seed), rows, cols, log_scale, bf16)
    amax = fp8.amax_bits(x_gpu)
    assert int(amax.get()) == int(np.abs(x).max().view(np.uint32))
    t = fp8.to_fp8(x_gpu, fmt, rows=True, cols=True)
    q, scale_inv = ref.quantize_fp8(x, fmt)
    values = decoded(t.rows, fmt)
    np.testing.assert_array_equal(values, q)
    np.testing.assert_array_equal(np.signbit(values), np.signbit(q))
    np.testing.assert_array_equal(t.cols.get(), t.rows.get().T)
    assert float(t.scale_inv.get()) == scale_inv


def test_cast_of_an_unaligned_view_and_one_part_only():
    rng = np.random.default_rng(3)
    x = cp.asarray(rng.standard_normal((66, 48)).astype(np.float32))
    view = x.reshape(-1)[1:3121].reshape(65, 48)  # starts 4 bytes in: not 16-byte aligned
    assert view.data.ptr % 16 != 0 and view.flags.c_contiguous
    t = fp8.to_fp8(view, "e4m3", rows=False, cols=True)
    assert t.rows is None
    q, _ = ref.quantize_fp8(view.get(), "e4m3")
    np.testing.assert_array_equal(decoded(t.cols, "e4m3"), q.T)


def test_amax_keeps_nan_and_collects_several_tensors():
    a = cp.asarray(np.array([1.0, -7.0, 2.0], dtype=np.float32))
    b = cp.asarray(np.array([3.0, np.nan], dtype=np.float32))
    out = fp8.amax_bits(a)
    fp8.amax_bits(cp.asarray(np.array([-9.0], dtype=np.float32)), out=out)
    assert float(out.view(cp.float32).get()) == 9.0
    assert np.isnan(float(fp8.amax_bits(b).view(cp.float32).get()))


def check_product(got, a_vals, b_vals, bf16_out, base=None):
    exact = a_vals @ b_vals.T + (0.0 if base is None else base)  # float64
    size = np.abs(a_vals) @ np.abs(b_vals).T
    bound = 2.0**-12 * size + 1e-30  # float32 sums of exact fp8 products, in chunks
    if bf16_out:
        bound = bound + 2.0**-8 * np.abs(exact)
    got = cast.from_bf16(got).get() if got.dtype == cp.uint16 else got.get()
    assert np.all(np.abs(got - exact) <= bound), float(np.max(np.abs(got - exact) / bound))


@pytest.mark.parametrize("m,n,k", [(16, 16, 16), (64, 48, 32), (256, 512, 1024), (160, 96, 2048)])
@pytest.mark.parametrize("formats", [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e4m3", "e5m2")])
@pytest.mark.parametrize("bf16_out", [True, False])
def test_product_equals_the_float64_product_of_the_fp8_values(m, n, k, formats, bf16_out):
    rng = np.random.default_rng(m + n + k)
    a_gpu, _ = source(rng, m, k, -6.0, bf16=True)  # gradients' size: scaled up by the cast
    b_gpu, _ = source(rng, n, k, 3.0, bf16=False)
    a, b = fp8.to_fp8(a_gpu, formats[0]), fp8.to_fp8(b_gpu, formats[1])
    a_vals = decoded(a.rows, a.fmt) * float(a.scale_inv.get())
    b_vals = decoded(b.rows, b.fmt) * float(b.scale_inv.get())
    check_product(gemm_fp8(a, b, bf16_out=bf16_out), a_vals, b_vals, bf16_out)


def test_transposed_operands_and_accumulation():
    """dW (N, K) += dY^T (N, T) @ X (T, K): both operands from transposed copies, summed over tokens T."""
    rng = np.random.default_rng(5)
    dy_gpu, _ = source(rng, 384, 96, -10.0, bf16=True)  # (T, N)
    x_gpu, _ = source(rng, 384, 64, 0.0, bf16=True)  # (T, K)
    dy = fp8.to_fp8(dy_gpu, "e5m2", rows=False, cols=True)
    x = fp8.to_fp8(x_gpu, "e4m3", rows=False, cols=True)
    base = rng.standard_normal((96, 64)).astype(np.float32) * 1e-3
    out = cp.asarray(base)
    gemm_fp8(transposed(dy), transposed(x), out=out)
    dy_vals = decoded(dy.cols, "e5m2").T * float(dy.scale_inv.get())  # (T, N)
    x_vals = decoded(x.cols, "e4m3").T * float(x.scale_inv.get())  # (T, K)
    check_product(out, dy_vals.T, x_vals.T, bf16_out=False, base=base.astype(np.float64))


def test_cast_and_product_replay_in_a_cuda_graph():
    rng = np.random.default_rng(7)
    x = cp.asarray(rng.standard_normal((128, 256)).astype(np.float32))
    w = fp8.to_fp8(cp.asarray(rng.standard_normal((64, 256)).astype(np.float32)), "e4m3")
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        gemm_fp8(fp8.to_fp8(x, "e4m3"), w)  # plans and kernels made outside the capture
        stream.begin_capture()
        out = gemm_fp8(fp8.to_fp8(x, "e4m3"), w)
        graph = stream.end_capture()
        x[...] = cp.asarray(rng.standard_normal((128, 256)).astype(np.float32) * 100)
        graph.launch()
        stream.synchronize()
        eager = gemm_fp8(fp8.to_fp8(x, "e4m3"), w)
        stream.synchronize()
    np.testing.assert_array_equal(out.get(), eager.get())


def test_bad_operands_are_refused():
    x = fp8.to_fp8(cp.ones((32, 32), dtype=cp.float32), "e5m2")
    with pytest.raises(ValueError, match="e5m2 x e5m2"):
        gemm_fp8(x, x)
    with pytest.raises(ValueError, match="multiples of 16"):
        a, b = (fp8.to_fp8(cp.ones((r, 24), dtype=cp.float32), "e4m3") for r in (32, 16))
        gemm_fp8(a, b)
    with pytest.raises(ValueError, match="float32 or bf16"):
        fp8.to_fp8(cp.ones((4, 4), dtype=cp.float64), "e4m3")


@pytest.mark.parametrize("n", [4096, 1001])  # the 8-wide bf16 kernels, and the one-value ones
@pytest.mark.parametrize("bf16", [True, False])
def test_swiglu_measures_the_maxima_its_outputs_have(n, bf16):
    """swiglu's amax outputs equal amax_bits of what it stored (bf16: after rounding), NaN included."""
    import euler_kernels as ek

    rng = np.random.default_rng(n)
    gate, up, dout = (source(rng, 1, n, 2.0, bf16)[0].reshape(-1) for _ in range(3))
    if not bf16:
        up[7] = np.nan  # a NaN reaches out and dgate: their maxima are NaN
    amax = ek.fp8_amax()
    out, cache = ek.swiglu_forward(gate, up, amax=amax)
    assert int(amax.get()) == int(fp8.amax_bits(out).get())
    pair = (ek.fp8_amax(), ek.fp8_amax())
    dgate, dup = ek.swiglu_backward(dout, cache, amax=pair)
    assert [int(a.get()) for a in pair] == [int(fp8.amax_bits(t).get()) for t in (dgate, dup)]
    plain = ek.swiglu_forward(gate, up)[0]  # the outputs do not depend on the measuring
    np.testing.assert_array_equal(plain.get(), out.get())


@pytest.mark.parametrize("c", [768, 1024, 2048, 1000])  # vectorised rows of 1, 2, 4 warps; the general ones
@pytest.mark.parametrize("residual", [True, False])
def test_rmsnorm_measures_the_maxima_of_its_bf16_outputs(c, residual):
    """RMSNorm's bf16 output h (forward) and bf16 copy of dx (backward) raise amax to amax_bits of what
    they stored, and measuring changes no output."""
    import euler_kernels as ek

    rng = np.random.default_rng(c)
    n = 300
    x, branch, g, add = (cp.asarray(rng.standard_normal((n, c)).astype(np.float32) * 3) for _ in range(4))
    w = cp.asarray(1.0 + 0.3 * rng.standard_normal(c), dtype=cp.float32)
    amax = ek.fp8_amax()
    if residual:
        (_, h), cache = ek.residual_rmsnorm_forward(x, branch, w, bf16_out=True, amax=amax)
        plain = ek.residual_rmsnorm_forward(x, branch, w, bf16_out=True)[0][1]
    else:
        h, cache = ek.rmsnorm_forward(x, w, bf16_out=True, amax=amax)
        plain = ek.rmsnorm_forward(x, w, bf16_out=True)[0]
    assert int(amax.get()) == int(fp8.amax_bits(h).get()) > 0
    np.testing.assert_array_equal(plain.get(), h.get())
    a16 = ek.fp8_amax()
    ds = add if residual else None
    _, _, dx16 = ek.residual_rmsnorm_backward_bf16_copy(ds, g, cache, amax=a16)
    assert int(a16.get()) == int(fp8.amax_bits(dx16).get()) > 0
    np.testing.assert_array_equal(ek.residual_rmsnorm_backward_bf16_copy(ds, g, cache)[2].get(), dx16.get())
    with pytest.raises(ValueError, match="bf16"):
        ek.rmsnorm_forward(x, w, amax=ek.fp8_amax())  # a float32 output is not cast to FP8
