"""`python -m euler_kernels.check`: float64 gradient check of every op, printed as a table.

    $ python -m euler_kernels.check
    op                     input          shape                 checked  max rel err  ok
    embedding              weight         (11, 6)                    66    ...        OK
    ...
Exit status 0 when every input is within `--tol`, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import numpy as np

import euler_kernels as ek
from euler_kernels.gradcheck import GradcheckReport, gradcheck

Case = tuple[str, Callable, Callable, dict, list[str] | None]


def _cases(rng: np.random.Generator) -> list[Case]:
    """One representative call per op (several for attention), all in float64."""

    def r(*shape: int, scale: float = 1.0) -> np.ndarray:
        return rng.standard_normal(shape) * scale

    cos, sin = ek.rope_tables(8, 32, dtype=np.float64)
    targets = rng.integers(0, 13, size=(2, 5))
    targets[0, 1] = -100  # one ignored position
    mask = (rng.random((2, 5)) < 0.7).astype(np.float64)
    return [
        ("embedding", ek.embedding_forward, ek.embedding_backward,
         {"weight": r(11, 6), "tokens": rng.integers(0, 11, size=(2, 5))}, None),
        ("rmsnorm", ek.rmsnorm_forward, ek.rmsnorm_backward, {"x": r(2, 5, 6), "weight": r(6)}, None),
        ("linear", ek.linear_forward, ek.linear_backward, {"x": r(2, 5, 6), "weight": r(7, 6)}, None),
        ("rope", ek.rope_forward, ek.rope_backward,
         {"x": r(2, 5, 3, 8), "cos": cos, "sin": sin, "offset": 7}, ["x"]),
        ("attention (GQA 4/2)", ek.attention_forward, ek.attention_backward,
         {"q": r(2, 9, 4, 4), "k": r(2, 9, 2, 4), "v": r(2, 9, 2, 4), "block_size": 4}, None),
        ("attention (KV cache)", ek.attention_forward, ek.attention_backward,
         {"q": r(1, 2, 3, 4), "k": r(1, 7, 1, 4), "v": r(1, 7, 1, 4), "block_size": 3}, None),
        ("swiglu", ek.swiglu_forward, ek.swiglu_backward, {"gate": r(2, 5, 7, scale=3.0), "up": r(2, 5, 7)},
         None),
        ("residual", ek.residual_forward, ek.residual_backward,
         {"x": r(2, 5, 6), "branch": r(2, 5, 6)}, None),
        ("cross_entropy", ek.cross_entropy_forward, ek.cross_entropy_backward,
         {"logits": r(2, 5, 13), "targets": targets, "loss_mask": mask}, ["logits"]),
        ("cross_entropy (1e4)", ek.cross_entropy_forward, ek.cross_entropy_backward,
         {"logits": r(2, 5, 13, scale=1e4), "targets": targets}, ["logits"]),
    ]  # fmt: skip


def run_checks(seed: int = 0, max_samples: int | None = 256) -> list[GradcheckReport]:
    """Gradient-check every op; one report per case."""
    rng = np.random.default_rng(seed)
    return [
        gradcheck(fwd, bwd, inputs, wrt=wrt, max_samples=max_samples, seed=seed, label=label)
        for label, fwd, bwd, inputs, wrt in _cases(rng)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m euler_kernels.check", description=__doc__.splitlines()[0])
    ap.add_argument("--tol", type=float, default=1e-6, help="largest accepted relative error")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    args = ap.parse_args(argv)
    reports = run_checks(args.seed)
    lines = reports[0].table(args.tol).splitlines()[:2]
    for rep in reports:
        lines += rep.table(args.tol).splitlines()[2:]
    print("\n".join(lines))
    bad = [rep.label for rep in reports if not rep.ok(args.tol)]
    print(f"\n{'FAILED: ' + ', '.join(bad) if bad else 'all ops OK'} (tolerance {args.tol:g})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
