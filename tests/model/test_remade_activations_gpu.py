"""The bf16 blocks' caches do not keep each norm's output h or the SwiGLU product (blocks.py): the
backward makes them again. The gradients are those of kept activations only if the re-made arrays have
the forward's bits, which this checks on the GPU for both norms (with and without the branch added in
front) and the FFN block's whole backward against one whose caches keep everything (bit for bit but for
the norm weight's gradient, whose blocks' sums meet through atomics)."""

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek
from euler_kernels.cuda import cast
from euler_model import blocks, preset

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu


def _stream(rng, n, c, branch):
    x = cp.asarray(rng.standard_normal((n, c)), dtype=cp.float32)
    return x, (cp.asarray(rng.standard_normal((n, c)), dtype=cp.float32) if branch else None)


@pytest.mark.parametrize("branch", [False, True])
@pytest.mark.parametrize(("n", "c"), [(64, 768), (37, 2048), (5, 200)])  # vector and row kernels
def test_a_norm_made_again_has_the_forward_bits(branch, n, c):
    rng = np.random.default_rng(n + c)
    cfg = preset("tiny")
    weight = cp.asarray(1.0 + 0.3 * rng.standard_normal(c), dtype=cp.float32)
    s, h, _ = blocks.norm_in(cfg, weight, _stream(rng, n, c, branch), bf16=True)
    again = blocks.norm_again((s, weight, cfg.norm_eps))
    np.testing.assert_array_equal(cp.asnumpy(again), cp.asnumpy(h))


def test_the_bf16_ffn_block_gradients_equal_those_of_kept_activations():
    """ffn_block_backward with the re-made h and SwiGLU product against the same ops on caches that keep
    them (linear_forward's default): every gradient bit for bit."""
    rng = np.random.default_rng(0)
    cfg = preset("tiny")
    c, f, n = cfg.dim, cfg.ffn_dim, 48
    p = {
        name: cp.asarray(rng.standard_normal(shape) / np.sqrt(shape[-1]), dtype=cp.float32)
        for name, shape in [("w_gate", (f, c)), ("w_up", (f, c)), ("w_down", (c, f))]
    }
    p["ffn_norm"] = cp.asarray(1.0 + 0.3 * rng.standard_normal(c), dtype=cp.float32)
    p = {"layers.0." + k: (cast.to_bf16(v) if k.startswith("w") else v) for k, v in p.items()}
    stream = _stream(rng, n, c, True)
    dout = (cp.asarray(rng.standard_normal((n, c)), dtype=cp.float32), None, None)
    (_, o), cache = blocks.ffn_block_forward(cfg, p, "layers.0.", stream, bf16=True)
    (dx, _, _), grads = blocks.ffn_block_backward(dout, cache, "layers.0.")

    _, h, c_norm = blocks.norm_in(cfg, p["layers.0.ffn_norm"], stream, True)  # the kept-everything twin
    gate_up = [p["layers.0.w_gate"], p["layers.0.w_up"]]
    (g, c_gate), (u, c_up) = ek.linear_forward_many(h, gate_up, bf16_out=True)
    gated, c_swi = ek.swiglu_forward(g, u)
    o_kept, c_down = ek.linear_forward(gated, p["layers.0.w_down"])
    np.testing.assert_array_equal(cp.asnumpy(o), cp.asnumpy(o_kept))
    dgated, dw_down = ek.linear_backward(dout[0], c_down, bf16_dx=True)
    dg, du = ek.swiglu_backward(dgated, c_swi)
    dh, dw_up = ek.linear_backward(du, c_up, bf16_dx=True)  # dh summed in bf16, as the block does
    dh, dw_gate = ek.linear_backward(dg, c_gate, dx_into=dh)
    (dx_kept, _, _), dnorm = blocks.norm_backward(dout[0], dh, c_norm, True)
    want = {"w_down": dw_down, "w_up": dw_up, "w_gate": dw_gate}
    np.testing.assert_array_equal(cp.asnumpy(dx), cp.asnumpy(dx_kept))
    for name, grad in want.items():
        np.testing.assert_array_equal(cp.asnumpy(grads["layers.0." + name]), cp.asnumpy(grad), err_msg=name)
    # the norm's weight gradient is summed across blocks with atomics: equal up to their order
    dnorm_remade = cp.asnumpy(grads["layers.0.ffn_norm"])
    np.testing.assert_allclose(dnorm_remade, cp.asnumpy(dnorm), rtol=1e-5, atol=1e-6)
