"""`euler-train check`: float64 finite-difference gradient checks of every op and of the whole model.

Like llm.c's `make check`: one table row per (op, input) with the worst relative error, then the whole
`tiny` model's `loss_and_grads` against central differences of its loss, every parameter tensor, and the
same for the DPO loss's hand-written gradient (euler_model.preference).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

import euler_kernels as ek
import euler_model

TOL = 1e-6


def check_ops(out: Any) -> bool:
    """Print one table of every op's inputs (euler-kernels' one table of op cases); True when all pass."""
    reports = ek.gradcheck_ops()
    print("\n".join(reports[0].table(TOL).splitlines()[:2]), file=out)
    for report in reports:
        print("\n".join(report.table(TOL).splitlines()[2:]), file=out)
    return all(report.ok(TOL) for report in reports)


def check_model(out: Any, max_samples: int = 16) -> bool:
    """Whole-model float64 gradcheck on the tiny preset, every parameter tensor."""
    cfg = euler_model.preset("tiny")
    params = euler_model.gradcheck_params(cfg, seed=0)  # large enough weights: every path has a gradient
    rng = np.random.default_rng(1)
    b, t = 2, 6
    tokens = rng.integers(0, cfg.vocab_size, size=(b, t))
    targets = rng.integers(0, cfg.vocab_size, size=(b, t + cfg.n_mtp_heads - 1))
    mask = (rng.random(targets.shape) > 0.2).astype(np.float64)
    _, grads = euler_model.loss_and_grads(cfg, params, tokens, targets, mask)
    report = ek.gradcheck_scalar(
        lambda p: euler_model.forward_loss(cfg, p, tokens, targets, mask),
        params,
        grads,
        max_samples=max_samples,
        eps=1e-5,
        label="model (tiny)",
    )
    print("\n" + report.table(TOL), file=out)
    return report.ok(TOL)


def check_dpo(out: Any, max_samples: int = 16) -> bool:
    """The DPO loss's hand-written gradient through the tiny model, float64, every parameter tensor: two
    pairs of replies, the reference log-probabilities those of a nearby model."""
    cfg = euler_model.preset("tiny")
    params = euler_model.gradcheck_params(cfg, seed=0)
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, cfg.vocab_size, size=(4, 6))
    tokens[1::2, :3] = tokens[0::2, :3]  # each pair: one prompt, two replies
    targets = rng.integers(0, cfg.vocab_size, size=(4, 6))
    mask = np.zeros((4, 6))
    mask[:, 2:] = 1.0  # the replies' tokens
    nearby = {k: v + 0.05 * rng.standard_normal(v.shape) for k, v in params.items()}
    batch = euler_model.PairBatch(
        tokens, targets, mask, euler_model.sequence_logprobs(cfg, nearby, tokens, targets, mask)
    )
    sft_weight = 0.5  # the chosen replies' NLL term too (train.dpo_sft_weight)
    _, grads, _ = euler_model.dpo_loss_and_grads(cfg, params, batch, sft_weight=sft_weight)
    report = ek.gradcheck_scalar(
        lambda p: euler_model.dpo_loss(cfg, p, batch, sft_weight=sft_weight), params, grads,
        max_samples=max_samples, eps=1e-5, label="DPO+NLL (tiny)",
    )  # fmt: skip
    print("\n" + report.table(TOL), file=out)
    return report.ok(TOL)


def run_check(quick: bool = False, out: Any = None) -> int:
    """The three checks; exit code 0 when every relative error is at most 1e-6, else 1."""
    out = out or sys.stdout
    samples = 8 if quick else 32
    ok = [check_ops(out), check_model(out, max_samples=samples), check_dpo(out, max_samples=samples)]
    verdict = "all gradients OK" if all(ok) else "FAILED"
    print(f"\neuler-train check: {verdict} ({ek.judged(TOL)})", file=out)
    return 0 if all(ok) else 1
