"""Everything a batched decode step reads and writes, preallocated on the device once per batch.

Row b of the batch is one sequence: `last[b]` is its newest token, at position `pos[b]`, not yet fed to
the model; a step feeds it, writes its keys/values into slot pos[b] of the static cache, and records the
next token. A row that is done (a stop token came, or its limit was reached) keeps being computed, since
the step has a fixed shape, but nothing of it changes any more.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

import euler_kernels as ek
from euler_model.config import ModelConfig


@dataclass
class DecodeState:
    """The device buffers of B rows (S = context + M slots; N = the context, the most tokens a row may
    emit; M the drafts a speculative step feeds after each row's last token, 0 without speculation)."""

    k: Any  # (L, B, Hkv, S, D) keys, a sequence's slots contiguous per head
    v: Any  # (L, B, Hkv, S, D) values
    last: Any  # (B,) int64 the newest token of each row, fed by the next step
    pos: Any  # (B,) int64 its position
    count: Any  # (B,) int64 tokens emitted so far
    limit: Any  # (B,) int64 tokens a row may emit
    done: Any  # (B,) bool
    stopped_by: Any  # (B,) int64 the stop token that ended a row, -1 for none
    stop: Any  # (B, V) bool the stop tokens of each row
    seen: Any  # (B, V) bool the tokens of each row so far (prompt included), for the repetition penalty
    uniforms: Any  # (B, N + 1 + M) float64 row b's j-th sampled token uses uniforms[b, j]
    out: Any  # (B, N + 1) int64 emitted tokens
    bad: Any  # (B,) bool a row sampled from probabilities that were not finite
    rows: Any  # (B,) int64 arange(B)
    drafts: Any  # (B, M) int64 the drafts of heads 1.. after `last`, fed after it by a speculative step
    drafted: Any  # (B,) int64 drafts a row has had verified
    accepted: Any  # (B,) int64 of which head 0 agreed with (each an emitted token with no forward of its own)
    first_fed: Any  # (B,) int64 b (M + 1): row b's first fed token among a speculative step's B (M + 1)
    fed: Any  # (B, M + 1) int64 the tokens a speculative step feeds: last, then the drafts

    @classmethod
    def allocate(cls, config: ModelConfig, xp: Any, dtype: Any, batch: int, drafts: int = 0) -> DecodeState:
        """Zeroed buffers for `batch` rows and M = `drafts`, in which `reset` starts rows call after call."""
        b, n, m, v = batch, config.context, drafts, config.vocab_size
        cache = (config.n_layers, b, config.n_kv_heads, n + m, config.head_dim)
        shapes = {"k": cache, "v": cache, "stop": (b, v), "seen": (b, v), "uniforms": (b, n + 1 + m)}
        shapes |= {"out": (b, n + 1), "drafts": (b, m), "fed": (b, m + 1)}  # the others (B,)
        kinds = {"k": dtype, "v": dtype, "done": bool, "stop": bool, "seen": bool, "bad": bool}
        kinds |= {"uniforms": xp.float64}  # the others int64
        buffers = {f.name: xp.zeros(shapes.get(f.name, b), kinds.get(f.name, xp.int64)) for f in fields(cls)}
        state = cls(**buffers)
        copy_in(state.rows, np.arange(b))
        copy_in(state.first_fed, np.arange(b) * (m + 1))
        return state

    def reset(self, rows: list[tuple[list[int], int, set[int], int | None]], first: int = 0) -> None:
        """Start rows first .. first + G - 1 from G (prompt, limit, stop set, seed): a call's rows, or one
        request joining a running batch between steps (the other rows go on). A row's draws are the first
        n + 1 of numpy.random.default_rng(seed) (n: the largest limit); its counters and cache are zeroed
        (a prefill then writes the prompt's slots: PrefillRows)."""
        prompts, limits, stops, seeds = zip(*rows)
        b, v, width = len(prompts), self.stop.shape[1], max(limits) + 1
        stop, seen = np.zeros((b, v), bool), np.zeros((b, v), bool)
        draws = np.zeros((b, self.uniforms.shape[1]))
        for i, (prompt, row_stops, seed) in enumerate(zip(prompts, stops, seeds)):
            stop[i, [t for t in sorted(row_stops) if 0 <= t < v]] = True  # others can never come
            seen[i, prompt] = True
            draws[i, :width] = np.random.default_rng(seed).random(width)
        rows, limit = slice(first, first + b), np.asarray(limits)
        for name in ("count", "out", "drafts", "drafted", "accepted", "bad"):
            getattr(self, name)[rows].fill(0)
        self.k[:, rows].fill(0)
        self.v[:, rows].fill(0)
        self.stopped_by[rows].fill(-1)
        values = {"last": [p[-1] for p in prompts], "pos": [len(p) - 1 for p in prompts], "limit": limit}
        values |= {"done": limit <= 0, "stop": stop, "seen": seen, "uniforms": draws}
        for name, value in values.items():
            copy_in(getattr(self, name)[rows], np.asarray(value))

    def end_row(self, row: int) -> None:
        """End a row where it is (a request that left), its position back to the first slot so that it
        holds no later step's attention window open."""
        one = slice(row, row + 1)
        self.done[one].fill(True)
        self.pos[one].fill(0)

    def record(self, token: Any, rows: slice | None = None) -> None:
        """Take each row's next token (B,), or of adjacent `rows` only: emitted by the rows still going
        unless it is a stop token; a stop token or the row's limit ends the row (ek.decode_record). Device
        work only."""
        if rows is None:
            ek.decode_record(token, *self.emitted, self.stop, self.limit)
        else:
            ek.decode_record(token, *(a[rows] for a in self.emitted), self.stop[rows], self.limit[rows])

    def accept(self, g: Any, tree: tuple[int, ...] | None = None) -> Any:
        """Take a speculative step's head-0 tokens g (B, T): each row's drafts accepted along the path
        that g agrees with (a chain: up to the first disagreement; a tree: by the drafts' parents), the
        tokens recorded in order, a tree's accepted keys moved into place (ek.decode_accept); returns the
        path's last fed token (B,), whose hidden state drafts next. Device work only."""
        caches = None if tree is None else (self.k, self.v)
        return ek.decode_accept(
            g, self.drafts, self.emitted, self.stop, self.limit, self.drafted, self.accepted, tree, caches
        )

    @property
    def emitted(self) -> tuple:
        """The buffers that recording a token updates, in the order the decode_record kernels take them."""
        return (self.out, self.last, self.pos, self.count, self.stopped_by, self.done, self.seen)


@dataclass(frozen=True)
class PrefillRows:
    """Where a prefill (trunk_forward's kv) writes the keys and values of G prompts of one length T: prompt
    j's into row rows.start + j of the state's caches, slots 0..T-1 (adjacent rows: one copy a layer)."""

    state: DecodeState
    rows: slice  # G adjacent rows

    def write(self, layer: int, k: Any, v: Any) -> None:
        """Layer `layer`'s keys and values (G, T, Hkv, D) into the rows' slots, (G, Hkv, T, D)."""
        t = k.shape[1]
        self.state.k[layer, self.rows, :, :t] = k.transpose(0, 2, 1, 3)
        self.state.v[layer, self.rows, :, :t] = v.transpose(0, 2, 1, 3)


def copy_in(buffer: Any, value: np.ndarray) -> None:
    """Copy a host array into a buffer of its shape in place (NumPy or CuPy, on the current stream)."""
    if isinstance(buffer, np.ndarray):
        buffer[...] = value
    else:
        buffer.set(np.ascontiguousarray(value, dtype=buffer.dtype))
