"""The decode loop of a batch, and the Decoder it runs in: inference weights, DecodeState, step and runner.

A call's prompts are prefilled by the training forward (trunk_forward; the prompts of one length together,
in adjacent rows), each layer writing its keys and values straight into those rows of the static cache;
the rows then advance together, one decode step for the whole batch at a time, captured as a CUDA graph
on the GPU. There a Decoder is kept for the next call of the same model and batch shape (at most
KEPT_DECODERS, sharing one set of weight copies): that call skips the setup, rewrites the weight copies
from params (which a trainer may have updated in place), and a prompt-length pattern seen before has its
whole prefill replayed as one CUDA graph. A decoder is lent to one call at a time; a call that finds it
busy (another generator still streaming) gets one of its own. release_kept_decoders() frees them all.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from functools import partial
from typing import Any

import numpy as np

import euler_kernels as ek
from euler_kernels import draft_tree
from euler_model.config import ModelConfig
from euler_model.cpu_threads import one_blas_thread_for
from euler_model.decode_graph import decode_runner
from euler_model.decode_state import DecodeState, PrefillRows, copy_in
from euler_model.decode_step import (
    Tree,
    attention_window,
    decode_step,
    draft,
    drafting_heads,
    inference_weights,
)
from euler_model.model import trunk_forward
from euler_model.sampling import Picker

PROMPT_PATTERNS = 16  # prompt-length patterns a decoder remembers (the oldest and its prefill graph dropped)
KEPT_DECODERS = 4  # batch shapes (B, sampling rule, draft tree) kept for the latest model

_kept: OrderedDict[Hashable, Decoder] = OrderedDict()  # (B, picker, tree) -> decoder, least recent first
_weights: dict[int, dict] = {}  # drafting heads -> the inference weights the kept decoders share
_kept_model: list[Hashable] = [None]  # the model whose decoders are kept
_lock = threading.Lock()  # two threads must not be lent one decoder


class Decoder:
    """What B rows decode with, made once and lent to one call at a time (see `decode`). tree: the draft
    tree of a speculative step, None for plain steps. weights: the shared weight copies of a kept decoder,
    which refreshes them from params at each call; None: made here."""

    def __init__(
        self,
        config: ModelConfig,
        params: dict,
        batch: int,
        picker: Picker,
        tree: Tree,
        cuda_graph: bool,
        precision: ek.Precision,
        weights: dict | None = None,
    ) -> None:
        xp = ek.get_array_module(params["embed"])
        self.config, self.params, self.picker, self.precision = config, params, picker, precision
        self.fed = 1 if tree is None else len(tree) + 1  # tokens a step feeds a row
        self.state = DecodeState.allocate(config, xp, params["embed"].dtype, batch, self.fed - 1)
        self.drafters, self.kept = drafting_heads(tree), weights is not None
        if not self.kept:
            weights = inference_weights(config, params, self.drafters, precision=precision)
        self.weights = weights
        self.tree = None if tree is None or tree == draft_tree.chain(len(tree)) else tree  # a chain: no masks
        step = partial(decode_step, config, self.weights, self.state, picker, self.tree, precision)
        self.runner = decode_runner(step, xp, cuda_graph)
        self.kernel = ek.decode_attention_kernel(self.state.k[0], config.n_heads, self.fed)  # own slots
        self.prompt_tokens: dict[tuple[int, ...], list[tuple[slice, Any]]] = {}  # lengths -> groups
        self.busy = False
        self.order: list[int] = []  # row i of the state holds the call's prompt order[i]
        self.longest = self.steps = 0  # the call's longest prompt, and its steps so far

    def begin(self, rows: list[tuple[list[int], int, set[int], int | None]]) -> None:
        """Start a call's rows (prompt, limit, stop set, seed): the state reset, the prompts prefilled
        (shortest first, so that the prompts of a length are adjacent rows), their first tokens recorded
        and, speculating, drafted after."""
        order = sorted(range(len(rows)), key=lambda b: len(rows[b][0]))
        prompts = [rows[b][0] for b in order]
        lengths = tuple(len(p) for p in prompts)
        seen = lengths in self.prompt_tokens
        with self.runner.ordered():
            self.state.reset([rows[b] for b in order])
            groups = self._prompt_tokens(lengths)
            for members, tokens in groups:
                copy_in(tokens, np.asarray(prompts[members], dtype=np.int64))
        # a pattern's prefill is recorded the second time it comes (a one-off prompt length costs no capture)
        self.runner.call(("prefill", lengths), partial(self._prefill, groups), capture=seen and self.kept)
        self.order, self.longest, self.steps = order, lengths[-1], 0

    def step(self) -> None:
        """One more step for every row."""
        last = self.longest + (self.steps + 1) * self.fed - 1  # no row feeds a token past this position
        self.runner.run(attention_window(self.config, last, self.kernel, slots=self.state.k.shape[3]))
        self.steps += 1

    def ahead(self, most: int) -> int:
        """Steps to run before looking again: 0 once every row is done, else the fewest that could end
        every row at its limit, at most `most`. A read back to the host (on the GPU a sync)."""
        state, xp = self.state, ek.get_array_module(self.state.done)
        with self.runner.ordered():
            if most == 1:  # (a row that is not done has tokens left)
                return 0 if state.done.all() else 1
            left = int(xp.where(state.done, 0, state.limit - state.count).max())  # most tokens a row lacks
        return min(most, -(-left // self.fed))

    def results(self) -> list[tuple[list[int], int | None, bool]]:
        """Each prompt's (tokens, the stop token that ended them or None, whether it sampled from
        probabilities that were not finite), in the call's order."""
        state = self.state
        count, out, stopped, bad = (
            ek.to_numpy(a) for a in (state.count, state.out, state.stopped_by, state.bad)
        )
        rows = np.argsort(self.order)  # the state's row of each prompt
        return [
            (out[r, : count[r]].tolist(), int(stopped[r]) if stopped[r] >= 0 else None, bad[r]) for r in rows
        ]

    def _prompt_tokens(self, lengths: tuple[int, ...]) -> list[tuple[slice, Any]]:
        """(adjacent rows, their tokens' device buffer (G, T)) for each prompt length of `lengths`
        (ascending), made once per pattern."""
        if lengths not in self.prompt_tokens:
            xp = ek.get_array_module(self.params["embed"])
            starts = [b for b in range(len(lengths)) if b == 0 or lengths[b] != lengths[b - 1]]
            runs = [slice(a, z) for a, z in zip(starts, [*starts[1:], len(lengths)])]
            groups = [(r, xp.zeros((r.stop - r.start, lengths[r.start]), dtype=xp.int64)) for r in runs]
            self.prompt_tokens[lengths] = groups
            if len(self.prompt_tokens) > PROMPT_PATTERNS:  # a chat's prompts grow: forget the oldest length
                self.runner.forget(("prefill", next(iter(self.prompt_tokens))))
                del self.prompt_tokens[next(iter(self.prompt_tokens))]
        return self.prompt_tokens[lengths]

    def _prefill(self, groups: list[tuple[slice, Any]]) -> None:
        """Device work only, so that it can be captured: a kept decoder's weights refreshed; the prompts
        through the trunk, a group of adjacent rows and their tokens (G, T) at a time, each layer writing
        its keys and values into those rows of the cache; head 0's token after each prompt picked and
        recorded, and a speculative step's first drafts made."""
        config, params, state, precision = self.config, self.params, self.state, self.precision
        if self.kept:
            inference_weights(config, params, self.drafters, self.weights, precision)
        b, xp, logits, hidden = state.last.shape[0], ek.get_array_module(state.last), None, None
        for rows, tokens in groups:
            z, h = prefill(config, params, state, rows, tokens, precision)
            if logits is None:  # (B, V) and (B, C): every row's, after its last token
                logits, hidden = xp.empty((b, z.shape[1]), z.dtype), xp.empty((b, h.shape[1]), h.dtype)
            logits[rows], hidden[rows] = z, h
        state.record(self.picker.pick(logits[:, None], state)[:, 0])
        if self.drafters:
            draft(config, self.weights, state.last, state.drafts, hidden, self.tree, precision)


