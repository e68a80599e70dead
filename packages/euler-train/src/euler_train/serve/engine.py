"""Continuous batching: the requests of a server decoded together, one step for all of them at a time.

The engine owns `slots` rows of one decode state (euler_model.DecodeState: per row its tokens, position,
counters, stop set, draws and its slots of the KV cache). A thread runs the loop:

    admit   each waiting request takes a free row: reset_row, its prompt prefilled alone straight into the
            row's cache slots (trunk_forward with PrefillRows), its first token picked and recorded
    step    one decode step for every row (euler_model.decode_hidden, then head 0): the logits (B, V); on
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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import euler_kernels as ek
from euler_model.decode_graph import decode_runner
from euler_model.decode_state import DecodeState, PrefillRows
from euler_model.decode_step import Picker, attention_window, decode_hidden, inference_weights
from euler_model.model import trunk_forward
from euler_train.sampling import SamplingModel


@dataclass
class Request:
    """One sequence to decode, and what the engine tells its caller (`on_token(token, logprob, top)` for
    each new token, then `on_end(reason)` once: "stop", "length", "cancelled", "not_finite" (the
    probabilities it sampled from were not) or "error" (the engine failed))."""

    prompt: list[int]
    limit: int  # most new tokens (the context's room already counted)
    picker: Picker
    stops: set[int]
    seed: int | None
    on_token: Callable[[int, float | None, list[tuple[int, float]]], None]
    on_end: Callable[[str], None]
    top_logprobs: int | None = None  # None: no log-probabilities; k: the token's and the k most likely
    cancelled: bool = False  # set by the caller (a client that left, a stop string): the row ends
    stats: dict[str, float] = field(default_factory=dict)  # "queued", "first_token" (time.monotonic)


class Engine:
    """The decoding thread of a server (module docstring): `submit` a Request, `close` to stop."""

    def __init__(self, model: SamplingModel, slots: int) -> None:
        cfg, params = model.mcfg, model.params
        self.model, self.slots = model, slots
        xp = ek.get_array_module(params["embed"])
        self.xp = xp
        self.state = DecodeState.allocate(cfg, xp, params["embed"].dtype, slots)
        self.state.done.fill(True)  # every row free
        self.weights = inference_weights(cfg, params, precision=model.precision)
        self.kernel = ek.decode_attention_kernel(self.state.k[0], cfg.n_heads, 1)  # it reads own slots
        self.logits = xp.zeros((slots, cfg.vocab_size), dtype=params["embed"].dtype)  # (B, V) of a step
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
        request.stats["queued"] = time.monotonic()
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
            self._start(self.rows.index(None), [request])
        return True

    def _start(self, first: int, requests: list[Request]) -> None:
        """The requests' prompts (of one length) prefilled together into rows first.. (the engine passes
        one at a time), their first tokens picked and recorded."""
        cfg, params, state, precision = self.model.mcfg, self.model.params, self.state, self.model.precision
        rows = range(first, first + len(requests))
        for row, request in zip(rows, requests):
            draws = np.random.default_rng(request.seed).random(request.limit + 1)
            state.reset_row(row, request.prompt, request.limit, request.stops, draws)
            self.rows[row] = request
        with self.runner.ordered():  # on the GPU: after the steps queued before, on their stream
            tokens = self.xp.asarray(np.asarray([r.prompt for r in requests], dtype=np.int64))  # (G, T)
            kv = PrefillRows(state, slice(rows.start, rows.stop))
            h = trunk_forward(cfg, params, tokens, kv=kv, precision=precision)[0]  # (G, T, C)
            z = ek.linear_forward(h[:, -1], params["heads.0"], precision=precision)[0]  # (G, V)
            self._pick_and_emit(z, rows)

    def _drop_cancelled(self) -> None:
        for b, request in enumerate(self.rows):
            if request is not None and request.cancelled:
                self._end(b, "cancelled")

    def _step(self) -> None:
        """One decode step for every row, each going row's token picked by its own settings."""
        state = self.state
        with self.runner.ordered():
            last = int(ek.to_numpy(state.pos).max())  # no row feeds a token past this slot
        self.runner.run(attention_window(self.model.mcfg, last, self.kernel, slots=state.k.shape[3]))
        self.steps += 1
        with self.runner.ordered():
            self._pick_and_emit(self.logits, range(self.slots))  # free rows are done: their picks count not

    def _forward(self, window: int) -> None:
        """Every row's last token through the model into self.logits (B, V): device work only."""
        precision = self.model.precision
        h = decode_hidden(self.model.mcfg, self.weights, self.state, window, precision=precision)  # (B, C)
        self.logits[...] = ek.decode_linear_forward(h, self.weights["heads.0"], precision=precision)

    def _pick_and_emit(self, z: Any, rows: range) -> None:
        """Pick the next token of each of `rows` (adjacent rows; z (len(rows), V) their logits), record it
        in their buffers, and tell each request what it got. Rows with the same sampling settings are picked
        together: each rule works row by row, so a row's token is the one it would get alone."""
        state, xp = self.state, self.xp
        counts_before = ek.to_numpy(state.count).copy()  # (to_numpy hands a NumPy array itself back)
        groups: dict[Picker, list[int]] = {}
        for i, b in enumerate(rows):
            if self.rows[b] is not None:  # a free row is done: it records nothing
                groups.setdefault(self.rows[b].picker, []).append(i)
        part = slice(rows.start, rows.stop)
        tokens = xp.zeros(len(rows), dtype=xp.int64)
        for picker, members in groups.items():
            at = xp.asarray(np.asarray(members) + rows.start)  # the members' rows of the state
            draws = state.uniforms[at, state.count[at]]  # (G,) each row's next draw
            bad = xp.zeros(len(members), dtype=bool)
            chosen = picker.choose(z[xp.asarray(members)], state.seen[at], draws, bad)
            tokens[xp.asarray(members)] = chosen
            state.bad[at] |= bad
        buffers = (state.out, state.last, state.pos, state.count, state.stopped_by, state.done, state.seen)
        ek.decode_record(tokens, *(a[part] for a in buffers), state.stop[part], state.limit[part])
        count, done, out = (ek.to_numpy(a) for a in (state.count, state.done, state.out))
        stopped, bad = ek.to_numpy(state.stopped_by), ek.to_numpy(state.bad)
        wants = any(self.rows[b] is not None and self.rows[b].top_logprobs is not None for b in rows)
        host_z = ek.to_numpy(z).astype(np.float64) if wants else None
        for i, b in enumerate(rows):
            request = self.rows[b]
            if request is None:
                continue
            if bad[b]:
                self._end(b, "not_finite")
                continue
            if count[b] > counts_before[b]:
                token = int(out[b, count[b] - 1])
                logprob, top = self._logprobs(host_z, i, token, request.top_logprobs)
                request.stats.setdefault("first_token", time.monotonic())
                request.on_token(token, logprob, top)
            if done[b]:
                self._end(b, "stop" if stopped[b] >= 0 else "length")

    @staticmethod
    def _logprobs(z: Any, i: int, token: int, k: int | None) -> tuple[float | None, list[tuple[int, float]]]:
        """The token's log-probability under the model (head 0's softmax, before any sampling filter) and
        the k most likely tokens with theirs; (None, []) when not asked for."""
        if k is None or z is None:
            return None, []
        row = z[i] - z[i].max()
        logp = row - np.log(np.exp(row).sum())  # (V,)
        best = np.argsort(-logp, kind="stable")[:k]
        return float(logp[token]), [(int(t), float(logp[t])) for t in best]

    def _end(self, row: int, reason: str) -> None:
        request = self.rows[row]
        self.rows[row] = None
        self.state.end_row(row)
        request.on_end(reason)
