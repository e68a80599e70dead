"""AdamW over a params dict: matches a float64 reference, decays matrices only, saves its moments."""

from __future__ import annotations

import numpy as np
import pytest

from euler_train.optimizer import AdamW


def reference_adamw(p, g_list, lr, b1, b2, eps, wd):
    """Textbook AdamW (decoupled decay) in float64, one parameter."""
    p = p.astype(np.float64).copy()
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(g_list, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr * wd * p - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    return p


def test_matches_reference_and_decays_only_matrices() -> None:
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((3, 4)), "norm": rng.standard_normal(4)}
    start = {k: v.copy() for k, v in params.items()}
    grads = [{k: rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(5)]
    opt = AdamW(params, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    for g in grads:
        opt.step(params, g, lr=0.01)
    assert opt.t == 5
    np.testing.assert_allclose(
        params["w"],
        reference_adamw(start["w"], [g["w"] for g in grads], 0.01, 0.9, 0.95, 1e-8, 0.1),
        rtol=1e-12,
    )
    np.testing.assert_allclose(
        params["norm"],
        reference_adamw(start["norm"], [g["norm"] for g in grads], 0.01, 0.9, 0.95, 1e-8, 0.0),
        rtol=1e-12,
    )


def test_state_round_trip_continues_identically() -> None:
    rng = np.random.default_rng(1)
    p1 = {"w": rng.standard_normal((2, 2)).astype(np.float32), "b": rng.standard_normal(2).astype(np.float32)}
    p2 = {k: v.copy() for k, v in p1.items()}
    grads = [{k: rng.standard_normal(v.shape).astype(np.float32) for k, v in p1.items()} for _ in range(4)]
    a = AdamW(p1, weight_decay=0.1)
    for g in grads:
        a.step(p1, g, 1e-2)
    b = AdamW(p2, weight_decay=0.1)
    for g in grads[:2]:
        b.step(p2, g, 1e-2)
    saved = {k: v.copy() for k, v in b.state_tensors().items()}
    c = AdamW(p2, weight_decay=0.1)
    c.load_state_tensors(saved, b.t, np)
    for g in grads[2:]:
        c.step(p2, g, 1e-2)
    for k in p1:
        np.testing.assert_array_equal(p1[k], p2[k])


def test_load_rejects_missing_or_misshapen_moments() -> None:
    opt = AdamW({"w": np.zeros((2, 2))})
    with pytest.raises(ValueError, match=r"m\.w expected \(2, 2\), got missing"):
        opt.load_state_tensors({}, 1, np)
    with pytest.raises(ValueError, match=r"v\.w expected \(2, 2\), got \(3,\)"):
        opt.load_state_tensors({"m.w": np.zeros((2, 2)), "v.w": np.zeros(3)}, 1, np)
