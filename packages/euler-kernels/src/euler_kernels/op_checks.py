"""The one table of gradient checks of the ops: a representative float64 call of each op, checked by
`python -m euler_kernels.check`, `euler-train check` and the quick gradient tests alike.

>>> [label for label, *_ in gradcheck_cases(np.random.default_rng(0))][:4]
['embedding', 'rmsnorm', 'linear', 'rope']
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from euler_kernels.attention.attention import attention_backward, attention_forward
from euler_kernels.attention.qkv import qkv_backward, qkv_forward
from euler_kernels.cross_entropy.cross_entropy import cross_entropy_backward, cross_entropy_forward
from euler_kernels.embedding.embedding import embedding_backward, embedding_forward
from euler_kernels.gradcheck import GradcheckReport, gradcheck
from euler_kernels.matmul.linear import linear_backward, linear_forward
from euler_kernels.residual.residual import residual_backward, residual_forward
from euler_kernels.rmsnorm.rmsnorm import rmsnorm_backward, rmsnorm_forward
from euler_kernels.rope.rope import rope_backward, rope_forward, rope_tables
from euler_kernels.swiglu.swiglu import swiglu_backward, swiglu_forward

Case = tuple[str, Callable, Callable, dict, list[str] | None]


def gradcheck_cases(rng: np.random.Generator) -> list[Case]:
    """(label, forward, backward, inputs, wrt) for one representative call per op (several for attention
    and cross-entropy), on small random float64 inputs drawn from rng; wrt None: every float input."""

    def r(*shape: int, scale: float = 1.0) -> np.ndarray:
        return rng.standard_normal(shape) * scale

    cos, sin = rope_tables(8, 32, dtype=np.float64)
    targets = rng.integers(0, 13, size=(2, 5))
    targets[0, 1] = -100  # one ignored position
    mask = (rng.random((2, 5)) < 0.7).astype(np.float64)
    return [
        ("embedding", embedding_forward, embedding_backward,
         {"weight": r(11, 6), "tokens": rng.integers(0, 11, size=(2, 5))}, None),
        ("rmsnorm", rmsnorm_forward, rmsnorm_backward, {"x": r(2, 5, 6), "weight": r(6)}, None),
        ("linear", linear_forward, linear_backward, {"x": r(2, 5, 6), "weight": r(7, 6)}, None),
        ("rope", rope_forward, rope_backward,
         {"x": r(2, 5, 3, 8), "cos": cos, "sin": sin, "offset": 7}, ["x"]),
        ("qkv (GQA 4/2)", _qkv_joined, _qkv_joined_backward,
         {"x": r(6, 5), "weight": r(8 * 8, 5), "cos": cos, "sin": sin, "offset": 3}, ["x", "weight"]),
        ("attention (GQA 4/2)", attention_forward, attention_backward,
         {"q": r(2, 9, 4, 4), "k": r(2, 9, 2, 4), "v": r(2, 9, 2, 4), "block_size": 4}, None),
        ("attention (KV cache)", attention_forward, attention_backward,
         {"q": r(1, 2, 3, 4), "k": r(1, 7, 1, 4), "v": r(1, 7, 1, 4), "block_size": 3}, None),
        ("swiglu", swiglu_forward, swiglu_backward, {"gate": r(2, 5, 7, scale=3.0), "up": r(2, 5, 7)},
         None),
        ("residual", residual_forward, residual_backward,
         {"x": r(2, 5, 6), "branch": r(2, 5, 6)}, None),
        ("cross_entropy", cross_entropy_forward, cross_entropy_backward,
         {"logits": r(2, 5, 13), "targets": targets, "loss_mask": mask}, ["logits"]),
        ("cross_entropy (1e4)", cross_entropy_forward, cross_entropy_backward,
         {"logits": r(2, 5, 13, scale=1e4), "targets": targets}, ["logits"]),
    ]  # fmt: skip


def _qkv_joined(x: np.ndarray, weight: np.ndarray, cos: np.ndarray, sin: np.ndarray, offset: int) -> tuple:
    """qkv_forward with 4 query and 2 kv heads over (B, T) = (2, 3), its q, k, v joined along the heads
    (a checked op has one output)."""
    (q, k, v), cache = qkv_forward(x, weight, 4, 2, (2, 3), cos, sin, offset)
    return np.concatenate([q, k, v], axis=2), cache


def _qkv_joined_backward(dout: np.ndarray, cache: tuple) -> tuple:
    return qkv_backward((dout[:, :, :4], dout[:, :, 4:6], dout[:, :, 6:]), cache)


def gradcheck_ops(seed: int = 0, max_samples: int | None = 256) -> list[GradcheckReport]:
    """Gradient-check every case of `gradcheck_cases` (inputs drawn with this seed); one report per case."""
    rng = np.random.default_rng(seed)
    return [
        gradcheck(fwd, bwd, inputs, wrt=wrt, max_samples=max_samples, seed=seed, label=label)
        for label, fwd, bwd, inputs, wrt in gradcheck_cases(rng)
    ]
