"""Streaming generation: a batch of one through decode_batch.py (the static cache and decode step of
generate_batch; on the GPU one CUDA graph), each token yielded once its step is done. With speculative=True
the steps are decode_speculative.py's: heads 1..K-1 draft, head 0 verifies the drafts in the same forward,
and the tokens are the ones plain steps would emit, greedy or sampled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import euler_kernels as ek
from euler_model.config import ModelConfig
from euler_model.cpu_threads import one_blas_thread_for
from euler_model.decode_batch import start
from euler_model.decode_speculative import speculation
from euler_model.decode_step import Picker
from euler_model.sampling import check_sampling_args


@dataclass
class GenerationStats:
    """Counters filled in by generate(stats=...): forwards run, tokens emitted, drafts proposed / accepted."""

    forwards: int = 0  # trunk forward passes, the prompt's included
    generated: int = 0  # tokens yielded
    drafted: int = 0  # speculative drafts proposed by heads 1..K-1
    accepted: int = 0  # drafts that head 0 agreed with
    decode: str = ""  # generate_batch: how its decode steps ran ("eager", "cuda graph", ...)

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_forward(self) -> float:
        """Tokens emitted per forward pass after the prompt (1 for plain decoding)."""
        return self.generated / max(self.forwards - 1, 1)


def _streamed(
    config: ModelConfig,
    params: dict[str, Any],
    prompt: list[int],
    limit: int,
    stop: set[int],
    seed: int | None,
    picker: Picker,
    stats: GenerationStats,
    hold: Callable[[], Any],
    precision: ek.Precision,
    tree: tuple[int, ...] | None,
) -> Iterator[int]:
    """A batch of one decoded by decode_batch (on the GPU, its step a CUDA graph), each new token yielded
    as its step is done (a speculative step's several at once); the steps run inside `hold()` (BLAS at one
    thread), not the caller's work between tokens."""
    with hold():
        run = start(config, params, [prompt], [limit], [stop], [seed], picker, tree, True, precision)
    stats.forwards += 1
    shown = 0
    try:
        while True:
            run.runner.synchronize()  # the steps queued on the GPU are done
            count, done, bad = (ek.to_numpy(a)[0] for a in (run.state.count, run.state.done, run.state.bad))
            if bad:
                raise ValueError("generate: the probabilities are not finite (NaN or inf logits)")
            for token in ek.to_numpy(run.state.out[0, shown:count]).tolist():
                stats.generated += 1
                yield token
            shown = count
            if done:
                return
            with hold():
                run.step()
            stats.forwards += 1
    finally:
        stats.drafted += int(ek.to_numpy(run.state.drafted)[0])
        stats.accepted += int(ek.to_numpy(run.state.accepted)[0])
        run.finish()  # also when the caller stops early: a kept decoder may serve the next call


def checked_prompt(config: ModelConfig, prompt_ids: Sequence[int], what: str) -> list[int]:
    """The prompt as a list of ints; ValueError unless it has 1 to context - 1 ids, each in the vocabulary."""
    prompt = [int(t) for t in prompt_ids]
    if not 1 <= len(prompt) < config.context:
        raise ValueError(f"{what} needs 1 to {config.context - 1} tokens, got {len(prompt)}")
    if min(prompt) < 0 or max(prompt) >= config.vocab_size:
        raise ValueError(f"{what} ids must be in [0, {config.vocab_size}), got {min(prompt)}..{max(prompt)}")
    return prompt


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
    """An iterator over up to max_new_tokens new token ids after prompt_ids (streaming).

    temperature 0 is greedy decoding. A stop token ends generation and is not yielded. Generation
    also ends when prompt + output fill the context. The j-th sampled token takes the j-th draw of
    numpy.random.default_rng(seed). speculative=True drafts with the MTP heads (needs K >= 2, else plain
    steps) along draft_tree (generate_batch's; by default default_draft_tree(config), a chain): the same
    tokens as plain decoding, greedy or sampled, in fewer steps. Pass a GenerationStats to read counters.
    precision: how the products are computed on the GPU (euler_kernels.Precision).
    Arguments are checked at once, before the first token is asked for.

    >>> from euler_model import preset, init_params
    >>> cfg = preset("tiny"); p = init_params(cfg)
    >>> len(list(generate(cfg, p, [1, 2, 3], 4, temperature=0.0)))
    4
    """
    prompt = checked_prompt(config, prompt_ids, "generate: the prompt")
    check_sampling_args(temperature, top_k, top_p, repetition_penalty)
    try:
        tree = speculation(config, draft_tree, speculative, temperature, repetition_penalty)
    except ValueError as err:
        raise ValueError(f"generate: {err}") from None
    stats = GenerationStats() if stats is None else stats
    stop = {int(t) for t in stop_tokens}
    hold = partial(one_blas_thread_for, params["embed"])  # NumPy: small products, one BLAS thread each
    limit = max(0, min(int(max_new_tokens), config.context - len(prompt)))  # the context's room
    picker = Picker(temperature, top_k, top_p, repetition_penalty)
    return _streamed(config, params, prompt, limit, stop, seed, picker, stats, hold, precision, tree)
