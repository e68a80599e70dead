"""The reusable pieces: gradcheck / gradcheck_scalar catch wrong backwards, the check CLI, the
hypothesis strategies, and `import euler_kernels` not needing hypothesis."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import find, given
from hypothesis import strategies as st

import euler_kernels as ek
from euler_kernels import check
from euler_kernels.gradcheck import gradcheck, gradcheck_scalar
from euler_kernels.testing import (
    attention_shapes,
    float_arrays,
    head_counts,
    head_dims,
    large_logits,
    loss_masks,
)


def _cube_forward(x):
    return x**3, x


def _rmsnorm_with_bug(scale: float):
    def backward(dout, cache):
        dx, dw = ek.rmsnorm_backward(dout, cache)
        dw = dw.copy()
        dw[1] *= scale  # one element of one input slightly wrong
        return dx, dw

    return backward


def test_gradcheck_passes_a_correct_user_op() -> None:
    report = gradcheck(_cube_forward, lambda dout, x: dout * 3 * x**2, {"x": np.linspace(-2, 2, 7)})
    assert report.ok(1e-6) and report.inputs[0].checked == 7 and report.max_error() < 1e-6


@pytest.mark.parametrize("scale", [1 + 1e-5, 1 + 5e-6, 1.1])
def test_gradcheck_catches_a_slightly_wrong_element(scale: float) -> None:
    rng = np.random.default_rng(0)
    inputs = {"x": rng.standard_normal((3, 4)), "weight": rng.standard_normal(4)}
    report = gradcheck(ek.rmsnorm_forward, _rmsnorm_with_bug(scale), inputs)
    assert report.inputs[0].max_excess_error < 1e-6  # x is right
    assert not report.ok(1e-6)
    with pytest.raises(AssertionError, match=r"input 'weight' \(4,\).*element \(1,\)"):
        report.raise_if_bad(1e-6)


def test_gradcheck_accepts_dict_gradients_and_wrt_subsets() -> None:
    rng = np.random.default_rng(1)
    inputs = {"x": rng.standard_normal((2, 3)), "weight": rng.standard_normal((4, 3))}

    def backward(dout, cache):
        dx, dw = ek.linear_backward(dout, cache)
        return {"weight": dw, "x": dx}

    assert [r.name for r in gradcheck(ek.linear_forward, backward, inputs).inputs] == ["x", "weight"]
    report = gradcheck(ek.linear_forward, ek.linear_backward, inputs, wrt=["weight"])
    assert [r.name for r in report.inputs] == ["weight"] and report.ok()


def test_gradcheck_samples_large_inputs_and_copies_to_float64() -> None:
    x = np.random.default_rng(2).standard_normal((50, 40)).astype(np.float32)
    seen = []

    def forward(x):
        seen.append(x.dtype)
        return x * 2.0, None

    report = gradcheck(forward, lambda dout, cache: dout * 2.0, {"x": x}, max_samples=30)
    assert report.inputs[0].checked == 30 and report.ok()
    assert set(seen) == {np.dtype(np.float64)} and x.dtype == np.float32  # the caller's array untouched


def test_gradcheck_rejects_wrong_gradient_shape() -> None:
    with pytest.raises(ValueError, match="gradient for 'x' has shape"):
        gradcheck(_cube_forward, lambda dout, x: dout[:1], {"x": np.ones(3)})


def test_gradcheck_scalar_whole_function() -> None:
    rng = np.random.default_rng(3)
    params = {"w": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}
    x = rng.standard_normal((5, 3))

    def loss(p):
        return float(np.sum(np.tanh(x @ p["w"] + p["b"]) ** 2))

    h = np.tanh(x @ params["w"] + params["b"])
    g = 2 * h * (1 - h**2)  # d loss / d pre-activation
    grads = {"w": x.T @ g, "b": g.sum(0)}
    assert gradcheck_scalar(loss, params, grads).ok(1e-6)
    bad = gradcheck_scalar(loss, params, {"w": grads["w"], "b": grads["b"] * 1.001})
    assert not bad.ok(1e-6) and bad.inputs[0].max_excess_error < 1e-6
    assert "FAIL" in bad.table() and "b" in bad.table()


def test_check_cli_prints_every_op_and_succeeds(capsys) -> None:
    assert check.main([]) == 0
    out = capsys.readouterr().out
    for op in ("embedding", "rmsnorm", "linear", "rope", "attention", "swiglu", "residual", "cross_entropy"):
        assert op in out
    assert "FAIL" not in out and "all ops OK" in out


def test_check_runs_as_module() -> None:
    proc = subprocess.run([sys.executable, "-m", "euler_kernels.check", "--tol", "1e-6"], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("OK") >= 18


def test_import_does_not_need_hypothesis_or_cupy() -> None:
    code = "import sys, euler_kernels; print('hypothesis' in sys.modules, 'cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_require_cuda_explains_when_absent() -> None:
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match=r"euler-kernels\[gpu\]"):
            ek.require_cuda()
    assert ek.get_array_module(np.zeros(1)) is np and ek.to_numpy(np.ones(2)).tolist() == [1.0, 1.0]


@given(shape=attention_shapes(max_len=6, max_kv_heads=2, max_groups=3, max_head_dim=6))
def test_attention_shapes_are_valid(shape) -> None:
    assert 1 <= shape.seq_len <= shape.kv_len <= 6 and shape.n_heads % shape.n_kv_heads == 0
    assert shape.head_dim % 2 == 0 and shape.q[2] == shape.n_heads and shape.kv[1] == shape.kv_len


def test_strategies_reach_the_edge_cases() -> None:
    assert find(head_dims(), lambda d: d == 2) == 2
    assert find(head_counts(), lambda h: h[1] == 1 and h[0] > 1) == (2, 1)  # multi-query attention
    assert find(head_counts(), lambda h: h[0] == h[1] > 1) == (2, 2)  # plain multi-head attention
    assert not find(loss_masks((2, 3)), lambda m: not m.any()).any()  # an all-zero mask is drawn
    assert find(loss_masks((2, 3)), lambda m: m.all()).all()  # and an all-one mask
    assert np.abs(find(large_logits((4, 5)), lambda a: np.abs(a).max() > 1e3)).max() > 1e3
    big = find(float_arrays((3,), max_magnitude=1e4), lambda a: np.abs(a).max() >= 1e4)
    assert np.abs(big).max() == 1e4


@given(st.data())
def test_cross_entropy_with_strategy_values(data) -> None:
    # a user's test built from the strategies: loss is finite and non-negative for any logits and masks
    logits = data.draw(float_arrays((3, 7), max_magnitude=1e4))
    mask = data.draw(loss_masks((3,)))
    loss, cache = ek.cross_entropy_forward(logits, np.array([0, 3, 6]), mask)
    assert np.isfinite(loss) and loss >= 0 and np.isfinite(ek.cross_entropy_backward(1.0, cache)).all()
