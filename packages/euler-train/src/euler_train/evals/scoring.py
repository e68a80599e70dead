"""Summed log-probabilities of chosen tokens of many sequences, several sequences per forward pass.

A `Row` is a token sequence and a 0/1 mask over it; its score is the sum of log p(ids[i] | ids[:i]) over
the positions i where mask[i] = 1 (position 0 has nothing before it and is never scored). Rows are sorted
by length and run `batch_size` at a time as one (B, T) batch padded on the right (attention is causal, so
padding after a row's end changes nothing before it); each row's masked cross-entropy is taken from
head 0's logits with euler-kernels' `cross_entropy_forward`, on NumPy or CuPy alike.

A row longer than the model's context + 1 keeps its last context + 1 tokens (what predicts the end of a
sequence is its end); `Scores` counts such rows and the scored tokens that fell in the part cut.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import euler_kernels as ek
import euler_model
from euler_train.sampling import SamplingModel


@dataclass
class Row:
    ids: np.ndarray  # (L,) token ids
    mask: np.ndarray  # (L,) 1 where the token is scored; mask[0] is never scored


@dataclass
class Scores:
    logprob: np.ndarray  # (rows,) float64: sum of log p over each row's scored tokens (natural log)
    scored: np.ndarray  # (rows,) int64: tokens scored in each row
    cut: int  # rows longer than context + 1, cut to their last context + 1 tokens
    lost: int  # tokens marked to be scored that the cut removed (or moved to position 0)


def fit_row(row: Row, context: int) -> tuple[Row, int]:
    """The row's last context + 1 tokens, and how many of its scored tokens that drops (0 when it fits)."""
    drop = len(row.ids) - (context + 1)
    if drop <= 0:
        return row, 0
    lost = int(np.asarray(row.mask[1 : drop + 1]).sum())  # scored tokens cut, or now at position 0
    return Row(row.ids[drop:], row.mask[drop:]), lost


def pack(rows: list[Row], pad: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens (B, T), targets (B, T), mask (B, T) float32) of rows of at most T + 1 tokens each, the
    shorter padded on the right with `pad` (mask 0)."""
    t = max(len(r.ids) for r in rows) - 1
    tokens = np.full((len(rows), t), pad, dtype=np.int64)
    targets = np.full((len(rows), t), pad, dtype=np.int64)
    mask = np.zeros((len(rows), t), dtype=np.float32)
    for b, r in enumerate(rows):
        n = len(r.ids) - 1
        tokens[b, :n] = r.ids[:-1]
        targets[b, :n] = r.ids[1:]
        mask[b, :n] = r.mask[1:]
    return tokens, targets, mask


def batch_logprobs(model: SamplingModel, tokens: np.ndarray, targets: np.ndarray, mask: np.ndarray) -> list:
    """Summed log p of each row's masked targets, from one forward pass over the (B, T) batch."""
    xp = ek.get_array_module(model.params["embed"])
    batch = xp.asarray(tokens)  # (B, T)
    z = euler_model.logits(model.mcfg, model.params, batch, precision=model.precision)  # (B, T, V)
    targets_d, mask_d = xp.asarray(targets), xp.asarray(mask)
    out = []
    for b, weight in enumerate(mask.sum(axis=1).tolist()):
        if weight == 0:
            out.append(0.0)
            continue
        mean_nll, _ = ek.cross_entropy_forward(z[b], targets_d[b], mask_d[b])  # sum(w nll) / sum(w)
        out.append(-float(mean_nll) * weight)
    return out


def score_rows(
    model: SamplingModel, rows: list[Row], batch_size: int, progress: Callable[[int], None] | None = None
) -> Scores:
    """Scores of `rows` (in their order), `batch_size` rows per forward pass; `progress(k)` is called
    after each batch of k rows."""
    context = model.mcfg.context
    fitted = [fit_row(r, context) for r in rows]
    logprob = np.zeros(len(rows))
    scored = np.zeros(len(rows), dtype=np.int64)
    order = sorted(range(len(rows)), key=lambda i: -len(fitted[i][0].ids))  # longest first: little padding
    for start in range(0, len(order), batch_size):
        chosen = [i for i in order[start : start + batch_size] if len(fitted[i][0].ids) > 1]
        if chosen:
            tokens, targets, mask = pack([fitted[i][0] for i in chosen], pad=0)
            for i, value, count in zip(chosen, batch_logprobs(model, tokens, targets, mask), mask.sum(1)):
                logprob[i], scored[i] = value, int(count)
        if progress is not None:
            progress(len(order[start : start + batch_size]))
    cut = sum(1 for r in rows if len(r.ids) > context + 1)
    return Scores(logprob, scored, cut, sum(lost for _, lost in fitted))
