"""Starting the decoding of a batch: the static state, the prefill, the decode step and its runner; shared
by generate_batch (every row to its end) and generate (one row, its tokens streamed as they come).

The prompts are prefilled by the training kernels (trunk_forward, the prompts of one length together in
adjacent rows of the state), each layer writing its keys/values straight into those rows of the static
cache (decode_state.PrefillRows); the rows then advance
together, one step (decode_step, or speculative_step with its draft tree) for the whole batch at a time,
captured as a CUDA graph on the GPU. All of it lives in a Decoder, which on the GPU is kept for the next
call of the same model and batch shape (decode_keep.py): that call skips the setup, and a prompt-length
pattern it has seen before has its whole prefill replayed as one CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

import euler_kernels as ek
from euler_kernels import draft_tree
from euler_model.config import ModelConfig
from euler_model.decode_graph import DecodeGraph, EagerDecode, decode_runner
from euler_model.decode_keep import kept_decoder, kept_weights
from euler_model.decode_speculative import draft, drafting_heads, speculative_step
from euler_model.decode_state import DecodeState, PrefillRows, copy_in
from euler_model.decode_step import Picker, attention_window, decode_step, inference_weights
from euler_model.model import trunk_forward

PROMPT_PATTERNS = 16  # prompt-length patterns a decoder remembers (the oldest and its prefill graph dropped)


def uniforms(seeds: list[int | None], width: int) -> np.ndarray:
    """(B, width + 1) draws: row b's from numpy.random.default_rng(seeds[b]), in order."""
    return np.stack([np.random.default_rng(s).random(width + 1) for s in seeds])


def prefill(
    config: ModelConfig,
    params: dict[str, Any],
    state: DecodeState,
    groups: list[tuple[slice, Any]],
    precision: ek.Precision,
) -> tuple[Any, Any]:
    """The prompts through the trunk, one group of a length at a time (adjacent rows, their tokens (G, T)),
    each layer's keys/values written into those rows of the state's caches; head 0's logits (B, V) after
    each last token, and the hidden states (B, C) they came from."""
    xp = ek.get_array_module(params["embed"])
    b = sum(rows.stop - rows.start for rows, _ in groups)
    logits = hidden = None
    for rows, tokens in groups:
        h = trunk_forward(config, params, tokens, kv=PrefillRows(state, rows), precision=precision)[0]
        z = ek.linear_forward(h[:, -1], params["heads.0"], precision=precision)[0]  # (G, V)
        if logits is None:
            logits = xp.empty((b, z.shape[1]), dtype=z.dtype)  # (B, V)
            hidden = xp.empty((b, h.shape[2]), dtype=h.dtype)  # (B, C)
        logits[rows], hidden[rows] = z, h[:, -1]  # h (G, T, C)
    return logits, hidden


