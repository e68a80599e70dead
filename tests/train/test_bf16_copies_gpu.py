"""The bf16 step's weight copies (step.bf16_weight_copies): made once, then rewritten by AdamW's update in
the pass that updates the weights, instead of cast from the weights at every forward. Each copy must be
its updated weight rounded to bf16, bit for bit, and the steps those of the cast-every-step path (up to
the order of the atomic sums in the embedding's and the norms' gradients, which differs run to run), eager
and captured; a skipped update must leave the copies equal to the unchanged weights."""

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek
import euler_model
from euler_kernels.cuda import cast
from euler_train.comm import Comm
from euler_train.config import resolve_config
from euler_train.graph_step import GraphStep
from euler_train.optimizer import AdamW
from euler_train.step import EagerStep, StepOptions

cp = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu


class CastingAdamW(AdamW):
    """AdamW that leaves the copies to the forward (the path before copies were kept)."""

    writes_bf16_copies = False


BF16 = ek.Precision("bf16")


def run_steps(runner_kind, opt_kind, lrs=(3e-3, 2e-3, 1e-3)):
    """(params after the steps, the runner): a head-dim-64 model (the captured step's attention) on the
    bf16 path, the same batch every step; a zero lr in `lrs` is a skipped update (enable = 0)."""
    cfg = euler_model.preset("tiny", dim=128, n_heads=2, n_kv_heads=1, context=64)
    params = {k: cp.asarray(v) for k, v in euler_model.init_params(cfg, seed=3).items()}
    t = resolve_config("tiny").train
    opt = opt_kind(params, t.beta1, t.beta2, t.eps, 0.1)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (4, 64))
    micro = [(tokens, rng.integers(0, cfg.vocab_size, (4, 64 + cfg.n_mtp_heads - 1)), None)]
    runner = runner_kind(cfg, params, opt, Comm(), StepOptions(max_norm=1.0, precision=BF16))
    losses = []
    for lr in lrs:
        loss, _, applied = runner.run(micro, [1.0], opt.hyper(lr, enable=lr > 0))
        opt.t += int(applied)
        losses.append(loss)
    return params, runner, losses


@pytest.mark.parametrize("runner_kind", [EagerStep, GraphStep], ids=["eager", "graph"])
def test_kept_copies_step_exactly_as_casting_every_step(runner_kind):
    """One step from the same weights: the same loss, every copied matrix's update bit for bit (their
    gradients are cuBLAS products, the same every run); the embedding and norms, whose gradients are summed
    by atomics in no fixed order, to float32 rounding."""
    kept, runner, losses = run_steps(runner_kind, AdamW, lrs=(3e-3,))
    cast, other, cast_losses = run_steps(runner_kind, CastingAdamW, lrs=(3e-3,))
    assert other.copies == {} and len(runner.copies) > 0
    groups = euler_model.bf16_weight_groups(runner.mcfg, kept, BF16)
    assert sorted(runner.copies) == sorted(n for names in groups for n in names)
    assert losses == cast_losses
    for name in kept:
        if name in runner.copies:
            np.testing.assert_array_equal(kept[name].get(), cast[name].get(), err_msg=name)
        else:
            np.testing.assert_allclose(kept[name].get(), cast[name].get(), rtol=1e-5, atol=1e-8, err_msg=name)


@pytest.mark.parametrize("runner_kind", [EagerStep, GraphStep], ids=["eager", "graph"])
def test_each_copy_is_its_updated_weight_rounded(runner_kind):
    params, runner, _ = run_steps(runner_kind, AdamW)
    for name, copy in runner.copies.items():
        np.testing.assert_array_equal(copy.get(), cast.to_bf16(params[name]).get(), err_msg=name)


def test_a_skipped_update_leaves_copies_and_weights_alone():
    """A step whose update is off (enable = 0, as for a non-finite loss) after a real one: the copies are
    those of the one real step, and still their weights rounded."""
    _, once, _ = run_steps(EagerStep, AdamW, lrs=(3e-3,))
    params, runner, _ = run_steps(EagerStep, AdamW, lrs=(3e-3, 0.0))
    for name, copy in runner.copies.items():
        np.testing.assert_array_equal(copy.get(), once.copies[name].get(), err_msg=name)
        np.testing.assert_array_equal(copy.get(), cast.to_bf16(params[name]).get(), err_msg=name)


@pytest.mark.parametrize("runner_kind", [EagerStep, GraphStep], ids=["eager", "graph"])
def test_an_evaluation_forward_casts_into_the_same_copies(runner_kind):
    """The forward of an evaluation (no copies given: it casts each group with to_bf16_many) writes the
    runner's very buffers, so a run holds one set of copies, not two; the values it writes are theirs."""
    params, runner, _ = run_steps(runner_kind, AdamW)
    before = {n: c.get() for n, c in runner.copies.items()}
    for names in euler_model.bf16_weight_groups(runner.mcfg, params, BF16):
        cast_again = ek.to_bf16_many([params[n] for n in names])
        assert all(c is runner.copies[n] for n, c in zip(names, cast_again))
    for name, copy in runner.copies.items():
        np.testing.assert_array_equal(copy.get(), before[name], err_msg=name)
