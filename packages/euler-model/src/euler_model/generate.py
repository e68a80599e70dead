"""Generation: `generate_batch` decodes B prompts together, `generate` streams a batch of one.

Both run one decode loop (decode): a lent Decoder (decode_batch.py) prefills the prompts, then steps
every row together until each has met a stop token or its limit, plain or speculative (heads 1..K-1
draft, head 0 verifies: the same tokens in fewer steps, decode_step.py). Row b draws its uniforms
from numpy.random.default_rng(seeds[b]) in order, so its tokens are those of
`generate(prompts[b], max_new_tokens[b], seed=seeds[b], ...)`: a row's arithmetic never depends on its
neighbours (up to the rounding of a batched product, which decides a token only at a tie).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import euler_kernels as ek
from euler_model.config import ModelConfig
from euler_model.cpu_threads import one_blas_thread_for
from euler_model.decode_batch import Decoder, decode
from euler_model.decode_step import Tree, speculation
from euler_model.sampling import Picker

SYNC_EVERY = 16  # on the GPU, the most decode steps between two looks at how far the rows are


@dataclass
class GenerationStats:
    """Counters filled in by generate(stats=...) and generate_batch(stats=...)."""

    forwards: int = 0  # trunk forward passes: one a prompt, one a step
    generated: int = 0  # tokens emitted
    drafted: int = 0  # speculative drafts proposed by heads 1..K-1
    accepted: int = 0  # drafts that head 0 agreed with
    decode: str = ""  # how the decode steps ran ("eager", "cuda graph", ...)

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_forward(self) -> float:
        """Tokens emitted per forward pass after the prompt (1 for plain decoding)."""
        return self.generated / max(self.forwards - 1, 1)


@dataclass(frozen=True)
class Completion:
    """One row's result: the new tokens (a stop token excluded) and the stop token that ended them (None
    when the row's limit or the context did)."""

    tokens: list[int]
    stop: int | None


def _checked(
    config: ModelConfig, what: str, prompts: list, sampling: tuple, speculative: bool, tree: Tree
) -> tuple[list[list[int]], Tree, Picker]:
    """(the prompts as lists of ints, the draft tree or None, the picker of the sampling arguments); a
    ValueError for a bad argument (a prompt needs 1 to context - 1 ids of the vocabulary)."""
    rows = []
    for i, prompt in enumerate(prompts):
        name = f"{what}: the prompt" if what == "generate" else f"{what}: prompt {i}"
        row = [int(t) for t in prompt]
        if not 1 <= len(row) < config.context:
            raise ValueError(f"{name} needs 1 to {config.context - 1} tokens, got {len(row)}")
        if min(row) < 0 or max(row) >= config.vocab_size:
            raise ValueError(f"{name} ids must be in [0, {config.vocab_size}), got {min(row)}..{max(row)}")
        rows.append(row)
    temperature, top_k, top_p, penalty = sampling
    if temperature < 0:
        raise ValueError(f"generate: temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"generate: top_k must be >= 1 or None, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"generate: top_p must be in (0, 1] or None, got {top_p}")
    if penalty <= 0:
        raise ValueError(f"generate: repetition_penalty must be > 0, got {penalty}")
    try:
        tree = speculation(config, tree, speculative, temperature, penalty)
    except ValueError as err:
        raise ValueError(f"{what}: {err}") from None
    return rows, tree, Picker(*sampling)


def generate(
    config: ModelConfig,
    params: dict[str, Any],
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float = 1.0,
    stop_tokens: Sequence[int] = (),
    seed: int | None = None,
    speculative: bool = False,
    stats: GenerationStats | None = None,
    draft_tree: tuple[int, ...] | None = None,
    precision: ek.Precision = ek.EXACT,
) -> Iterator[int]:
    """An iterator over up to max_new_tokens new token ids after prompt_ids, each yielded once its step is
    done; the arguments are generate_batch's for one prompt, checked at once.

    >>> from euler_model import preset, init_params
    >>> cfg = preset("tiny"); p = init_params(cfg)
    >>> len(list(generate(cfg, p, [1, 2, 3], 4, temperature=0.0)))
    4
    """
    sampling = (temperature, top_k, top_p, repetition_penalty)
    (prompt,), tree, picker = _checked(config, "generate", [prompt_ids], sampling, speculative, draft_tree)
    limit = max(0, min(int(max_new_tokens), config.context - len(prompt)))  # the context's room
    stats = GenerationStats() if stats is None else stats
    row = (prompt, limit, {int(t) for t in stop_tokens}, seed)
    return _streamed(decode(config, params, [row], picker, tree, True, precision, stats, 1), stats)


