"""train.bf16_grads on the GPU: the gradients of the products' weights (the layers' matrices, the heads)
come out bf16, the norms' and the embedding's float32, each the float32 gradient rounded once; the step
with them (one micro-batch or several, eager or captured) trains as the float32-gradient step does."""

from __future__ import annotations

import numpy as np
import pytest

import euler_model
from euler_kernels import Precision
from euler_kernels.testing import bf16_values
from euler_train.comm import Comm
from euler_train.config import resolve_config
from euler_train.graph_step import GraphStep
from euler_train.optimizer import AdamW
from euler_train.step import EagerStep, StepOptions

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu


BF16 = Precision("bf16")


def _model(**changes):
    cfg = euler_model.preset("tiny", dim=128, n_heads=2, n_kv_heads=1, context=64, **changes)
    params = {k: cp.asarray(v) for k, v in euler_model.init_params(cfg, seed=3).items()}
    return cfg, params


def _micro(cfg, count: int, seed: int = 0) -> list[tuple]:
    rng = np.random.default_rng(seed)
    width = 64 + cfg.n_mtp_heads - 1
    return [
        (rng.integers(0, cfg.vocab_size, (4, 64)), rng.integers(0, cfg.vocab_size, (4, width)), None)
        for _ in range(count)
    ]


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
@pytest.mark.parametrize("mtp_conditioned", [False, True])
def test_product_weights_get_bf16_gradients_of_the_float32_values(precision, mtp_conditioned):
    changes = {"n_mtp_heads": 2, "mtp_conditioned": True} if mtp_conditioned else {}
    cfg, params = _model(**changes)
    (tokens, targets, _), *_ = _micro(cfg, 1)
    args = (cfg, params, cp.asarray(tokens), cp.asarray(targets))
    mode = Precision(precision)
    loss32, g32 = euler_model.loss_and_grads_on_device(*args, precision=mode)
    loss16, g16 = euler_model.loss_and_grads_on_device(*args, bf16_grads=True, precision=mode)
    assert float(loss16) == float(loss32)
    bf16_names = [n for n, p in params.items() if p.ndim == 2 and n != "embed"]
    assert sum(int(np.prod(params[n].shape)) for n in bf16_names) == euler_model.product_params(cfg)
    for name, g in g16.items():
        assert g.dtype == (cp.uint16 if name in bf16_names else cp.float32), name
        want = cp.asnumpy(g32[name]).astype(np.float64)
        got = bf16_values(g) if name in bf16_names else cp.asnumpy(g)
        # rounded once (2^-8), plus the spread of the atomic sums in attention's and the norms' backward
        assert np.linalg.norm(got - want) <= 6e-3 * np.linalg.norm(want), name


def _train(cfg, params, runner_kind, micro_count: int, bf16_grads: bool, steps: int = 3):
    t = resolve_config("tiny").train
    opt = AdamW(params, t.beta1, t.beta2, t.eps, 0.1)
    options = StepOptions(max_norm=1.0, bf16_grads=bf16_grads, precision=BF16)
    runner = runner_kind(cfg, params, opt, Comm(), options)
    losses = []
    for step in range(steps):
        micro = _micro(cfg, micro_count, seed=step)
        loss, norm, applied = runner.run(micro, [1.0 / micro_count] * micro_count, opt.hyper(3e-3))
        assert applied and np.isfinite(norm)
        opt.t += 1
        losses.append(loss)
    return losses, runner


@pytest.mark.parametrize("micro_count", [1, 2])
@pytest.mark.parametrize("runner_kind", [EagerStep, GraphStep], ids=["eager", "graph"])
def test_steps_with_bf16_gradients_follow_the_float32_ones(runner_kind, micro_count):
    cfg, start = _model()
    results = {}
    for bf16_grads in (False, True):
        params = {k: v.copy() for k, v in start.items()}
        losses, runner = _train(cfg, params, runner_kind, micro_count, bf16_grads)
        results[bf16_grads] = (losses, params)
        if micro_count == 1:  # the backward's own arrays are the step's gradients
            products = [g for n, g in runner.buf.grads.items() if params[n].ndim == 2 and n != "embed"]
            kinds = {str(g.dtype) for g in products}
            assert kinds == {"uint16" if bf16_grads else "float32"}
        else:  # the micro-batch sums stay float32
            assert {str(g.dtype) for g in runner.buf.grads.values()} == {"float32"}
    (l32, p32), (l16, p16) = results[False], results[True]
    assert l16[0] == l32[0]  # the first loss is computed before any update
    assert np.allclose(l16, l32, rtol=2e-3)
    for name in p32:  # three AdamW steps of lr 3e-3 from gradients that differ by bf16 rounding
        moved = np.linalg.norm(cp.asnumpy(p32[name] - start[name]))
        assert np.linalg.norm(cp.asnumpy(p16[name] - p32[name])) <= 0.05 * moved + 1e-7, name


def test_graph_and_eager_steps_with_bf16_gradients_agree():
    """The same steps, up to the atomic sums' order in attention's backward: a gradient element that rounds
    to another bf16 value, or changes sign near zero, moves AdamW's first steps by up to 2 lr, so the weights
    are compared against how far they moved."""
    cfg, start = _model()
    runs = []
    for runner_kind in (EagerStep, GraphStep):
        params = {k: v.copy() for k, v in start.items()}
        losses, _ = _train(cfg, params, runner_kind, 1, bf16_grads=True)
        runs.append((losses, params))
    (le, pe), (lg, pg) = runs
    assert np.allclose(le, lg, rtol=1e-5)
    for name in pe:
        moved = np.linalg.norm(cp.asnumpy(pe[name] - start[name]))
        assert np.linalg.norm(cp.asnumpy(pe[name] - pg[name])) <= 1e-2 * moved, name
