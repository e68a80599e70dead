"""AdamW against steps worked out by hand (and PyTorch), global norm and clipping."""

from __future__ import annotations

import math

import numpy as np
import pytest

import euler_kernels as ek
from euler_kernels.optim.adamw import adamw_update
from euler_kernels.optim.grad_norm import clip_grad_norm, global_grad_norm


def test_adamw_two_steps_by_hand() -> None:
    p, m, v = np.array([1.0]), np.array([0.0]), np.array([0.0])
    lr, b1, b2, eps, wd = 0.1, 0.9, 0.95, 1e-8, 0.1
    adamw_update(p, m, v, np.array([0.5]), 1, lr, b1, b2, eps, wd)
    # step 1: m = 0.05, v = 0.0125; m_hat = 0.5, v_hat = 0.25; p = 1 - 0.1*0.1*1 - 0.1 * 0.5 / (0.5 + 1e-8)
    assert m[0] == pytest.approx(0.05, rel=1e-15) and v[0] == pytest.approx(0.0125, rel=1e-15)
    p1 = 1.0 - 0.01 - 0.1 * 0.5 / (0.5 + 1e-8)
    assert p[0] == pytest.approx(p1, rel=1e-14)
    adamw_update(p, m, v, np.array([-1.0]), 2, lr, b1, b2, eps, wd)
    # step 2: m = 0.045 - 0.1 = -0.055, v = 0.011875 + 0.05 = 0.061875; corrections 0.19 and 0.0975
    assert m[0] == pytest.approx(-0.055, rel=1e-14) and v[0] == pytest.approx(0.061875, rel=1e-14)
    p2 = p1 - 0.1 * 0.1 * p1 - 0.1 * (-0.055 / 0.19) / (math.sqrt(0.061875 / 0.0975) + 1e-8)
    assert p[0] == pytest.approx(p2, rel=1e-14)


def test_adamw_updates_in_place_and_keeps_dtype() -> None:
    rng = np.random.default_rng(0)
    p = rng.standard_normal((3, 4)).astype(np.float32)
    m, v = np.zeros_like(p), np.zeros_like(p)
    ids = (id(p), id(m), id(v))
    before = p.copy()
    assert adamw_update(p, m, v, rng.standard_normal((3, 4)).astype(np.float32), 1, 1e-3) is None
    assert (id(p), id(m), id(v)) == ids and p.dtype == m.dtype == v.dtype == np.float32
    assert not np.array_equal(p, before) and m.any() and v.any()


def test_adamw_matches_torch_over_several_steps() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    p0 = rng.standard_normal(10)
    grads = rng.standard_normal((5, 10))
    p, m, v = p0.copy(), np.zeros(10), np.zeros(10)
    tp = torch.tensor(p0, requires_grad=True)
    opt = torch.optim.AdamW([tp], lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for step, g in enumerate(grads, start=1):
        adamw_update(p, m, v, g, step, 3e-3, 0.9, 0.95, 1e-8, 0.1)
        tp.grad = torch.tensor(g)
        opt.step()
    np.testing.assert_allclose(p, tp.detach().numpy(), rtol=1e-12, atol=1e-14)


def test_global_grad_norm_of_known_arrays() -> None:
    grads = [np.array([3.0, 0.0]), np.array([[4.0]]), np.zeros((0,))]
    assert global_grad_norm(grads) == 5.0
    assert global_grad_norm({"a": np.array([1.0, 2.0, 2.0])}) == 3.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_clip_scales_exactly_to_max_norm(dtype) -> None:
    rng = np.random.default_rng(2)
    grads = {"w": rng.standard_normal((4, 5)).astype(dtype) * 10, "b": rng.standard_normal(5).astype(dtype)}
    before = {k: g.copy() for k, g in grads.items()}
    norm = clip_grad_norm(grads, 1.0)
    assert norm == pytest.approx(
        math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in before.values()))
    )
    assert global_grad_norm(grads) == pytest.approx(1.0, rel=1e-6 if dtype == np.float32 else 1e-14)
    for k in grads:  # every array scaled by the same factor
        np.testing.assert_allclose(grads[k], before[k] / norm, rtol=1e-6 if dtype == np.float32 else 1e-14)


def test_clip_leaves_small_gradients_alone() -> None:
    grads = [np.array([0.3, 0.4])]
    assert clip_grad_norm(grads, 1.0) == pytest.approx(0.5)
    assert grads[0].tolist() == [0.3, 0.4]


def test_the_control_path_equals_torch_adamw_with_clipping_and_skips_non_finite() -> None:
    """sum_squares_many -> step_control -> adamw_update_ctl, the trainer's step on the CPU, equals
    torch's clip_grad_norm_ + AdamW (to the float32 precision of the control vector); a NaN loss or a
    disabled step changes nothing."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    shapes = [(6, 4), (4,)]
    p0 = [rng.standard_normal(s) for s in shapes]
    params, ms, vs = [a.copy() for a in p0], [np.zeros(s) for s in shapes], [np.zeros(s) for s in shapes]
    tp = [torch.tensor(a, requires_grad=True) for a in p0]
    decays = [0.1, 0.0]
    torch_groups = [{"params": [tp[0]], "weight_decay": 0.1}, {"params": [tp[1]], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(torch_groups, lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    for step in range(1, 6):
        grads = [rng.standard_normal(s) * 3 for s in shapes]
        control = ek.step_control(
            ek.sum_squares_many(grads), np.float32(1.0), ek.adamw_hyper(3e-3, step, 0.9, 0.95), max_norm=1.0
        )
        ek.adamw_update_ctl(params, ms, vs, grads, decays, control, 0.9, 0.95, 1e-8)
        for t, g in zip(tp, grads):
            t.grad = torch.tensor(g)
        norm = torch.nn.utils.clip_grad_norm_(tp, 1.0)
        assert float(control[5]) == pytest.approx(float(norm), rel=1e-6)
        opt.step()
    for got, want in zip(params, tp):
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-6, atol=1e-9)
    before = [a.copy() for a in params + ms + vs]
    for loss, enable in ((np.float32("nan"), True), (np.float32(1.0), False)):
        hyper = ek.adamw_hyper(3e-3, 6, 0.9, 0.95, enable)
        control = ek.step_control(ek.sum_squares_many(grads), loss, hyper, max_norm=1.0)
        assert control[1] == 0.0
        ek.adamw_update_ctl(params, ms, vs, grads, decays, control, 0.9, 0.95, 1e-8)
        assert all(np.array_equal(a, b) for a, b in zip(params + ms + vs, before))