def prefill(
    config: ModelConfig, params: dict, state: DecodeState, rows: slice, tokens: Any, precision: ek.Precision
) -> tuple[Any, Any]:
    """G prompts of one length, tokens (G, T), through the trunk into adjacent `rows` of the state's cache
    (each layer writing their keys and values): head 0's logits (G, V) and the hidden state (G, C), both
    after each prompt's last token."""
    h = trunk_forward(config, params, tokens, kv=PrefillRows(state, rows), precision=precision)[
        0
    ]  # (G, T, C)
    return ek.linear_forward(h[:, -1], params["heads.0"], precision=precision)[0], h[:, -1]


def lend_decoder(
    config: ModelConfig,
    params: dict,
    batch: int,
    picker: Picker,
    tree: Tree,
    cuda_graph: bool,
    precision: ek.Precision,
) -> Decoder:
    """A decoder for `batch` rows, busy until its caller sets `busy` back: on the GPU with cuda_graph the
    kept one of this model (its config, arrays, device and precision) and batch shape, else a new one."""
    if cuda_graph and ek.get_array_module(params["embed"]) is not np:
        arrays = tuple((name, a.data.ptr, a.shape, a.dtype.str) for name, a in sorted(params.items()))
        model, key = (config, arrays, params["embed"].device.id, precision), (batch, picker, tree)
        with _lock:
            if model != _kept_model[0]:  # only the latest model's decoders are kept
                _kept.clear()
                _weights.clear()
                _kept_model[0] = model
            if key not in _kept:
                drafters = drafting_heads(tree)
                if drafters not in _weights:
                    _weights[drafters] = inference_weights(config, params, drafters, precision=precision)
                _kept[key] = Decoder(config, params, batch, picker, tree, True, precision, _weights[drafters])
                while len(_kept) > KEPT_DECODERS:
                    _kept.popitem(last=False)
            decoder = _kept[key]
            if not decoder.busy:  # else another call streams from it: this call gets one of its own
                _kept.move_to_end(key)
                decoder.busy = True
                return decoder
    decoder = Decoder(config, params, batch, picker, tree, cuda_graph, precision)
    decoder.busy = True
    return decoder


