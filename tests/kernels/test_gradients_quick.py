"""Quick float64 finite-difference checks of every op on fixed small inputs: the cases of euler-kernels'
one table (euler_kernels.op_checks.gradcheck_cases, also run by `python -m euler_kernels.check` and
`euler-train check`); the hypothesis suite in test_gradients_hypothesis.py explores shapes and values much
more widely."""

from __future__ import annotations

import numpy as np
import pytest

from euler_kernels.gradcheck import gradcheck
from euler_kernels.op_checks import gradcheck_cases

TOL = 1e-6
NAMES = [label for label, *_ in gradcheck_cases(np.random.default_rng(0))]


def case(name: str, seed: int) -> tuple:
    """(forward, backward, inputs, wrt) of the named case, inputs drawn with this seed."""
    return next(rest for label, *rest in gradcheck_cases(np.random.default_rng(seed)) if label == name)


@pytest.mark.parametrize("name", NAMES)
def test_backward_matches_finite_differences(name: str) -> None:
    forward, backward, inputs, wrt = case(name, seed=1)
    report = gradcheck(forward, backward, inputs, wrt=wrt)
    report.raise_if_bad(TOL)
    assert report.inputs and all(r.checked > 0 for r in report.inputs)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forward_and_backward_preserve_dtype(name: str, dtype: type) -> None:
    forward, backward, inputs, _ = case(name, seed=2)
    cast = {
        k: (v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
        for k, v in inputs.items()
    }
    out, cache = forward(**cast)
    assert out.dtype == dtype
    grads = backward(np.ones_like(out), cache)
    for g in grads if isinstance(grads, tuple) else (grads,):
        assert g.dtype == dtype
