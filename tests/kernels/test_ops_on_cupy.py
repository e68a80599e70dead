"""The same op code on CuPy arrays: results match the NumPy path and stay on the GPU (needs CUDA)."""

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek
from euler_kernels.gradcheck import gradcheck
from euler_kernels.optim.adamw import adamw_update
from euler_kernels.optim.grad_norm import clip_grad_norm, global_grad_norm
from euler_kernels.residual.residual import residual_backward, residual_forward

pytestmark = pytest.mark.gpu


def _np_cases(rng: np.random.Generator) -> dict[str, tuple]:
    r = rng.standard_normal
    cos, sin = ek.rope_tables(8, 40, dtype=np.float64)
    targets = rng.integers(0, 11, (2, 33))
    targets[0, :5] = -100
    return {
        "embedding": (ek.embedding_forward, ek.embedding_backward,
                      (r((11, 6)), rng.integers(0, 11, (2, 33)))),
        "rmsnorm": (ek.rmsnorm_forward, ek.rmsnorm_backward, (r((2, 33, 8)), r(8))),
        "linear": (ek.linear_forward, ek.linear_backward, (r((2, 33, 8)), r((5, 8)))),
        "rope": (ek.rope_forward, ek.rope_backward, (r((2, 33, 3, 8)), cos, sin, 4)),
        "attention": (ek.attention_forward, ek.attention_backward,
                      (r((2, 33, 4, 8)), r((2, 40, 2, 8)), r((2, 40, 2, 8)), True, 16)),
        "swiglu": (ek.swiglu_forward, ek.swiglu_backward, (r((2, 33, 8)) * 4, r((2, 33, 8)))),
        "residual": (residual_forward, residual_backward, (r((2, 33, 8)), r((2, 33, 8)))),
        "cross_entropy": (ek.cross_entropy_forward, ek.cross_entropy_backward,
                          (r((2, 33, 11)) * 100, targets, (rng.random((2, 33)) < 0.8).astype(np.float64))),
    }  # fmt: skip


def _grads(g) -> tuple:
    return g if isinstance(g, tuple) else (g,)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 2e-4)])
@pytest.mark.parametrize("name", list(_np_cases(np.random.default_rng(0))))
def test_op_on_cupy_matches_numpy(name: str, dtype, tol: float) -> None:
    cp = pytest.importorskip("cupy")
    fwd, bwd, args = _np_cases(np.random.default_rng(1))[name]
    args = [a.astype(dtype) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args]
    dev = [cp.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
    out, cache = fwd(*args)
    out_d, cache_d = fwd(*dev)
    assert isinstance(out_d, cp.ndarray) and out_d.dtype == dtype
    np.testing.assert_allclose(cp.asnumpy(out_d), out, rtol=tol, atol=tol)
    dout = np.random.default_rng(2).standard_normal(out.shape).astype(dtype) if out.shape else dtype(1.0)
    dout_d = cp.asarray(dout) if out.shape else dout
    for g, g_d in zip(_grads(bwd(dout, cache)), _grads(bwd(dout_d, cache_d))):
        assert isinstance(g_d, cp.ndarray) and g_d.dtype == dtype
        np.testing.assert_allclose(cp.asnumpy(g_d), g, rtol=tol, atol=tol)


def test_gradcheck_runs_on_cupy_inputs() -> None:
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(3)
    inputs = {k: cp.asarray(rng.standard_normal(s)) for k, s in (("q", (1, 5, 2, 4)), ("k", (1, 5, 1, 4)),
                                                                    ("v", (1, 5, 1, 4)))}  # fmt: skip
    gradcheck(ek.attention_forward, ek.attention_backward, inputs, max_samples=20).raise_if_bad(1e-6)


def test_adamw_and_clipping_on_cupy() -> None:
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(4)
    p, g = rng.standard_normal(50), rng.standard_normal(50) * 10
    p_d, m_d, v_d, g_d = cp.asarray(p), cp.zeros(50), cp.zeros(50), cp.asarray(g)
    m, v = np.zeros(50), np.zeros(50)
    for step in (1, 2, 3):
        adamw_update(p, m, v, g, step, 1e-2, weight_decay=0.1)
        adamw_update(p_d, m_d, v_d, g_d, step, 1e-2, weight_decay=0.1)
    np.testing.assert_allclose(cp.asnumpy(p_d), p, rtol=1e-12)
    assert clip_grad_norm([g_d], 1.0) == pytest.approx(np.linalg.norm(g))
    assert global_grad_norm([g_d]) == pytest.approx(1.0)