def release_kept_decoders() -> None:
    """Drop every kept decoder and their weights (a call still streaming keeps its own until it ends)."""
    with _lock:
        _kept.clear()
        _weights.clear()
        _kept_model[0] = None


def decode(
    config: ModelConfig,
    params: dict,
    rows: list[tuple[list[int], int, set[int], int | None]],
    picker: Picker,
    tree: Tree,
    cuda_graph: bool,
    precision: ek.Precision,
    stats: Any,
    most: int,
) -> Iterator[tuple[Decoder, bool]]:
    """The one decode loop: rows (prompt, limit, stop set, seed) started in a lent decoder, then stepped
    together until every row is done. Yields (the decoder, whether every row is done) after the prefill
    and after each run of at most `most` steps, once the steps are finished (the caller may read the
    state); the decoder goes back after the last yield, or when the caller stops early. stats: a
    GenerationStats, counted into. BLAS runs at one thread while stepping (NumPy: small products)."""
    hold = partial(one_blas_thread_for, params["embed"])
    with hold():
        decoder = lend_decoder(config, params, len(rows), picker, tree, cuda_graph, precision)
        try:
            decoder.begin(rows)
            ahead = decoder.ahead(most)
        except BaseException:
            decoder.busy = False  # a call that failed to start lends nothing
            raise
    stats.forwards += len(rows)
    try:
        while True:
            decoder.runner.synchronize()  # the steps queued on the GPU are done
            yield decoder, ahead == 0
            if ahead == 0:
                return
            with hold():
                for _ in range(ahead):
                    decoder.step()
                stats.forwards += ahead
                ahead = decoder.ahead(most)
    finally:
        decoder.runner.synchronize()
        stats.drafted += int(decoder.state.drafted.sum())
        stats.accepted += int(decoder.state.accepted.sum())
        stats.decode = decoder.runner.mode
        decoder.busy = False  # a kept decoder may serve the next call
