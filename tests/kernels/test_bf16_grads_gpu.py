"""bf16 weight gradients (train.bf16_grads) on the GPU: the products write dweight as bf16, and the
multi-tensor kernels (sum of squares, AdamW, the micro-batch sums) read each gradient as float32 or bf16.

A bf16 gradient stands for exactly the float32 value of its bits, so every kernel that reads one must give
bit for bit what it gives for that float32 value; the products' bf16 dweight is the float32 product rounded
once (against a float64 reference)."""

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek
from euler_kernels.testing import bf16_bits, bf16_values, relative_error

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

from euler_kernels.cuda import cast, tables  # noqa: E402

SHAPES = [(3 * 8192 + 5,), (37, 3), (1,), (64, 64), (8192 + 2,)]  # tails, one element, whole chunks


def _at_offset(values, offset: int):
    """values on the device, `offset` elements past the start of their allocation (offset > 0: no vector
    loads)."""
    base = cp.zeros(values.size + offset, values.dtype)
    base[offset:] = cp.asarray(values.reshape(-1))
    return base[offset:].reshape(values.shape)


def _mixed_grads(rng, offset: int) -> tuple[list, list]:
    """Gradients of SHAPES, every other one bf16 (on the device) and the same values as float32 arrays;
    offset > 0 puts each array that many elements past its allocation's start (no vector loads)."""
    dev, ref = [], []
    for i, shape in enumerate(SHAPES):
        values = rng.standard_normal(shape).astype(np.float32)
        if i % 2 == 0:
            bits = bf16_bits(values)
            dev.append(_at_offset(bits, offset))
            ref.append(bf16_values(bits))
        else:
            dev.append(_at_offset(values, offset))
            ref.append(values)
    return dev, ref


@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "unaligned"])
def test_sum_squares_reads_bf16_and_float32_gradients(offset: int) -> None:
    dev, ref = _mixed_grads(np.random.default_rng(1), offset)
    want = sum(float((r.astype(np.float64) ** 2).sum()) for r in ref)
    got = float(ek.sum_squares_many(dev)[0])
    assert abs(got - want) <= 1e-12 * want
    as_float32 = [cp.asarray(r) for r in ref]
    assert got == float(ek.sum_squares_many(as_float32)[0])  # the same chunks, in the same order


@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "unaligned"])
def test_adamw_with_bf16_gradients_equals_adamw_with_their_float32_values(offset: int) -> None:
    rng = np.random.default_rng(2)
    grads, ref = _mixed_grads(rng, offset)
    start = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(3)]
    start[2] = [np.abs(v) for v in start[2]]
    runs = []  # the float32 values at the same offsets: the same vector or one-at-a-time path
    for gs in (grads, [_at_offset(r, offset) for r in ref]):
        p, m, v = ([cp.asarray(a) for a in group] for group in start)
        copies = [cp.zeros(s, cp.uint16) for s in SHAPES]
        control = cp.asarray(np.array([0.7, 1.0, 2e-3, 1 - 0.9**3, 1 - 0.95**3, 0.0], np.float32))
        ek.adamw_update_ctl(p, m, v, gs, [0.1] * len(SHAPES), control, 0.9, 0.95, 1e-8, copies=copies)
        runs.append([a.get() for a in (*p, *m, *v, *copies)])
        p2, m2, v2 = ([cp.asarray(a) for a in group] for group in start)
        ek.adamw_update_many(p2, m2, v2, gs, step=3, lr=1e-3, weight_decays=[0.1] * len(SHAPES))
        runs[-1] += [a.get() for a in (*p2, *m2, *v2)]
    for got, want in zip(*runs):
        np.testing.assert_array_equal(got, want)


def test_micro_batch_sums_read_bf16_gradients() -> None:
    rng = np.random.default_rng(3)
    shares = [cp.asarray(np.float32(0.3)), cp.asarray(np.float32(0.7))]
    sums = [[cp.zeros(s, cp.float32) for s in SHAPES] for _ in range(2)]
    for i, share in enumerate(shares):
        grads, ref = _mixed_grads(rng, offset=i)
        ek.accumulate_scaled_many(sums[0], grads, share, accumulate=i > 0)
        ek.accumulate_scaled_many(sums[1], [cp.asarray(r) for r in ref], share, accumulate=i > 0)
    for got, want in zip(*sums):
        np.testing.assert_array_equal(got.get(), want.get())


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_linear_backward_writes_bf16_weight_gradients(precision: str) -> None:
    """dweight in bf16 is the float32 dweight of the same products rounded once: within a bf16 rounding of
    the float32 one, and as close to a float64 reference of the rounded operands."""
    rng = np.random.default_rng(4)
    x = cp.asarray(rng.standard_normal((256, 128)).astype(np.float32))
    w = cp.asarray((0.05 * rng.standard_normal((192, 128))).astype(np.float32))
    dout = cp.asarray(rng.standard_normal((256, 192)).astype(np.float32))
    weight = ek.fp8_weights([w])[0] if precision == "fp8" else w
    _, cache = ek.linear_forward(x, weight, precision=ek.Precision(precision))
    _, dw32 = ek.linear_backward(dout, cache)
    _, dw16 = ek.linear_backward(dout, cache, bf16_dweight=True)
    assert dw16.dtype == cp.uint16 and dw16.shape == (192, 128) and dw32.dtype == cp.float32
    got = bf16_values(dw16)
    assert np.all(np.abs(got - dw32.get()) <= 2.0**-8 * np.abs(dw32.get()) + 1e-30)
    if precision == "bf16":  # the float64 product of the operands as rounded to bf16
        d64 = bf16_values(cast.to_bf16(dout)).astype(np.float64)
        x64 = bf16_values(cast.to_bf16(x)).astype(np.float64)
        assert relative_error(got, d64.T @ x64) < 4e-3
        dw_alone = ek.linear_weight_grad(dout, cache, bf16_dweight=True)
        np.testing.assert_array_equal(dw_alone.get(), dw16.get())


def test_bf16_dweight_is_refused_for_float32_products() -> None:
    x, w = cp.ones((4, 8), cp.float32), cp.ones((3, 8), cp.float32)
    _, cache = ek.linear_forward(x, w, precision=ek.Precision("fp32"))
    with pytest.raises(ValueError, match="bf16_dweight needs a bf16"):
        ek.linear_backward(cp.ones((4, 3), cp.float32), cache, bf16_dweight=True)


def test_the_flag_tables_follow_each_list() -> None:
    """The same addresses as bf16 and as float32 (a pool hands them out again) get their own flags."""
    a = cp.zeros(10, cp.float32)
    b = a.view(cp.uint16)[:10]
    assert tables.bf16_table([a]).get().tolist() == [0]
    assert tables.bf16_table([b]).get().tolist() == [1]


def test_muon_refuses_bf16_gradients() -> None:
    p, m = cp.zeros((4, 4), cp.float32), cp.zeros((4, 4), cp.float32)
    control, hyper = cp.asarray(np.array([1, 1, 0, 0, 0, 0], np.float32)), cp.zeros(1, cp.float32)
    with pytest.raises(ValueError, match="needs float32 gradients"):
        ek.muon_update([p], [m], [cp.zeros((4, 4), cp.uint16)], control, hyper, lr_slot=0)