def _streamed(decoding: Iterator[tuple[Decoder, bool]], stats: GenerationStats) -> Iterator[int]:
    """Row 0's new tokens as each look finds them."""
    shown = 0
    try:
        for decoder, _ in decoding:
            state = decoder.state
            if ek.to_numpy(state.bad)[0]:
                raise ValueError("generate: the probabilities are not finite (NaN or inf logits)")
            count = int(ek.to_numpy(state.count)[0])
            for token in ek.to_numpy(state.out[0, shown:count]).tolist():
                stats.generated += 1
                yield token
            shown = count
    finally:
        decoding.close()  # also when the caller stops early: the decoder goes back


def _per_row(value: Any, b: int, what: str) -> list:
    """A per-row argument as a list of b items: one value for every row, or a sequence of b values."""
    if isinstance(value, int | float | np.integer) or value is None:
        return [value] * b
    items = list(value)
    if len(items) != b:
        raise ValueError(f"generate_batch: {what} needs one value or one per prompt ({b}), got {len(items)}")
    return items


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

    temperature 0 is greedy, else the j-th sampled token of row b takes the j-th draw of
    numpy.random.default_rng(seeds[b]) (seeds: one per row; None: fresh entropy), filtered by top_k,
    top_p and repetition_penalty (sampling.py). stop_tokens: ids that stop every row, or one collection per
    row. cuda_graph: on the GPU, capture the decode step as a CUDA graph (stats.decode says how it ran).
    speculative: heads 1..K-1 draft along draft_tree (euler_kernels.draft_tree; default_draft_tree(config)
    by default, a chain) and each step verifies them: the same tokens in fewer steps (needs K >= 2, else
    plain steps; a tree with branches decodes greedily, and may flip a near-tie that rounding decides).
    precision: how the products are computed on the GPU (euler_kernels.Precision).

    >>> from euler_model import preset, init_params
    >>> cfg = preset("tiny"); p = init_params(cfg)
    >>> [len(c.tokens) for c in generate_batch(cfg, p, [[1, 2, 3], [4]], [4, 2], temperature=0.0)]
    [4, 2]
    """
    b = len(prompts)
    if b == 0:
        raise ValueError("generate_batch: no prompts")
    sampling = (temperature, top_k, top_p, repetition_penalty)
    rows, tree, picker = _checked(config, "generate_batch", list(prompts), sampling, speculative, draft_tree)
    wanted = _per_row(max_new_tokens, b, "max_new_tokens")
    if not all(isinstance(n, int | np.integer) and n >= 0 for n in wanted):
        raise ValueError(f"generate_batch: max_new_tokens must be ints >= 0, got {wanted}")
    stops = list(stop_tokens)
    if all(isinstance(t, int | np.integer) for t in stops):  # ids shared by every row
        stops = [stops] * b
    stops = [{int(t) for t in row} for row in _per_row(stops, b, "stop_tokens")]
    row_seeds = [None] * b if seeds is None else _per_row(list(seeds), b, "seeds")
    limits = [min(int(n), config.context - len(p)) for n, p in zip(wanted, rows)]  # the context's room
    stats = GenerationStats() if stats is None else stats
    most = 1 if ek.get_array_module(params["embed"]) is np else SYNC_EVERY
    args = (picker, tree, cuda_graph, precision, stats, most)
    with one_blas_thread_for(params["embed"]):  # (decode holds it only while stepping)
        for decoder, done in decode(config, params, list(zip(rows, limits, stops, row_seeds)), *args):
            if done:  # read before the decoder goes back
                results = decoder.results()
    bad = [i for i, (_, _, not_finite) in enumerate(results) if not_finite and temperature > 0]
    if bad:
        raise ValueError(
            f"generate_batch: the probabilities of prompts {bad} are not finite (NaN or inf logits)"
        )
    stats.generated += sum(len(tokens) for tokens, _, _ in results)
    return [Completion(tokens, stop) for tokens, stop, _ in results]
