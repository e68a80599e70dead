"""The training step's gradient weighting (euler_train/step.py): one micro-batch has its share applied to the
loss's gradient before the backward and keeps the backward's own arrays; several are weighted and summed.
Both must give the micro-batches' share-weighted gradient, checked in float64 on the CPU."""

from __future__ import annotations

import numpy as np

import euler_model
from euler_train.comm import Comm
from euler_train.config import resolve_config
from euler_train.optimizer import make_optimizer
from euler_train.step import EagerStep, StepBuffers, StepOptions


def setup(seed: int = 0):
    cfg = euler_model.preset("tiny")
    params = {k: v.astype(np.float64) for k, v in euler_model.init_params(cfg, seed=seed).items()}
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab_size, (2, 16))
    targets = rng.integers(0, cfg.vocab_size, (2, 16 + cfg.n_mtp_heads - 1))
    return cfg, params, (tokens, targets, None)


def step_grads(cfg, params, micro: list[tuple], shares: list[float]) -> tuple[float, dict]:
    """The step's loss and gradients with its update disabled (the weights stay as they are)."""
    opt = make_optimizer(params, resolve_config("tiny").train)
    step = EagerStep(cfg, params, opt, Comm(), StepOptions(max_norm=0.0))
    loss, _, applied = step.run(micro, shares, opt.hyper(1e-3, enable=False))
    assert not applied
    return loss, step.buf.grads


def test_one_micro_batch_gets_its_share_before_the_backward() -> None:
    cfg, params, micro = setup()
    loss, grads = euler_model.loss_and_grads(cfg, params, *micro)
    share = float(np.float32(0.3))  # the step keeps shares as float32
    step_loss, weighted = step_grads(cfg, params, [micro], [share])
    np.testing.assert_allclose(step_loss, share * loss, rtol=1e-6)
    assert sorted(weighted) == sorted(params)
    for name, g in grads.items():
        # float64 gradients: the share must not be rounded to float32 on its way (times 1 / K, K = 3 heads)
        np.testing.assert_allclose(weighted[name], share * g, rtol=1e-12, atol=1e-15, err_msg=name)


def test_one_micro_batch_keeps_no_second_set_of_gradients() -> None:
    cfg, params, micro = setup()
    assert StepBuffers.allocate(np, cfg, params, [micro]).grads == {}
    assert len(StepBuffers.allocate(np, cfg, params, [micro, micro]).grads) == len(params)


def test_several_micro_batches_sum_to_the_one_micro_batch_gradient() -> None:
    cfg, params, micro = setup()
    other = setup(seed=1)[2]
    shares = [float(np.float32(0.3)), float(np.float32(0.7))]
    _, summed = step_grads(cfg, params, [micro, other], shares)
    _, first = step_grads(cfg, params, [micro], [shares[0]])
    first = {n: g.copy() for n, g in first.items()}
    _, second = step_grads(cfg, params, [other], [shares[1]])
    for name in params:
        expected = first[name] + second[name]
        np.testing.assert_allclose(summed[name], expected, rtol=1e-10, atol=1e-14, err_msg=name)
