"""Choosing the next token from rows of logits: repetition penalty, temperature, top-k, top-p.

Every rule is written once, over rows (B, V) of NumPy or CuPy arrays, so the batched generator samples on
the device with the same code as the one-prompt generator (which passes one row). A sampled token is the
inverse CDF of the filtered probabilities at one uniform draw u in [0, 1): the first token whose
cumulative probability exceeds u. That is what NumPy's `Generator.choice(V, p=probs)` does with one
`Generator.random()`, so a seed gives the tokens it gave before this module worked on rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import euler_kernels as ek


def penalize_rows(z: Any, seen: Any, penalty: float) -> Any:
    """CTRL-style penalty on rows z (B, V): a seen logit (seen (B, V) bool) is divided by penalty if > 0,
    else multiplied by it."""
    if penalty == 1.0:
        return z
    xp = ek.get_array_module(z)
    return xp.where(seen, xp.where(z > 0, z / penalty, z * penalty), z)


def apply_repetition_penalty(logits: np.ndarray, history: Sequence[int], penalty: float) -> np.ndarray:
    """penalize_rows for one row of logits (V,) and the token ids seen so far.

    >>> apply_repetition_penalty(np.array([2.0, -2.0, 1.0]), [0, 1], 2.0).tolist()
    [1.0, -4.0, 1.0]
    """
    if penalty == 1.0 or len(history) == 0:
        return logits
    seen = np.zeros(logits.shape, dtype=bool)
    seen[np.asarray(history, dtype=np.int64)] = True
    return penalize_rows(logits[None], seen[None], penalty)[0]


def _as_rows(fn: Any, x: Any, arg: Any) -> Any:
    """fn over x seen as rows (B, V), returned in x's shape (one row (V,) or rows)."""
    return fn(x.reshape(-1, x.shape[-1]), arg).reshape(x.shape)


def top_k_rows(z: Any, k: int | None) -> Any:
    """Keep each row's k largest logits (ties at the boundary kept), set the rest to -inf; z (B, V)."""
    if k is None or k >= z.shape[-1]:
        return z
    xp = ek.get_array_module(z)
    kth = xp.sort(z, axis=-1)[:, z.shape[-1] - k : z.shape[-1] - k + 1]  # (B, 1) the k-th largest value
    return xp.where(z >= kth, z, -xp.inf)


def filter_top_k(logits: Any, k: int | None) -> Any:
    """top_k_rows for one row (V,) or rows (B, V)."""
    return _as_rows(top_k_rows, logits, k)


def top_p_rows(probs: Any, p: float | None) -> Any:
    """Nucleus filter on rows (B, V): keep the smallest set of most likely tokens whose mass reaches p
    (the most likely token always), renormalised."""
    if p is None or p >= 1.0:
        return probs
    xp = ek.get_array_module(probs)
    order = xp.argsort(-probs, axis=-1, **({"kind": "stable"} if xp is np else {}))  # (B, V)
    ranked = xp.take_along_axis(probs, order, axis=-1)
    mass_before = xp.cumsum(ranked, axis=-1) - ranked  # mass of strictly more likely tokens
    keep = xp.zeros(probs.shape, dtype=bool)
    keep[xp.arange(probs.shape[0])[:, None], order] = mass_before < p
    out = xp.where(keep, probs, 0.0)
    return out / out.sum(axis=-1, keepdims=True)


def filter_top_p(probs: Any, p: float | None) -> Any:
    """top_p_rows for one row (V,) or rows (B, V).

    >>> filter_top_p(np.array([0.5, 0.3, 0.2]), 0.7).round(3).tolist()
    [0.625, 0.375, 0.0]
    """
    return _as_rows(top_p_rows, probs, p)


def sampling_probs(z: Any, temperature: float, top_k: int | None, top_p: float | None) -> Any:
    """Probabilities (B, V) to sample from, given penalised float64 logits z (B, V) and temperature > 0."""
    xp = ek.get_array_module(z)
    z = top_k_rows(z / temperature, top_k)
    probs = xp.exp(z - z.max(axis=-1, keepdims=True))
    return top_p_rows(probs / probs.sum(axis=-1, keepdims=True), top_p)


def inverse_cdf(probs: Any, u: Any) -> Any:
    """Token ids (B,): in each row of probs (B, V) the first token whose cumulative probability (of the
    row's normalised CDF) exceeds u (B,), the row's uniform draw in [0, 1)."""
    cdf = probs.cumsum(axis=-1)
    cdf /= cdf[:, -1:]
    return (cdf <= u[:, None]).sum(axis=-1)  # the CDF never decreases: this is searchsorted(right)


def choose_token(
    logits: np.ndarray,
    history: Sequence[int],
    rng: np.random.Generator,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float = 1.0,
) -> int:
    """The next token id from logits (V,): greedy (argmax) when temperature == 0, else sampled with one
    draw of rng (ValueError when the probabilities are not finite, e.g. the logits of a diverged model).

    >>> choose_token(np.array([0.0, 3.0, 1.0]), [], np.random.default_rng(0), temperature=0.0)
    1
    """
    z = apply_repetition_penalty(np.asarray(logits, dtype=np.float64), history, repetition_penalty)
    if temperature == 0.0:
        return int(np.argmax(z))
    probs = sampling_probs(z[None], temperature, top_k, top_p)  # (1, V)
    if not np.isfinite(probs).all():
        raise ValueError("choose_token: the probabilities are not finite (NaN or infinite logits)")
    return int(inverse_cdf(probs, np.array([rng.random()]))[0])


def check_sampling_args(temperature: float, top_k: int | None, top_p: float | None, penalty: float) -> None:
    """Raise a ValueError for an out-of-range sampling argument."""
    if temperature < 0:
        raise ValueError(f"generate: temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"generate: top_k must be >= 1 or None, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"generate: top_p must be in (0, 1] or None, got {top_p}")
    if penalty <= 0:
        raise ValueError(f"generate: repetition_penalty must be > 0, got {penalty}")
