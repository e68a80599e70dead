"""Continuous batching: the requests of a server decoded together, one step for all of them at a time.

The engine owns `slots` rows of one decode state (euler_model.DecodeState: per row its tokens, position,
counters, stop set, draws and its slots of the KV cache). A thread runs the loop:

    admit   each waiting request takes a free row: DecodeState.reset of that row, its prompt prefilled
            alone into the row's cache slots (euler_model.decode_batch.prefill), its first token picked and
            recorded
    step    one decode step for every row (euler_model.decode_step.decode_logits): the logits (B, T, V); on
            the GPU this forward is one CUDA graph, replayed (decode_graph.py), the picks after it eager
    pick    each going row's token by its own sampling settings and draw, then DecodeState.record
    emit    each request gets its new token (with its log-probability and the top alternatives when it
            asked), and leaves when a stop token, its limit, a stop string or its client ends it: end_row,
            and the row is free for the next request

A row's arithmetic never depends on the rows beside it (the decode products are computed row by row, the
attention reads the row's own slots, the pick uses the row's own settings and draws), so a request's
tokens are the same whether it runs alone or beside others, and the same as `generate`'s: its prompt
is prefilled alone, and row b's j-th sampled token takes the j-th draw of numpy.random.default_rng(seed).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import euler_kernels as ek
from euler_model.decode_batch import prefill
from euler_model.decode_graph import decode_runner
from euler_model.decode_state import DecodeState
from euler_model.decode_step import (
    attention_window,
    decode_logits,
    draft,
    draft_next,
    drafting_heads,
    inference_weights,
    speculation,
)
from euler_model.sampling import Picker
from euler_train.sampling import SamplingModel


@dataclass
class Request:
    """One sequence to decode, and what the engine tells its caller: `on_token(token, logprob, top, spec)`
    for each new token (spec (drafted, rejected) when the engine speculates, else None: whether the token
    was a draft of the MTP heads that head 0 accepted, and on a step's last token the draft head 0 turned
    down there, None when it took them all); then `on_end(reason)` once: "stop", "length", "cancelled",
    "not_finite" (the probabilities it sampled from were not) or "error" (the engine failed)."""

    prompt: list[int]
    limit: int  # most new tokens (the context's room already counted)
    picker: Picker
    stops: set[int]
    seed: int | None
    on_token: Callable[[int, float | None, list[tuple[int, float]], Any], None]
    on_end: Callable[[str], None]
    top_logprobs: int | None = None  # None: no log-probabilities; k: the token's and the k most likely
    cancelled: bool = False  # set by the caller (a client that left, a stop string): the row ends


class Engine:
    """The decoding thread of a server (module docstring): `submit` a Request, `close` to stop."""

    def __init__(self, model: SamplingModel, slots: int, speculative: bool = False) -> None:
        """speculative: each step feeds every row its last token and the MTP heads' drafts after it (a
        chain: euler_model.default_draft_tree), and emits head 0's tokens along the drafts it agrees with
        (euler_model's decode_step.py): the same tokens in fewer steps, greedy or sampled; a model with one
        head decodes plainly."""
        cfg, params = model.mcfg, model.params
        self.model, self.slots = model, slots
        xp = ek.get_array_module(params["embed"])
        self.xp = xp
        self.tree = speculation(cfg, None, speculative, 0.0, 1.0)  # a chain, or None: plain steps
        self.fed = 1 if self.tree is None else len(self.tree) + 1  # tokens a step feeds a row: T
        self.state = DecodeState.allocate(cfg, xp, params["embed"].dtype, slots, self.fed - 1)
        self.state.done.fill(True)  # every row free
        self.weights = inference_weights(cfg, params, drafting_heads(self.tree), precision=model.precision)
        self.kernel = ek.decode_attention_kernel(self.state.k[0], cfg.n_heads, self.fed)  # own slots
        dtype = params["embed"].dtype
        self.logits = xp.zeros((slots, self.fed, cfg.vocab_size), dtype=dtype)  # (B, T, V) of a step
        self.hidden = xp.zeros((slots * self.fed, cfg.dim), dtype=dtype)  # (B T, C): the drafts' input
        # the step's forward (device work only): on the GPU captured as a CUDA graph per attention window
        # (with the decode attention kernel, one), replayed each step; the picks after it run eagerly
        self.runner = decode_runner(self._forward, xp, cuda_graph=True)
        self.rows: list[Request | None] = [None] * slots
        self.waiting: queue.Queue[Request | None] = queue.Queue()
        self.steps = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="euler-serve-engine", daemon=True)
        self.thread.start()

    # --- the caller's side ------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        """Queue a request (ValueError, at once, for one that cannot fit the context)."""
        context = self.model.mcfg.context
        if not 1 <= len(request.prompt) < context or not 0 <= request.limit <= context - len(request.prompt):
            raise ValueError(
                f"a request needs 1 to {context - 1} prompt tokens and at most the context's room after them "
                f"as its limit; got {len(request.prompt)} and {request.limit}"
            )
        self.waiting.put(request)

    def busy_rows(self) -> int:
        return sum(r is not None for r in self.rows)

    def close(self) -> None:
        """Stop the loop once the rows in flight are cancelled."""
        for request in self.rows:
            if request is not None:
                request.cancelled = True
        self.waiting.put(None)
        self.thread.join(timeout=30)

    # --- the loop ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while self._admit(block=self.busy_rows() == 0):
                self._drop_cancelled()
                if self.busy_rows():
                    self._step()
            self._end_all("cancelled")  # closed: whatever is left ends now
        except BaseException as err:  # the server answers every request in flight with it
            self.error = err
            self._end_all("error")
            raise

    def _end_all(self, reason: str) -> None:
        """End every request in a row or waiting for one."""
        for b, request in enumerate(self.rows):
            if request is not None:
                self.rows[b] = None
                request.on_end(reason)
        while True:
            try:
                request = self.waiting.get_nowait()
            except queue.Empty:
                return
            if request is not None:
                request.on_end(reason)

    def _admit(self, block: bool) -> bool:
        """Waiting requests into free rows (waiting for one when `block`); False once closed. Each prompt
        is prefilled alone: a batched product may round a row differently with other rows beside it, and
        a request's tokens must not depend on who else is being served."""
        while None in self.rows:
            try:
                request = self.waiting.get(block=block)
            except queue.Empty:
                return True
            if request is None:
                return False
            block = False
            if request.cancelled:
                request.on_end("cancelled")
                continue
            self._start(self.rows.index(None), request)
        return True

    def _start(self, row: int, request: Request) -> None:
        """The request's prompt prefilled into `row`, its first token picked and recorded (and drafted
        after, when speculating)."""
        cfg, params, state, precision = self.model.mcfg, self.model.params, self.state, self.model.precision
        state.reset([(request.prompt, request.limit, request.stops, request.seed)], first=row)
        self.rows[row] = request
        one = slice(row, row + 1)
        with self.runner.ordered():  # on the GPU: after the steps queued before, on their stream
            tokens = self.xp.asarray(np.asarray([request.prompt], dtype=np.int64))  # (1, T)
            z, h = prefill(cfg, params, state, one, tokens, precision)  # (1, V), (1, C)
            before = ek.to_numpy(state.count).copy()  # (to_numpy hands a NumPy array itself back)
            self._pick(z[:, None], range(row, row + 1))
            if self.tree is not None:  # the row's first drafts, after its first token
                draft(cfg, self.weights, state.last[one], state.drafts[one], h, None, precision)
            self._emit(range(row, row + 1), before, z[:, None])

    def _drop_cancelled(self) -> None:
        for b, request in enumerate(self.rows):
            if request is not None and request.cancelled:
                self._end(b, "cancelled")

    def _step(self) -> None:
        """One decode step for every row, each going row's tokens picked by its own settings (free rows
        are done: what they pick records nothing)."""
        state, every = self.state, range(self.slots)
        with self.runner.ordered():
            last = int(ek.to_numpy(state.pos).max()) + self.fed - 1  # no row feeds a token past this slot
        self.runner.run(attention_window(self.model.mcfg, last, self.kernel, slots=state.k.shape[3]))
        self.steps += 1
        with self.runner.ordered():
            before = ek.to_numpy(state.count).copy()
            if self.tree is None:
                self._pick(self.logits, every)
                self._emit(every, before, self.logits)
                return
            accepted, proposed = ek.to_numpy(state.accepted).copy(), ek.to_numpy(state.drafts).copy()
            chosen = self._pick(self.logits, every)  # the drafts head 0 agrees with accepted, all recorded
            draft_next(self.model.mcfg, self.weights, state, chosen, self.hidden, None, self.model.precision)
            self._emit(every, before, self.logits, (accepted, proposed))

    def _forward(self, window: int) -> None:
        """Every row's fed tokens (its last; when speculating, the drafts after it) through the model into
        self.logits (B, T, V) and self.hidden (B T, C): device work only."""
        h, z = decode_logits(self.model.mcfg, self.weights, self.state, window, None, self.model.precision)
        self.hidden[...] = h  # (B T, C)
        self.logits[...] = z  # (B, T, V)

    def _pick(self, z: Any, rows: range) -> Any:
        """Pick and record the tokens of `rows` (adjacent rows; z (len(rows), T, V) their logits after each
        fed token): T = 1 one token a row (decode_record), else head 0's along the drafts it agrees with
        (DecodeState.accept; returns the accepted path's last fed token (B,)). Rows with the same sampling
        settings are picked together: each rule works row by row, so a row's tokens are the ones it would
        get alone."""
        state, xp, t = self.state, self.xp, z.shape[1]
        groups: dict[Picker, list[int]] = {}
        for i, b in enumerate(rows):
            if self.rows[b] is not None:  # a free row is done: it records nothing
                groups.setdefault(self.rows[b].picker, []).append(i)
        tokens = xp.zeros((len(rows), t), dtype=xp.int64)
        for picker, members in groups.items():
            local = xp.asarray(np.asarray(members))
            tokens[local] = picker.pick(z[local], state, local + rows.start)  # the members' rows of the state
        if t > 1:
            return state.accept(tokens, None)
        state.record(tokens[:, 0], slice(rows.start, rows.stop))
        return None

    def _emit(self, rows: range, before: np.ndarray, z: Any, speculated: tuple | None = None) -> None:
        """Tell each request of `rows` its new tokens (those past before[b], the counts before the pick),
        with their log-probabilities from z (len(rows), T, V) when asked for; end the rows that are done.
        speculated: (accepted counts before, the drafts proposed (B, T - 1)) of a speculative step."""
        state = self.state
        count, done, out = (ek.to_numpy(a) for a in (state.count, state.done, state.out))
        stopped, bad = ek.to_numpy(state.stopped_by), ek.to_numpy(state.bad)
        wants = any(self.rows[b] is not None and self.rows[b].top_logprobs is not None for b in rows)
        host_z = ek.to_numpy(z).astype(np.float64) if wants else None
        accepted = ek.to_numpy(state.accepted) if speculated else None
        for i, b in enumerate(rows):
            request = self.rows[b]
            if request is None:
                continue
            if bad[b]:
                self._end(b, "not_finite")
                continue
            new = out[b, before[b] : count[b]].tolist()
            took = int(accepted[b] - speculated[0][b]) if speculated else 0  # drafts accepted this step
            for j, token in enumerate(new):
                logprob, top = self._logprobs(host_z, (i, j), token, request.top_logprobs)
                spec = None
                if self.tree is not None:  # (a prefill's first token: head 0's own, no draft turned down)
                    rejected = None
                    if speculated and j == len(new) - 1 and took < speculated[1].shape[1]:
                        rejected = int(speculated[1][b, took])
                    spec = (j < took, rejected)
                request.on_token(token, logprob, top, spec)
            if done[b]:
                self._end(b, "stop" if stopped[b] >= 0 else "length")

    @staticmethod
    def _logprobs(
        z: Any, at: tuple, token: int, k: int | None
    ) -> tuple[float | None, list[tuple[int, float]]]:
        """The token's log-probability under the model (head 0's softmax at z[at], before any sampling
        filter) and the k most likely tokens with theirs; (None, []) when not asked for."""
        if k is None or z is None:
            return None, []
        row = z[at] - z[at].max()
        logp = row - np.log(np.exp(row).sum())  # (V,)
        best = np.argsort(-logp, kind="stable")[:k]
        return float(logp[token]), [(int(t), float(logp[t])) for t in best]

    def _end(self, row: int, reason: str) -> None:
        request = self.rows[row]
        self.rows[row] = None
        self.state.end_row(row)
        request.on_end(reason)
