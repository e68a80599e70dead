"""Quick float64 finite-difference checks of every op on fixed small inputs (the hypothesis suite
in test_gradients_hypothesis.py explores shapes and values much more widely)."""

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek
from euler_kernels.gradcheck import gradcheck

TOL = 1e-6


def _r(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return rng.standard_normal(shape) * scale


def _cases(rng: np.random.Generator) -> dict[str, tuple]:
    cos, sin = ek.rope_tables(6, 10, dtype=np.float64)
    tokens = np.array([[1, 2, 1], [6, 0, 1]])
    targets = np.array([[1, -100, 3], [6, 0, 2]])
    emb = {"weight": _r(rng, 7, 5), "tokens": tokens}
    return {
        "embedding": (ek.embedding_forward, ek.embedding_backward, emb, None),
        "rmsnorm": (
            ek.rmsnorm_forward,
            ek.rmsnorm_backward,
            {"x": _r(rng, 2, 3, 5), "weight": _r(rng, 5)},
            None,
        ),
        "linear": (
            ek.linear_forward,
            ek.linear_backward,
            {"x": _r(rng, 2, 3, 5), "weight": _r(rng, 4, 5)},
            None,
        ),
        "rope": (
            ek.rope_forward,
            ek.rope_backward,
            {"x": _r(rng, 2, 3, 2, 6), "cos": cos, "sin": sin, "offset": 4},
            ["x"],
        ),
        "swiglu": (
            ek.swiglu_forward,
            ek.swiglu_backward,
            {"gate": _r(rng, 2, 3, 5, scale=3.0), "up": _r(rng, 2, 3, 5)},
            None,
        ),
        "residual": (
            ek.residual_forward,
            ek.residual_backward,
            {"x": _r(rng, 2, 3), "branch": _r(rng, 2, 3)},
            None,
        ),
        "cross_entropy": (
            ek.cross_entropy_forward,
            ek.cross_entropy_backward,
            {
                "logits": _r(rng, 2, 3, 7),
                "targets": targets,
                "loss_mask": np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]),
            },
            ["logits"],
        ),
        "attention_gqa": (
            ek.attention_forward,
            ek.attention_backward,
            {"q": _r(rng, 2, 5, 4, 4), "k": _r(rng, 2, 5, 2, 4), "v": _r(rng, 2, 5, 2, 4), "block_size": 2},
            None,
        ),
        "attention_kv_cache": (
            ek.attention_forward,
            ek.attention_backward,
            {"q": _r(rng, 2, 3, 2, 4), "k": _r(rng, 2, 7, 1, 4), "v": _r(rng, 2, 7, 1, 4), "block_size": 3},
            None,
        ),
    }


@pytest.mark.parametrize("name", list(_cases(np.random.default_rng(0))))
def test_backward_matches_finite_differences(name: str) -> None:
    forward, backward, inputs, wrt = _cases(np.random.default_rng(1))[name]
    report = gradcheck(forward, backward, inputs, wrt=wrt)
    report.raise_if_bad(TOL)
    assert report.inputs and all(r.checked > 0 for r in report.inputs)


@pytest.mark.parametrize("name", list(_cases(np.random.default_rng(0))))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forward_and_backward_preserve_dtype(name: str, dtype: type) -> None:
    forward, backward, inputs, _ = _cases(np.random.default_rng(2))[name]
    cast = {
        k: (v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
        for k, v in inputs.items()
    }
    out, cache = forward(**cast)
    assert out.dtype == dtype
    grads = backward(np.ones_like(out), cache)
    for g in grads if isinstance(grads, tuple) else (grads,):
        assert g.dtype == dtype
