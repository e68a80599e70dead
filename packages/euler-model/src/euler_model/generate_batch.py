"""Batched generation: B prompts of different lengths decoded together, each with its own stops.

The prompts are prefilled and the rows then advance together (decode_batch.py), one step for the whole
batch at a time (captured as a CUDA graph on the GPU), until every row has met a stop token or its
limit. Sampling runs on the device with the rules of sampling.py; row b draws its uniforms from
numpy.random.default_rng(seeds[b]) in the order the one-prompt generator draws them, so row b's tokens
are those of `generate(prompts[b], max_new_tokens[b], seed=seeds[b], ...)` (the one-prompt generator
streams a batch of one; up to the rounding of a batched product, which decides a token only at a tie).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import euler_kernels as ek
from euler_model.config import ModelConfig
from euler_model.cpu_threads import one_blas_thread_for
from euler_model.decode_batch import start
from euler_model.decode_speculative import speculation
from euler_model.decode_step import Picker
from euler_model.generate import GenerationStats, checked_prompt
from euler_model.sampling import check_sampling_args

SYNC_EVERY = 16  # on the GPU, the most decode steps between two looks at how far the rows are


@dataclass(frozen=True)
class Completion:
    """One row's result: the new tokens (a stop token excluded) and the stop token that ended them (None
    when the row's limit or the context did)."""

    tokens: list[int]
    stop: int | None


def _per_row(value: Any, b: int, what: str) -> list:
    """A per-row argument as a list of b items: one value for every row, or a sequence of b values."""
    if isinstance(value, int | float | np.integer) or value is None:
        return [value] * b
    items = list(value)
    if len(items) != b:
        raise ValueError(f"generate_batch: {what} needs one value or one per prompt ({b}), got {len(items)}")
    return items


def _stop_sets(stop_tokens: Any, b: int) -> list[set[int]]:
    """Stop ids shared by every row (ints) or one collection per row."""
    items = list(stop_tokens)
    if all(isinstance(t, int | np.integer) for t in items):
        return [{int(t) for t in items}] * b
    return [{int(t) for t in row} for row in _per_row(items, b, "stop_tokens")]


def generate_batch(
    config: ModelConfig,
    params: dict[str, Any],
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int | Sequence[int],
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float = 1.0,
    stop_tokens: Sequence[int] | Sequence[Sequence[int]] = (),
    seeds: Sequence[int | None] | None = None,
    cuda_graph: bool = True,
    stats: GenerationStats | None = None,
    speculative: bool = False,
    draft_tree: tuple[int, ...] | None = None,
    precision: ek.Precision = ek.EXACT,
) -> list[Completion]:
    """One Completion per prompt, in order: up to max_new_tokens new ids each (one limit, or one per
    prompt), ending early at a stop token (not included) or where prompt + output fill the context.

    temperature 0 is greedy; sampling arguments are those of `generate`, shared by the rows. stop_tokens:
    ids that stop every row, or one collection of ids per row. seeds: one per row (None: fresh entropy).
    cuda_graph: on the GPU, capture the decode step as a CUDA graph (stats.decode says how it ran).
    speculative: heads 1..K-1 draft and each step verifies them (decode_speculative.py; needs K >= 2, else
    plain steps): the same tokens in fewer steps (stats.drafted / accepted), greedy or sampled.
    draft_tree: the drafts' parents (euler_kernels.draft_tree; at most K - 1 deep), by default
    default_draft_tree(config), a chain (bit-equal to plain decoding, greedy or sampled; a tree decodes
    greedily, and its branches may flip a near-tie that float rounding decides, see
    decode_speculative.py). precision: how the products are computed on
    the GPU (euler_kernels.Precision; its bf16 modes decode with bf16 weight copies).

    >>> from euler_model import preset, init_params
    >>> cfg = preset("tiny"); p = init_params(cfg)
    >>> [len(c.tokens) for c in generate_batch(cfg, p, [[1, 2, 3], [4]], [4, 2], temperature=0.0)]
    [4, 2]
    """
    b = len(prompts)
    if b == 0:
        raise ValueError("generate_batch: no prompts")
    rows = [checked_prompt(config, p, f"generate_batch: prompt {i}") for i, p in enumerate(prompts)]
    check_sampling_args(temperature, top_k, top_p, repetition_penalty)
    try:
        tree = speculation(config, draft_tree, speculative, temperature, repetition_penalty)
    except ValueError as err:
        raise ValueError(f"generate_batch: {err}") from None
    wanted = _per_row(max_new_tokens, b, "max_new_tokens")
    if not all(isinstance(n, int | np.integer) and n >= 0 for n in wanted):
        raise ValueError(f"generate_batch: max_new_tokens must be ints >= 0, got {wanted}")
    stops = _stop_sets(stop_tokens, b)
    row_seeds = [None] * b if seeds is None else _per_row(list(seeds), b, "seeds")
    limits = [min(int(n), config.context - len(p)) for n, p in zip(wanted, rows)]  # the context's room
    xp = ek.get_array_module(params["embed"])
    picker = Picker(temperature, top_k, top_p, repetition_penalty)
    with one_blas_thread_for(params["embed"]):  # NumPy: small products, one BLAS thread each
        run = start(config, params, rows, limits, stops, row_seeds, picker, tree, cuda_graph, precision)
        try:
            while (ahead := run.ahead(1 if xp is np else SYNC_EVERY)) > 0:
                for _ in range(ahead):
                    run.step()
            run.runner.synchronize()
            bad = run.not_finite() if temperature > 0 else []
            results = [Completion(tokens, stop) for tokens, stop in run.results()]
            drafted, accepted = int(run.state.drafted.sum()), int(run.state.accepted.sum())
        finally:
            run.finish()  # the state is read: a kept decoder may serve the next call
    if bad:
        raise ValueError(
            f"generate_batch: the probabilities of prompts {bad} are not finite (NaN or inf logits)"
        )
    stats = GenerationStats() if stats is None else stats
    stats.forwards += b + run.steps
    stats.generated += sum(len(c.tokens) for c in results)
    stats.drafted += drafted
    stats.accepted += accepted
    stats.decode = run.runner.mode
    return results