@dataclass
class Decoding:
    """A batch being decoded: its state, the runner of its step, and how many steps have run."""

    config: ModelConfig
    state: DecodeState
    runner: EagerDecode | DecodeGraph
    fed: int  # tokens a step feeds a row (T when speculative, else 1)
    longest: int  # the longest prompt
    kernel: bool  # the decode attention kernel serves (it reads each row's own slots)
    order: list[int]  # row i of the state holds prompt order[i] (prompts of a length in adjacent rows)
    decoder: Any = None  # the Decoder it runs in, lent until `finish`
    steps: int = 0

    def step(self) -> None:
        """One more step for every row."""
        last = self.longest + (self.steps + 1) * self.fed - 1  # no row feeds a token past this position
        self.runner.run(attention_window(self.config, last, self.kernel, slots=self.state.k.shape[3]))
        self.steps += 1

    def ahead(self, most: int) -> int:
        """How many steps to run before looking again: 0 once every row is done, else the fewest that
        could end every row still going at its limit (a step emits at most `fed` tokens a row), at most
        `most` (a stop token may end a row sooner). A read back to the host (on the GPU a sync)."""
        state, xp = self.state, ek.get_array_module(self.state.done)
        with self.runner.ordered():
            left = int(xp.where(state.done, 0, state.limit - state.count).max())  # most tokens a row lacks
        return min(most, -(-left // self.fed))

    def results(self) -> list[tuple[list[int], int | None]]:
        """(tokens, the stop token that ended it or None) of each prompt, in the caller's order (a read
        back to the host)."""
        by_prompt: list[Any] = [None] * len(self.order)
        for row, result in zip(self.order, self.state.results()):
            by_prompt[row] = result
        return by_prompt

    def not_finite(self) -> list[int]:
        """The prompts (the caller's indices) that sampled from probabilities that were not finite."""
        return sorted(self.order[i] for i in np.flatnonzero(ek.to_numpy(self.state.bad)))

    def finish(self) -> None:
        """Give the decoder back (a kept one may then serve the next call); the state is read before."""
        self.decoder.busy = False


class Decoder:
    """What a batch of B rows decodes with, made once: the inference weights, the static state, the step
    and its runner; `begin` starts a call's prompts in it. tree: a speculative step's draft tree (greedy,
    its depth <= K - 1), None for plain steps. kept: the decoder serves call after call (decode_keep.py),
    so each call first rewrites its weight copies from params (which a trainer may have updated in place),
    and a prompt-length pattern seen before has its prefill replayed from a CUDA graph. weights: inference
    weights to use (the kept decoders of a model share theirs), by default made here. precision: how the
    products are computed (euler_kernels.Precision)."""

    def __init__(
        self,
        config: ModelConfig,
        params: dict[str, Any],
        batch: int,
        picker: Picker,
        tree: tuple[int, ...] | None,
        cuda_graph: bool,
        precision: ek.Precision,
        kept: bool = False,
        weights: dict[str, Any] | None = None,
    ) -> None:
        xp = ek.get_array_module(params["embed"])
        self.config, self.params, self.picker, self.kept = config, params, picker, kept
        self.precision = precision
        self.fed = 1 if tree is None else len(tree) + 1
        self.state = DecodeState.allocate(config, xp, params["embed"].dtype, batch, self.fed - 1)
        self.drafters = drafting_heads(tree)
        if weights is None:
            weights = inference_weights(config, params, self.drafters, precision=precision)
        self.weights = weights
        self.tree = None if tree is None or tree == draft_tree.chain(len(tree)) else tree  # a chain: no masks
        if tree is not None:
            step = partial(speculative_step, config, self.weights, self.state, self.tree, picker, precision)
        else:
            step = partial(decode_step, config, self.weights, self.state, picker, precision)
        self.runner = decode_runner(step, xp, cuda_graph)
        self.kernel = ek.decode_attention_kernel(self.state.k[0], config.n_heads, self.fed)  # own slots
        self.prompt_tokens: dict[tuple[int, ...], list[tuple[slice, Any]]] = {}  # lengths -> groups
        self.busy = False  # lent to a decoding (decode_keep.py)

    def begin(
        self, rows: list[list[int]], limits: list[int], stops: list[set[int]], seeds: list[int | None]
    ) -> Decoding:
        """The call's state set, its prompts prefilled and their first tokens recorded (and drafted after),
        the step ready to run. The state's rows hold the prompts shortest first (Decoding.order), so that
        the prompts of a length are adjacent rows, prefilled together."""
        order = sorted(range(len(rows)), key=lambda b: len(rows[b]))
        rows, limits, stops, seeds = ([values[b] for b in order] for values in (rows, limits, stops, seeds))
        lengths = tuple(len(p) for p in rows)
        seen = lengths in self.prompt_tokens
        with self.runner.ordered():
            self.state.reset(rows, limits, stops, uniforms(seeds, max(limits)))
            groups = self._prompt_tokens(lengths)
            for members, tokens in groups:
                copy_in(tokens, np.asarray(rows[members], dtype=np.int64))
        # a pattern's prefill is recorded the second time it comes (a one-off prompt length costs no capture)
        self.runner.call(("prefill", lengths), partial(self._prefill, groups), capture=seen and self.kept)
        return Decoding(self.config, self.state, self.runner, self.fed, lengths[-1], self.kernel, order, self)

    def _prompt_tokens(self, lengths: tuple[int, ...]) -> list[tuple[slice, Any]]:
        """(a run of adjacent rows, their tokens' device buffer (G, T)) for each prompt length of `lengths`
        (ascending), made once per pattern."""
        if lengths not in self.prompt_tokens:
            xp = ek.get_array_module(self.params["embed"])
            starts = [b for b in range(len(lengths)) if b == 0 or lengths[b] != lengths[b - 1]]
            runs = [slice(a, z) for a, z in zip(starts, [*starts[1:], len(lengths)])]
            groups = [
                (rows, xp.zeros((rows.stop - rows.start, lengths[rows.start]), dtype=xp.int64))
                for rows in runs
            ]
            self.prompt_tokens[lengths] = groups
            if len(self.prompt_tokens) > PROMPT_PATTERNS:  # a chat's prompts grow: forget the oldest length
                self.runner.forget(("prefill", next(iter(self.prompt_tokens))))
                del self.prompt_tokens[next(iter(self.prompt_tokens))]
        return self.prompt_tokens[lengths]

    def _prefill(self, groups: list[tuple[slice, Any]]) -> None:
        """Device work only, so that it can be captured: the weights refreshed (a kept decoder's), the
        prompts prefilled, their first tokens picked and recorded, a speculative step's first drafts made."""
        config, params, state, precision = self.config, self.params, self.state, self.precision
        if self.kept:
            inference_weights(config, params, self.drafters, self.weights, precision)
        logits, hidden = prefill(config, params, state, groups, precision)
        state.record(self.picker.pick(logits, state))
        if self.drafters:
            draft(config, self.weights, state.last, state.drafts, hidden, self.tree, precision)


def start(
    config: ModelConfig,
    params: dict[str, Any],
    rows: list[list[int]],
    limits: list[int],
    stops: list[set[int]],
    seeds: list[int | None],
    picker: Picker,
    tree: tuple[int, ...] | None,
    cuda_graph: bool,
    precision: ek.Precision,
) -> Decoding:
    """The state set, the prompts prefilled and their first tokens recorded, the step ready to run: in a
    new Decoder, or on the GPU with cuda_graph in a kept one (decode_keep.py), lent to this decoding until
    `finish`; tree: a speculative step's draft tree (greedy, its depth <= K - 1, drafts from the prefill's
    last hidden states), None for plain steps."""
    decoder = None
    if cuda_graph and ek.get_array_module(params["embed"]) is not np:

        def make() -> Decoder:
            drafters = drafting_heads(tree)
            make_weights = partial(inference_weights, config, params, drafters, precision=precision)
            weights = kept_weights(drafters, make_weights)
            return Decoder(config, params, len(rows), picker, tree, cuda_graph, precision, True, weights)

        decoder = kept_decoder(config, params, precision, (len(rows), picker, tree), make)
    if decoder is None:
        decoder = Decoder(config, params, len(rows), picker, tree, cuda_graph, precision)
        decoder.busy = True
    try:
        return decoder.begin(rows, limits, stops, seeds)
    except BaseException:
        decoder.busy = False  # a call that failed to start lends nothing
        raise
