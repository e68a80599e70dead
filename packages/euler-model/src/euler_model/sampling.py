"""Choosing the next token from rows of logits: repetition penalty, temperature, top-k, top-p.

Every rule is written once, over rows (B, V) of NumPy or CuPy arrays, and runs on the device inside the
decode step. A sampled token is the inverse CDF of the filtered probabilities at one uniform draw u in
[0, 1), which is what NumPy's `Generator.choice(V, p=probs)` does with one `Generator.random()`
(tests/model/host_sampling.py holds that one-row host sampler, the reference the decoder is tested against).
"""

from __future__ import annotations

from dataclasses import dataclass
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


def top_k_rows(z: Any, k: int | None) -> Any:
    """Keep each row's k largest logits (ties at the boundary kept), set the rest to -inf; z (B, V)."""
    if k is None or k >= z.shape[-1]:
        return z
    xp = ek.get_array_module(z)
    kth = xp.sort(z, axis=-1)[:, z.shape[-1] - k : z.shape[-1] - k + 1]  # (B, 1) the k-th largest value
    return xp.where(z >= kth, z, -xp.inf)


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


@dataclass(frozen=True)
class Picker:
    """How the next token is chosen from logits: greedy when temperature == 0, else sampled."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0

    @property
    def greedy(self) -> bool:
        """Whether the pick is the plain argmax of the logits (no sampling, no penalty)."""
        return self.temperature == 0.0 and self.repetition_penalty == 1.0

    def pick(self, z: Any, state: Any, rows: Any = None) -> Any:
        """Tokens (G, T) from the logits z (G, T, V) of G rows of a DecodeState (rows (G,), default every
        row) after each token a step fed them (the last, then T - 1 drafts). Position i's token is what a
        plain step would pick were the drafts before it emitted: the row's (count + i)-th draw, drafts 1..i
        seen by the repetition penalty. Rows that sampled from probabilities that were not finite are
        marked in state.bad."""
        xp = ek.get_array_module(z)
        g, t, v = z.shape
        if self.greedy:
            return z.argmax(axis=-1)  # in float64 the order, and so the first maximum, is the same
        every = rows is None
        at = state.rows if every else rows  # (G,) the rows in the state
        own = state.count, state.seen, state.drafts  # (G,), (G, V), (G, T - 1): the rows' own
        count, seen, drafts = own if every else (a[rows] for a in own)
        fed_seen, draws = seen[:, None, :], state.uniforms[at, count]  # (G, 1, V), (G,)
        if t > 1:  # (G, T, V) and (G T,): positions i.. have also seen draft i; each takes its own draw
            local = at if every else xp.arange(g)  # the rows in z
            fed_seen = xp.repeat(fed_seen, t, axis=1)
            for i in range(1, t):
                fed_seen[local[:, None], i:, drafts[:, i - 1 : i]] = True
            draws = state.uniforms[at[:, None], count[:, None] + xp.arange(t)].reshape(-1)
        z = z.reshape(g * t, v).astype(xp.float64)
        z = penalize_rows(z, fed_seen.reshape(g * t, v), self.repetition_penalty)
        if self.temperature == 0.0:
            return z.argmax(axis=-1).reshape(g, t)
        probs = sampling_probs(z, self.temperature, self.top_k, self.top_p)
        bad = ~xp.isfinite(probs).all(axis=-1)  # (G T,)
        bad = bad if t == 1 else bad.reshape(g, t).any(axis=1)
        if every:
            state.bad |= bad
        else:
            state.bad[rows] |= bad
        return inverse_cdf(probs, draws).reshape(g, t)
