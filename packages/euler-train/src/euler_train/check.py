"""`euler-train check`: float64 finite-difference gradient checks of every op and of the whole model.

Like llm.c's `make check`: one table row per (op, input) with the worst relative error, then the whole
`tiny` model's `loss_and_grads` against central differences of its loss, every parameter tensor.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

TOL = 1e-6


def op_cases(rng: np.random.Generator) -> list[tuple[str, Callable, Callable, dict[str, Any], list[str]]]:
    """(label, forward, backward, inputs, wrt) for every op, on small random float64 inputs."""
    import euler_kernels as ek

    def r(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape)

    cos, sin = ek.rope_tables(8, 16, dtype=np.float64)
    targets = rng.integers(0, 11, size=(2, 5))
    mask = (rng.random((2, 5)) > 0.3).astype(np.float64)
    return [
        (
            "embedding",
            ek.embedding_forward,
            ek.embedding_backward,
            {"weight": r(11, 6), "tokens": rng.integers(0, 11, size=(2, 5))},
            ["weight"],
        ),
        (
            "rmsnorm",
            ek.rmsnorm_forward,
            ek.rmsnorm_backward,
            {"x": r(2, 5, 6), "weight": r(6)},
            ["x", "weight"],
        ),
        (
            "linear",
            ek.linear_forward,
            ek.linear_backward,
            {"x": r(2, 5, 6), "weight": r(7, 6)},
            ["x", "weight"],
        ),
        ("rope", ek.rope_forward, ek.rope_backward, {"x": r(2, 5, 3, 8), "cos": cos, "sin": sin}, ["x"]),
        (
            "attention (GQA)",
            ek.attention_forward,
            ek.attention_backward,
            {"q": r(2, 5, 4, 8), "k": r(2, 5, 2, 8), "v": r(2, 5, 2, 8)},
            ["q", "k", "v"],
        ),
        (
            "swiglu",
            ek.swiglu_forward,
            ek.swiglu_backward,
            {"gate": r(2, 5, 6), "up": r(2, 5, 6)},
            ["gate", "up"],
        ),
        (
            "residual",
            ek.residual_forward,
            ek.residual_backward,
            {"x": r(2, 6), "branch": r(2, 6)},
            ["x", "branch"],
        ),
        (
            "cross_entropy",
            ek.cross_entropy_forward,
            ek.cross_entropy_backward,
            {"logits": r(2, 5, 11), "targets": targets, "loss_mask": mask},
            ["logits"],
        ),
    ]


def check_ops(rng: np.random.Generator, out: Any) -> bool:
    """Print one table of every op's inputs; True when all pass."""
    from euler_kernels.gradcheck import gradcheck

    ok = True
    for label, fwd, bwd, inputs, wrt in op_cases(rng):
        report = gradcheck(fwd, bwd, inputs, wrt=wrt, label=label)
        lines = report.table(TOL).splitlines()
        if label == "embedding":
            print("\n".join(lines[:2]), file=out)
        print("\n".join(lines[2:]), file=out)
        ok &= report.ok(TOL)
    return ok


def check_model(out: Any, max_samples: int = 16) -> bool:
    """Whole-model float64 gradcheck on the tiny preset, every parameter tensor."""
    import euler_model
    from euler_kernels.gradcheck import gradcheck_scalar

    cfg = euler_model.preset("tiny")
    rng = np.random.default_rng(1)
    # weights 10x the init scale and non-unit norms: every path carries a gradient well above rounding
    init = euler_model.init_params(cfg, seed=0, dtype=np.float64)
    params = {
        k: 1.0 + 0.3 * rng.standard_normal(v.shape) if k.endswith("norm") else 10 * v for k, v in init.items()
    }
    b, t = 2, 6
    tokens = rng.integers(0, cfg.vocab_size, size=(b, t))
    targets = rng.integers(0, cfg.vocab_size, size=(b, t + cfg.n_mtp_heads - 1))
    mask = (rng.random(targets.shape) > 0.2).astype(np.float64)
    _, grads = euler_model.loss_and_grads(cfg, params, tokens, targets, mask)
    report = gradcheck_scalar(
        lambda p: euler_model.forward_loss(cfg, p, tokens, targets, mask),
        params,
        grads,
        max_samples=max_samples,
        eps=1e-5,
        label="model (tiny)",
    )
    print("\n" + report.table(TOL), file=out)
    return report.ok(TOL)


def run_check(quick: bool = False, out: Any = None) -> int:
    """Both checks; exit code 0 when every relative error is at most 1e-6, else 1."""
    out = out or sys.stdout
    rng = np.random.default_rng(0)
    ok_ops = check_ops(rng, out)
    ok_model = check_model(out, max_samples=8 if quick else 32)
    verdict = "all gradients OK" if ok_ops and ok_model else "FAILED"
    print(f"\neuler-train check: {verdict} (max relative error tolerance {TOL:g})", file=out)
    return 0 if ok_ops and ok_model else 1
