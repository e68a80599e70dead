"""A speculative decode step for a batch, with the MTP heads drafting: greedy output, fewer forwards.

Each row brings T = K tokens: its newest token `last` (at position pos) and the M = K - 1 drafts that
heads 1..M guessed after it (state.drafts). One forward over the T tokens gives head 0's token after each;
the drafts head 0 agrees with, from the first on, are accepted:

    fed    last   d1   d2   d3        head 0 after each: g0 g1 g2 g3
    d1 == g0 and d2 == g1, d3 != g2  ->  emit g0 g1 g2 (2 drafts accepted); g2 is the new `last`

so a step emits 1 + accepted tokens, each head 0's greedy choice given every token before it (what plain
greedy decoding emits). The keys of the accepted tokens are already in their cache slots; the slots past
them hold the rejected drafts' keys until the next step overwrites them (a token sees only the slots up to
its own position, so they are never read). The next drafts come from heads 1..M at the hidden state of
the position whose head 0 gave the new `last`.

The shapes are the same at every step (T tokens for every row, done or not), and nothing is read back to
the host, so the step is captured as CUDA graphs like decode_step (decode_graph.py). Greedy only: a
sampled token would need its draw chosen per accepted position (generate's one-prompt path does that).
"""

from __future__ import annotations

from typing import Any

import euler_kernels as ek
from euler_model.config import ModelConfig
from euler_model.decode_state import DecodeState
from euler_model.decode_step import decode_hidden


def draft(config: ModelConfig, weights: dict[str, Any], state: DecodeState, h: Any) -> None:
    """Set state.drafts (B, M) to heads 1..M's greedy guesses at the hidden rows h (B, C)."""
    z = ek.decode_linear_forward(h, weights["drafters"])  # (B, M V)
    z.reshape(h.shape[0], -1, config.vocab_size).argmax(axis=-1, out=state.drafts)


def speculative_step(config: ModelConfig, weights: dict[str, Any], state: DecodeState, window: int) -> None:
    """Feed every row its last token and drafts, emit head 0's tokens up to the first rejected draft, and
    draft again (device work only, in place); `window` as for decode_step (above every fed position)."""
    xp = ek.get_array_module(state.pos)
    b, m = state.drafts.shape
    tokens = xp.concatenate([state.last[:, None], state.drafts], axis=1)  # (B, T)
    h = decode_hidden(config, weights, state, window, tokens)  # (B T, C)
    z = ek.decode_linear_forward(h, weights["heads.0"])  # (B T, V)
    g = z.argmax(axis=-1).reshape(b, m + 1)  # head 0's token after each fed one
    chosen = state.accept(g)  # (B,) the drafts accepted, from the first on; their tokens recorded
    # the hidden state whose head 0 gave the new last token: row b's fed position chosen[b]
    draft(config, weights, state, h.reshape(b, m + 1, -1)[state.rows, chosen])
