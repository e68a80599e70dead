"""The bf16 tensor-core FlashAttention against float64 NumPy attention on the same bf16-rounded inputs: every
test runs once per kernel family the GPU has (the mma.sync kernels of flash_attention_bf16.cu everywhere,
the wgmma kernels of flash_attention_sm90.cu on Hopper), chosen by the launchers' kernel argument (a
Precision's attention_kernel: "sm90" or "mma").

Tolerances. Products of bf16 inputs are exact and every sum is fp32, so scores and lse are float32-accurate:
lse within 1e-4 absolute (it is O(5); fp32 rounding gives ~1e-6). What remains are three roundings to bf16,
each a relative error of at most 2^-9 ~ 2e-3, independent from element to element: P as the operand of P V
and P^T dO, dS as the operand of dS^T Q and dS K, and out as it is written. So out, dq, dk and dv are off
by about 2e-3 norm-wise (a lane-level NumPy emulation of the kernel gave 1.4e-3 to 3.0e-3 on these shapes
and on 25 hypothesis examples), and the bounds are 1e-2: 3x headroom, while an off-by-one causal mask, a
wrong query position or a wrong query-to-kv head map moves the float64 reference itself by 10x more
(`test_the_bounds_catch_wrong_masks_and_head_maps`).

The reference gradients take delta = rowsum(dout * out) from the kernel's bf16-rounded out, as the kernel
does (and as its contract says). Against the exact out, a peaked softmax over a few keys cancels in
dP - delta and the bf16 rounding of out alone moves dq and dk by up to ~1.3e-2 (emulated T = 1, S = 5,
logits x4): a property of a bf16 output, not an error of the kernel, so it is not what these bounds judge.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from euler_kernels.testing import bf16_bits, bf16_values, relative_error
from tests.conftest import cupy_with_a_device

pytestmark = pytest.mark.gpu
cp = cupy_with_a_device()

from euler_kernels.attention import (  # noqa: E402
    flash_attention,
    flash_attention_sm90,
)
from euler_kernels.attention.flash_attention import (  # noqa: E402
    flash_attention_backward_bf16,
    flash_attention_forward_bf16,
)

OUT_TOL, GRAD_TOL, LSE_TOL = 1e-2, 1e-2, 1e-4
_HOPPER = cp.cuda.Device().compute_capability.startswith("9")


@pytest.fixture(autouse=True, params=["sm90", "mma"])
def kernel_family(request):
    """Run the test with the Hopper kernels (skipped on other GPUs) and with the mma.sync kernels: the
    `kernel` the test hands the launchers."""
    if request.param == "sm90" and not _HOPPER:
        pytest.skip("the wgmma kernels need a Hopper GPU (compute capability 9.x)")
    return request.param


def reference(q, k, v, dout, causal, shift=0, head_map=None, delta_out=None):
    """float64 attention and its gradients: q, dout (B, T, Hq, D), k, v (B, S, Hkv, D).

    Query t sits at position S - T + t (+ shift); query head h uses kv head head_map[h] (default h // G).
    delta = rowsum(dout * out) uses `delta_out` for out when given (the kernel's bf16-rounded output, as
    the kernel does), else the exact out. Returns out (B, T, Hq, D), lse (B, Hq, T), dq, dk, dv.
    """
    _, T, Hq, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    heads = np.arange(Hq) // (Hq // Hkv) if head_map is None else np.asarray(head_map)
    kk, vv = k[:, :, heads], v[:, :, heads]  # (B, S, Hq, D)
    scale = D**-0.5
    s = np.einsum("bthd,bshd->bhts", q, kk) * scale
    if causal:
        hidden = np.arange(S)[None, :] > (S - T + shift + np.arange(T))[:, None]
        s = np.where(hidden, -np.inf, s)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    l = e.sum(-1, keepdims=True)
    p = e / l
    out = np.einsum("bhts,bshd->bthd", p, vv)
    dp = np.einsum("bthd,bshd->bhts", dout, vv)
    out_d = out if delta_out is None else delta_out
    delta = np.einsum("bthd,bthd->bht", dout, out_d)[..., None]  # (B, Hq, T, 1)
    ds = p * (dp - delta)
    dq = np.einsum("bhts,bshd->bthd", ds, kk) * scale
    dk_h = np.einsum("bhts,bthd->bshd", ds, q) * scale
    dv_h = np.einsum("bhts,bthd->bshd", p, dout)
    dk, dv = np.zeros(k.shape), np.zeros(v.shape)
    for h in range(Hq):  # each kv head sums the gradients of the query heads that read it
        dk[:, :, heads[h]] += dk_h[:, :, h]
        dv[:, :, heads[h]] += dv_h[:, :, h]
    return out, (m + np.log(l))[..., 0], dq, dk, dv


def make_inputs(rng, B, T, S, Hq, Hkv, D, scale=1.0):
    """bf16 bit patterns of q, k, v, dout (normal, q scaled) and their exact float64 values."""
    shapes = [(B, T, Hq, D), (B, S, Hkv, D), (B, S, Hkv, D), (B, T, Hq, D)]
    bits = [
        bf16_bits(rng.standard_normal(s).astype(np.float32) * (scale if i == 0 else 1.0))
        for i, s in enumerate(shapes)
    ]
    return bits, [bf16_values(b).astype(np.float64) for b in bits]


def run(bits, causal, kernel):
    q16, k16, v16, g16 = (cp.asarray(b) for b in bits)
    out16, lse = flash_attention_forward_bf16(q16, k16, v16, causal, kernel)
    dq, dk, dv = flash_attention_backward_bf16(g16, q16, k16, v16, out16, lse, causal, kernel)
    return out16, lse, dq, dk, dv


def check(bits, exact, causal, kernel, label=""):
    out16, lse, dq, dk, dv = run(bits, causal, kernel)
    assert out16.dtype == cp.uint16 and lse.dtype == dq.dtype == dk.dtype == dv.dtype == cp.float32
    ref_out, ref_lse, ref_dq, ref_dk, ref_dv = reference(*exact, causal, delta_out=bf16_values(out16))
    errors = {
        "out": relative_error(bf16_values(out16), ref_out),
        "lse": float(np.abs(lse.get() - ref_lse).max()),
        "dq": relative_error(dq, ref_dq),
        "dk": relative_error(dk, ref_dk),
        "dv": relative_error(dv, ref_dv),
    }
    print(label + " ".join(f"{name}={e:.2e}" for name, e in errors.items()))
    assert errors["out"] < OUT_TOL and errors["lse"] < LSE_TOL, errors
    assert max(errors["dq"], errors["dk"], errors["dv"]) < GRAD_TOL, errors


SHAPES = [
    # (B, T, S, Hq, Hkv)
    (2, 77, 77, 6, 2),  # GQA; T not a multiple of the 64-row tiles
    (2, 77, 77, 4, 4),  # MHA
    (2, 5, 70, 6, 2),  # a chunk of 5 queries after 65 cached keys (T < S)
    (2, 1, 77, 6, 2),  # a decode step: one query at the last position
    (1, 256, 256, 6, 2),  # several key tiles (double buffering) and query tiles per block
    (1, 130, 200, 4, 1),  # T < S over several tiles; all query heads on one kv head
]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("b,t,s,hq,hkv", SHAPES)
def test_bf16_flash_attention_matches_float64(kernel_family, b, t, s, hq, hkv, d, causal):
    rng = np.random.default_rng(1000 * t + 10 * s + hq + d)
    bits, exact = make_inputs(rng, b, t, s, hq, hkv, d)
    check(bits, exact, causal, kernel_family, f"B={b} T={t} S={s} Hq={hq} Hkv={hkv} D={d} causal={causal}: ")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.integers(1, 2),
    st.integers(1, 150),
    st.integers(0, 100),
    st.sampled_from([1, 2]),
    st.sampled_from([1, 3]),
    st.sampled_from([64, 128]),
    st.booleans(),
    st.sampled_from([0.5, 1.0, 4.0]),  # 4: peaked softmax, large logits (online rescaling)
    st.integers(0, 2**31),
)
def test_bf16_flash_attention_random_shapes(kernel_family, b, t, extra, hkv, group, d, causal, scale, seed):
    rng = np.random.default_rng(seed)
    bits, exact = make_inputs(rng, b, t, t + extra, hkv * group, hkv, d, scale)
    check(bits, exact, causal, kernel_family)


def test_the_bounds_catch_wrong_masks_and_head_maps():
    """Plausible bugs move the exact result by several times the bounds, so the bounds would catch them."""
    rng = np.random.default_rng(5)
    for t, s in ((77, 77), (5, 70)):
        _, exact = make_inputs(rng, 2, t, s, 6, 2, 64)
        right = reference(*exact, causal=True)
        with np.errstate(invalid="ignore"):  # shift = -1 leaves query 0 of a T = S sequence without keys
            wrongs = (
                reference(*exact, causal=True, shift=-1),  # off by one: the diagonal key hidden
                reference(*exact, causal=True, shift=1),  # one key too many
                reference(*exact, causal=True, head_map=np.arange(6) % 2),  # interleaved, not grouped heads
            )
        for wrong in wrongs:
            # NaN counts as wrong
            errors = [np.nan_to_num(relative_error(w, r), nan=np.inf) for w, r in zip(wrong, right)]
            print(f"T={t} S={s}: " + " ".join(f"{e:.2e}" for e in errors))
            assert errors[0] > 4 * OUT_TOL and max(errors[2:]) > 4 * GRAD_TOL, errors


@pytest.mark.parametrize("d", [64, 128])
def test_bf16_agrees_with_the_fp32_kernel_on_the_same_rounded_inputs(kernel_family, d):
    """The exact-fp32 FlashAttention on the decoded bf16 inputs: only the bf16 roundings differ."""
    rng = np.random.default_rng(d)
    bits, _ = make_inputs(rng, 2, 150, 150, 6, 2, d)
    out16, lse, dq, dk, dv = run(bits, True, kernel_family)
    q, k, v, g = (cp.asarray(bf16_values(x)) for x in bits)
    out32, lse32 = flash_attention.flash_attention_forward(q, k, v, True, tf32=False)
    dq32, dk32, dv32 = flash_attention.flash_attention_backward(g, q, k, v, out32, lse32, True, tf32=False)
    assert relative_error(bf16_values(out16), out32.get()) < OUT_TOL
    assert float(cp.abs(lse - lse32).max()) < LSE_TOL
    for ours, theirs in ((dq, dq32), (dk, dk32), (dv, dv32)):  # 2x: delta from fp32 out there, bf16 here
        assert relative_error(ours, theirs.get()) < 2 * GRAD_TOL


def test_bf16_flash_attention_replays_in_a_cuda_graph(kernel_family):
    """Forward + backward captured once, replayed with new inputs written into the captured arrays."""
    rng = np.random.default_rng(7)
    shape_q, shape_kv = (2, 77, 6, 64), (2, 77, 2, 64)
    arrays = [
        cp.asarray(bf16_bits(rng.standard_normal(s).astype(np.float32)))
        for s in (shape_q, shape_kv, shape_kv, shape_q)
    ]
    q16, k16, v16, g16 = arrays
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        run(arrays, True, kernel_family)  # compile the kernels and set their attributes outside the capture
        stream.synchronize()
        stream.begin_capture()
        out16, lse = flash_attention_forward_bf16(q16, k16, v16, True, kernel_family)
        dq, dk, dv = flash_attention_backward_bf16(g16, q16, k16, v16, out16, lse, True, kernel_family)
        graph = stream.end_capture()
    for _ in range(2):
        for a in arrays:
            a[...] = cp.asarray(bf16_bits(rng.standard_normal(a.shape).astype(np.float32)))
        cp.cuda.Stream.null.synchronize()  # the new inputs are written before the replay reads them
        graph.launch(stream=stream)
        stream.synchronize()
        e_out16, e_lse, e_dq, e_dk, e_dv = run(arrays, True, kernel_family)  # eager, on the same inputs
        cp.cuda.Stream.null.synchronize()
        # deterministic kernels agree bit for bit; dq is summed with atomics in any order
        assert bool((out16 == e_out16).all()) and bool((lse == e_lse).all())
        assert bool((dk == e_dk).all()) and bool((dv == e_dv).all())
        assert relative_error(dq, e_dq.get()) < 1e-5
        exact = [bf16_values(a).astype(np.float64) for a in arrays]
        assert relative_error(bf16_values(out16), reference(*exact, True)[0]) < OUT_TOL


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize(
    "b,t,s,hq,hkv",
    [
        (1, 1, 1, 2, 1),
        (2, 7, 7, 3, 1),
        (1, 129, 129, 4, 2),
        (1, 200, 300, 6, 2),
        (2, 512, 512, 12, 4),
        (1, 2048, 2048, 3, 1),
    ],
)
def test_three_consumer_forwards_give_the_two_consumer_bits(kernel_family, b, t, s, hq, hkv, causal):
    """FWD_CONSUMERS 3 (192-row work items, one P buffer), and with FWD_GQA_PACK 1 (64 positions of three
    query heads of one kv head an item, where the group is a multiple of 3), do each row's arithmetic in the
    same order as the default's two consumers, so out and lse keep their bits, and all are within the
    float64 bounds; partial items (T not a multiple of 192 or 64), T < S and a decode step included."""
    if kernel_family != "sm90":
        pytest.skip("a variant of the Hopper forward")
    rng = np.random.default_rng(7 * t + s)
    bits, exact = make_inputs(rng, b, t, s, hq, hkv, 64)
    q16, k16, v16 = (cp.asarray(x) for x in bits[:3])
    variants = [{"FWD_CONSUMERS": 2, "FWD_GQA_PACK": 0}, {"FWD_CONSUMERS": 3, "FWD_GQA_PACK": 0}]
    if (hq // hkv) % 3 == 0:
        variants.append({"FWD_CONSUMERS": 3, "FWD_GQA_PACK": 1})
    results = []
    for tuning in variants:
        out16, lse = cp.empty(q16.shape, cp.uint16), cp.empty((b, hq, t), cp.float32)
        flash_attention_sm90.forward(q16, k16, v16, causal, out16, lse, **tuning)
        results.append((out16.get(), lse.get()))
    want_out, want_lse = reference(*exact, causal)[:2]
    for tuning, (out16, lse) in zip(variants[1:], results[1:]):
        assert np.array_equal(out16, results[0][0]) and np.array_equal(lse, results[0][1]), tuning
        assert relative_error(bf16_values(out16), want_out) < OUT_TOL
        assert np.abs(lse - want_lse).max() < LSE_TOL


def test_dq_starts_from_zero_in_reused_memory(kernel_family):
    """The preprocessing kernel zeroes dq before the backward adds into it: memory that held NaNs (handed
    back by CuPy's pool to the next array of its size) gives the same dq as the first call."""
    rng = np.random.default_rng(11)
    bits, _ = make_inputs(rng, 1, 130, 130, 4, 2, 64)
    q16, k16, v16, g16 = (cp.asarray(b) for b in bits)
    out16, lse = flash_attention_forward_bf16(q16, k16, v16, True, kernel_family)
    want = flash_attention_backward_bf16(g16, q16, k16, v16, out16, lse, True, kernel_family)[0].get()
    junk = cp.full(q16.shape, cp.nan, dtype=cp.float32)
    del junk  # its block goes back to the pool, for the next array of dq's size
    dq = flash_attention_backward_bf16(g16, q16, k16, v16, out16, lse, True, kernel_family)[0]
    assert relative_error(dq, want) < 1e-5


def test_bad_inputs_raise(kernel_family):
    q16, small = cp.zeros((1, 4, 2, 64), cp.uint16), cp.zeros((1, 4, 2, 32), cp.uint16)
    with pytest.raises(ValueError, match="head_dim"):
        flash_attention_forward_bf16(small, small, small, True, kernel_family)
    with pytest.raises(ValueError, match="uint16"):
        flash_attention_forward_bf16(q16.astype(cp.float32), q16, q16, True, kernel_family)
    with pytest.raises(ValueError, match="T <= S"):
        flash_attention_forward_bf16(q16, q16[:, :3], q16[:, :3], True, kernel_family)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize(
    "t,s,hq,hkv",
    [
        (7, 7, 12, 1),
        (64, 64, 3, 1),
        (129, 129, 12, 12),
        (512, 512, 12, 4),
        (1, 2048, 12, 1),
        (200, 2048, 3, 1),
        (2048, 2048, 12, 1),
    ],
)
def test_issue_shapes_match_float64(kernel_family, t, s, hq, hkv, d):
    """The test matrix of issue 17 (T 7 to 2048, GQA 1, 3 and 12, T < S, decode T = 1), causal; T = 8192 is
    held against a float32 reference by benchmarks/bench_attention_gpu.py (float64 here would need GBs)."""
    rng = np.random.default_rng(7 * t + s + d)
    bits, exact = make_inputs(rng, 1, t, s, hq, hkv, d)
    check(bits, exact, True, kernel_family, f"T={t} S={s} Hq={hq} Hkv={hkv} D={d}: ")


def test_a_packed_forward_refuses_heads_that_do_not_share_a_kv_head(kernel_family):
    if kernel_family != "sm90":
        pytest.skip("a variant of the Hopper forward")
    q16, k16 = cp.zeros((1, 64, 4, 64), cp.uint16), cp.zeros((1, 64, 2, 64), cp.uint16)  # two heads a kv head
    out16, lse = cp.empty_like(q16), cp.empty((1, 4, 64), cp.float32)
    with pytest.raises(ValueError, match="multiple of 3 query heads"):
        flash_attention_sm90.forward(q16, k16, k16, True, out16, lse, FWD_CONSUMERS=3, FWD_GQA_PACK=1)
