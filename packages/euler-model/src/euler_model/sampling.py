"""Choosing the next token from one row of logits: repetition penalty, temperature, top-k, top-p."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def apply_repetition_penalty(logits: np.ndarray, history: Sequence[int], penalty: float) -> np.ndarray:
    """CTRL-style penalty: a logit of an already-seen token is divided by penalty if > 0, else multiplied.

    >>> apply_repetition_penalty(np.array([2.0, -2.0, 1.0]), [0, 1], 2.0).tolist()
    [1.0, -4.0, 1.0]
    """
    if penalty == 1.0 or len(history) == 0:
        return logits
    out = logits.copy()
    seen = np.unique(np.asarray(history, dtype=np.int64))
    out[seen] = np.where(out[seen] > 0, out[seen] / penalty, out[seen] * penalty)
    return out


def filter_top_k(logits: np.ndarray, k: int | None) -> np.ndarray:
    """Keep the k largest logits (ties at the boundary kept), set the rest to -inf."""
    if k is None or k >= logits.shape[-1]:
        return logits
    kth = np.partition(logits, -k)[-k]  # the k-th largest value
    return np.where(logits >= kth, logits, -np.inf)


def filter_top_p(probs: np.ndarray, p: float | None) -> np.ndarray:
    """Nucleus filter: keep the smallest set of most likely tokens whose mass reaches p; renormalise.

    >>> filter_top_p(np.array([0.5, 0.3, 0.2]), 0.7).round(3).tolist()
    [0.625, 0.375, 0.0]
    """
    if p is None or p >= 1.0:
        return probs
    order = np.argsort(-probs, kind="stable")
    mass_before = np.cumsum(probs[order]) - probs[order]  # mass of strictly more likely tokens
    keep = np.zeros_like(probs, dtype=bool)
    keep[order[mass_before < p]] = True  # the most likely token is always kept
    out = np.where(keep, probs, 0.0)
    return out / out.sum()


def choose_token(
    logits: np.ndarray,
    history: Sequence[int],
    rng: np.random.Generator,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float = 1.0,
) -> int:
    """The next token id from logits (V,): greedy (argmax) when temperature == 0, else sampled with rng.

    >>> choose_token(np.array([0.0, 3.0, 1.0]), [], np.random.default_rng(0), temperature=0.0)
    1
    """
    z = apply_repetition_penalty(np.asarray(logits, dtype=np.float64), history, repetition_penalty)
    if temperature == 0.0:
        return int(np.argmax(z))
    z = filter_top_k(z / temperature, top_k)
    probs = np.exp(z - z.max())
    probs = filter_top_p(probs / probs.sum(), top_p)
    return int(rng.choice(probs.shape[0], p=probs))


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
