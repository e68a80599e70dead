"""The one-row host sampler the decoders are tested against: a token from logits (V,) with one draw of a
NumPy Generator, built from euler_model.sampling's row rules (so a seed samples what it always sampled)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from euler_model.sampling import inverse_cdf, penalize_rows, sampling_probs, top_k_rows, top_p_rows


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


def filter_top_k(logits: Any, k: int | None) -> Any:
    """top_k_rows for one row (V,) or rows (B, V)."""
    return _as_rows(top_k_rows, logits, k)


def filter_top_p(probs: Any, p: float | None) -> Any:
    """top_p_rows for one row (V,) or rows (B, V).

    >>> filter_top_p(np.array([0.5, 0.3, 0.2]), 0.7).round(3).tolist()
    [0.625, 0.375, 0.0]
    """
    return _as_rows(top_p_rows, probs, p)


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
