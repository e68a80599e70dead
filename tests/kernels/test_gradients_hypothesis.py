"""Hypothesis-driven float64 gradient checks: every op, every differentiable input.

The criterion, from euler_kernels.gradcheck: with h = (x_i + 1e-6) - x_i, n_i the central difference
(f(x + h e_i) - f(x - h e_i)) / 2h and res_i its float64 rounding resolution
8 * 2**-52 * max(|f+| + |f-|, 1) / 2h,

    err_i = max(0, |a_i - n_i| - res_i) / max(|a_i|, |n_i|, 1e-3 * max_j |n_j|, 1e-6)

and every input must satisfy max_i err_i <= 1e-6.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import euler_kernels as ek
from euler_kernels.gradcheck import gradcheck, gradcheck_scalar
from euler_kernels.optim.grad_norm import global_grad_norm
from euler_kernels.residual.residual import residual_backward, residual_forward
from euler_kernels.testing import (
    attention_shapes,
    batch_sizes,
    head_dims,
    large_logits,
    loss_masks,
    normal_arrays,
    seq_lens,
    shapes,
    vocab_sizes,
)

TOL = 1e-6
SAMPLES = 96  # elements checked per input at most (random sample beyond that)


def _check(forward, backward, inputs, wrt=None) -> None:
    report = gradcheck(forward, backward, inputs, wrt=wrt, max_samples=SAMPLES)
    report.raise_if_bad(TOL)


@given(data=st.data(), v=vocab_sizes(max_value=12), c=st.integers(1, 6), b=batch_sizes(), t=seq_lens(6))
def test_embedding(data, v, c, b, t) -> None:
    tokens = data.draw(st.lists(st.integers(0, v - 1), min_size=b * t, max_size=b * t))
    weight = data.draw(normal_arrays((v, c)))
    _check(
        ek.embedding_forward, ek.embedding_backward, {"weight": weight, "tokens": np.reshape(tokens, (b, t))}
    )


@given(data=st.data(), shape=shapes(1, 3, 6), eps=st.sampled_from([1e-5, 1e-6]))
def test_rmsnorm(data, shape, eps) -> None:
    x = data.draw(normal_arrays(shape, scales=(0.1, 1.0, 10.0)))
    weight = data.draw(normal_arrays((shape[-1],)))
    _check(ek.rmsnorm_forward, ek.rmsnorm_backward, {"x": x, "weight": weight, "eps": eps})


@given(data=st.data(), lead=shapes(1, 2, 4), c_in=st.integers(1, 6), c_out=st.integers(1, 6))
def test_linear(data, lead, c_in, c_out) -> None:
    x = data.draw(normal_arrays((*lead, c_in)))
    weight = data.draw(normal_arrays((c_out, c_in)))
    _check(ek.linear_forward, ek.linear_backward, {"x": x, "weight": weight})


@given(
    data=st.data(),
    b=batch_sizes(2),
    t=seq_lens(5),
    h=st.integers(1, 3),
    d=head_dims(8),
    offset=st.integers(0, 20),
    theta=st.sampled_from([10000.0, 500000.0, 10.0]),
)
def test_rope(data, b, t, h, d, offset, theta) -> None:
    cos, sin = ek.rope_tables(d, offset + t + data.draw(st.integers(0, 3)), theta=theta, dtype=np.float64)
    x = data.draw(normal_arrays((b, t, h, d)))
    _check(ek.rope_forward, ek.rope_backward, {"x": x, "cos": cos, "sin": sin, "offset": offset}, wrt=["x"])


@given(data=st.data(), shape=attention_shapes(), causal=st.booleans(), block=st.sampled_from([1, 2, 3, 128]))
def test_attention(data, shape, causal, block) -> None:
    q = data.draw(normal_arrays(shape.q, scales=(0.3, 1.0, 2.0)))
    k = data.draw(normal_arrays(shape.kv, scales=(0.3, 1.0, 2.0)))
    v = data.draw(normal_arrays(shape.kv))
    inputs = {"q": q, "k": k, "v": v, "causal": causal, "block_size": block}
    _check(ek.attention_forward, ek.attention_backward, inputs)


@given(data=st.data(), shape=shapes(1, 3, 6))
def test_swiglu(data, shape) -> None:
    gate = data.draw(normal_arrays(shape, scales=(0.1, 1.0, 5.0, 40.0)))
    up = data.draw(normal_arrays(shape))
    _check(ek.swiglu_forward, ek.swiglu_backward, {"gate": gate, "up": up})


@given(data=st.data(), shape=shapes(1, 3, 6))
def test_residual(data, shape) -> None:
    x, branch = data.draw(normal_arrays(shape)), data.draw(normal_arrays(shape))
    _check(residual_forward, residual_backward, {"x": x, "branch": branch})


@given(data=st.data(), lead=shapes(1, 2, 5), v=vocab_sizes(2, 16), use_mask=st.booleans())
def test_cross_entropy(data, lead, v, use_mask) -> None:
    logits = data.draw(large_logits((*lead, v)))
    targets = data.draw(
        st.lists(st.sampled_from([*range(v), -100]), min_size=int(np.prod(lead)), max_size=int(np.prod(lead)))
    )
    mask = data.draw(loss_masks(lead)) if use_mask else None
    inputs = {"logits": logits, "targets": np.reshape(targets, lead), "loss_mask": mask}
    _check(ek.cross_entropy_forward, ek.cross_entropy_backward, inputs, wrt=["logits"])


@given(data=st.data(), shape=shapes(1, 3, 6), eps=st.sampled_from([1e-5, 1e-6]))
def test_residual_rmsnorm(data, shape, eps) -> None:
    # two outputs (s, out): check the gradient of <s, gs> + <out, go> for random gs, go
    inputs = {
        "x": data.draw(normal_arrays(shape)),
        "branch": data.draw(normal_arrays(shape, scales=(0.1, 1.0, 10.0))),
        "weight": data.draw(normal_arrays((shape[-1],))),
    }
    gs, go = data.draw(normal_arrays(shape)), data.draw(normal_arrays(shape))

    def loss(p):
        (s, out), _ = ek.residual_rmsnorm_forward(p["x"], p["branch"], p["weight"], eps)
        return float((s * gs).sum() + (out * go).sum())

    _, cache = ek.residual_rmsnorm_forward(inputs["x"], inputs["branch"], inputs["weight"], eps)
    dx, dweight = ek.residual_rmsnorm_backward(gs, go, cache)
    analytic = {"x": dx, "branch": dx, "weight": dweight}  # x and branch share one gradient
    gradcheck_scalar(loss, inputs, analytic, max_samples=SAMPLES).raise_if_bad(TOL)


@given(data=st.data(), n=st.integers(1, 3))
def test_global_grad_norm_gradient(data, n) -> None:
    # d||g|| / dg = g / ||g||: checks the norm that clipping relies on, via gradcheck_scalar
    grads = {f"g{i}": data.draw(normal_arrays(shapes(1, 2, 4))) for i in range(n)}
    norm = global_grad_norm(grads)
    analytic = {k: g / norm for k, g in grads.items()}
    gradcheck_scalar(lambda p: global_grad_norm(p), grads, analytic).raise_if_bad(TOL)
