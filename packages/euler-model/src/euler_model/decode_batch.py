"""Starting the decoding of a batch: the static state, the prefill, the decode step and its runner; shared
by generate_batch (every row to its end) and generate (one row, its tokens streamed as they come).

The prompts are prefilled by the training kernels (trunk_forward into a KVCache, the prompts of one
length together), their keys/values copied into their rows of the static cache; the rows then advance
together, one step (decode_step, or speculative_step with its draft tree) for the whole batch at a time,
captured as a CUDA graph on the GPU.
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
from euler_model.decode_speculative import draft, drafting_heads, speculative_step
from euler_model.decode_state import DecodeState
from euler_model.decode_step import Picker, attention_window, decode_step, inference_weights
from euler_model.kv_cache import KVCache
from euler_model.model import trunk_forward


def uniforms(seeds: list[int | None], width: int) -> np.ndarray:
    """(B, width + 1) draws: row b's from numpy.random.default_rng(seeds[b]), in order."""
    return np.stack([np.random.default_rng(s).random(width + 1) for s in seeds])


def prefill(
    config: ModelConfig, params: dict[str, Any], state: DecodeState, prompts: list[list[int]]
) -> tuple[Any, Any]:
    """The prompts through the trunk, those of one length together (trunk_forward into a KVCache of their
    number), their keys/values copied into their rows; head 0's logits (B, V) after each last token, and
    the hidden states (B, C) they came from."""
    xp = ek.get_array_module(params["embed"])
    by_length: dict[int, list[int]] = {}
    for b, prompt in enumerate(prompts):
        by_length.setdefault(len(prompt), []).append(b)
    logits, hidden = [None] * len(prompts), [None] * len(prompts)
    for rows in by_length.values():
        cache = KVCache(config, len(rows), dtype=params["embed"].dtype, xp=xp)
        tokens = xp.asarray([prompts[b] for b in rows], dtype=xp.int64)  # (G, T)
        h = trunk_forward(config, params, tokens, kv=cache)[0]  # (G, T, C)
        z = ek.linear_forward(h[:, -1], params["heads.0"])[0]  # (G, V)
        for j, b in enumerate(rows):
            state.copy_prefill(b, cache, j)
            logits[b], hidden[b] = z[j : j + 1], h[j : j + 1, -1]
    return xp.concatenate(logits), xp.concatenate(hidden)


@dataclass
class Decoding:
    """A batch being decoded: its state, the runner of its step, and how many steps have run."""

    config: ModelConfig
    state: DecodeState
    runner: EagerDecode | DecodeGraph
    fed: int  # tokens a step feeds a row (T when speculative, else 1)
    longest: int  # the longest prompt
    kernel: bool  # the decode attention kernel serves (it reads each row's own slots)
    steps: int = 0

    def step(self) -> None:
        """One more step for every row."""
        last = self.longest + (self.steps + 1) * self.fed - 1  # no row feeds a token past this position
        self.runner.run(attention_window(self.config, last, self.kernel, slots=self.state.k.shape[3]))
        self.steps += 1


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
) -> Decoding:
    """The state allocated, the prompts prefilled and their first tokens recorded, the step ready to run;
    tree: a speculative step's draft tree (greedy, its depth <= K - 1, drafts from the prefill's last
    hidden states), None for plain steps."""
    xp = ek.get_array_module(params["embed"])
    fed = 1 if tree is None else len(tree) + 1
    state = DecodeState.allocate(
        config, xp, params["embed"].dtype, rows, limits, stops, uniforms(seeds, max(limits)), fed - 1
    )
    logits, hidden = prefill(config, params, state, rows)
    state.record(picker.pick(logits, state))
    weights = inference_weights(config, params, drafters=0 if tree is None else drafting_heads(tree))
    if tree is not None:
        as_given = None if tree == draft_tree.chain(len(tree)) else tree  # a chain needs no masks or moves
        draft(config, weights, state, hidden, as_given)
        step = partial(speculative_step, config, weights, state, as_given)
    else:
        step = partial(decode_step, config, weights, state, picker)
    runner = decode_runner(step, state.done, cuda_graph)
    kernel = ek.decode_attention_kernel(state.k[0], config.n_heads, fed)  # it reads each row's own slots
    return Decoding(config, state, runner, fed, max(len(p) for p in rows), kernel)
