"""Streaming generation: sampling, and speculative decoding with the MTP heads.

Plain decoding streams a batch of one through decode_batch.py (the static cache and decode step of
generate_batch; on the GPU one CUDA graph), yielding each token once its step is done.

Speculative decoding (greedy output identical to plain decoding), over a KVCache: at the last accepted
position, heads 1..K-1 draft the K-1 tokens after head 0's next token; one forward over [next token, drafts]
lets head 0 check each draft; the longest prefix of drafts head 0 agrees with is kept, plus head 0's
own token after it, and the KV cache is rolled back past the rejected drafts. When sampling, head 0's
token at each checked position is sampled and a draft is kept only if it equals that sample, so every
emitted token is still a sample from head 0's distribution given everything before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

import euler_kernels as ek
from euler_model.config import ModelConfig
from euler_model.cpu_threads import one_blas_thread_for
from euler_model.decode_batch import start
from euler_model.decode_step import Picker
from euler_model.kv_cache import KVCache
from euler_model.model import trunk_forward
from euler_model.sampling import check_sampling_args, choose_token


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


def _host_logits(h: Any, weight: Any, precision: ek.Precision) -> np.ndarray:
    """Logits of the hidden rows h (1, T, C) under one head weight (V', C), as NumPy (T, V')."""
    z = ek.linear_forward(h[0], weight, precision=precision)[0]  # (T, V')
    return z.get() if hasattr(z, "get") else np.asarray(z)


def _forward(config, params, cache, ids: Sequence[int], stats: GenerationStats, precision) -> Any:
    """Run ids through the trunk, appending to the cache; the hidden states (1, T, C)."""
    xp = ek.get_array_module(params["embed"])
    stats.forwards += 1
    tokens = xp.asarray([list(ids)], dtype=xp.int64)  # (1, T)
    return trunk_forward(config, params, tokens, kv=cache, precision=precision)[0]


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
) -> Iterator[int]:
    """A batch of one decoded by decode_batch (on the GPU, its step a CUDA graph), each new token yielded
    as its step is done; the steps run inside `hold()` (BLAS at one thread), not the caller's work between
    tokens."""
    with hold():
        run = start(config, params, [prompt], [limit], [stop], [seed], picker, None, True, precision)
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
        run.finish()  # also when the caller stops early: a kept decoder may serve the next call


def _confident_drafts(guesses: np.ndarray, threshold: float) -> list[int]:
    """Argmax of each drafting head's logits (m, V), cut at the first one less likely than threshold."""
    drafts = []
    for z in guesses:
        best = int(np.argmax(z))
        if threshold > 0 and 1.0 / np.exp(z - z[best]).sum() < threshold:  # softmax prob of the argmax
            break
        drafts.append(best)
    return drafts


def _draft(
    config: ModelConfig,
    params: dict,
    h: Any,
    token: int,
    drafters: Any,
    room: int,
    threshold: float,
    precision: ek.Precision,
) -> list[int]:
    """At most `room` drafts from heads 1..K-1 at the hidden row h (1, 1, C), whose head 0 gave `token`.

    Head k guesses the token k places after head 0's next token; drafters stacks their weights. Conditioned
    heads (config.mtp_conditioned) guess one after the other, head k from h + P_k e(the token before).
    """
    m = max(0, min(config.n_mtp_heads - 1, room))
    if not config.mtp_conditioned:
        guesses = _host_logits(h, drafters[: m * config.vocab_size], precision).reshape(m, config.vocab_size)
        return _confident_drafts(guesses, threshold)
    drafts, before = [], token
    for k in range(1, m + 1):
        e = ek.embedding_forward(params["embed"], ek.get_array_module(h).asarray([[before]]))[0]  # (1, 1, C)
        a = h + ek.linear_forward(e, params[f"heads_cond.{k}"], precision=precision)[0]
        guess = _confident_drafts(_host_logits(a, params[f"heads.{k}"], precision), threshold)
        if not guess:
            break
        drafts.append(guess[0])
        before = guess[0]
    return drafts


def _speculative(
    config, params, cache, history, pick, stats, budget: int, threshold: float, precision
) -> Iterator[int]:
    """Heads 1..K-1 draft, head 0 verifies them all in one forward; see the module docstring."""
    xp = ek.get_array_module(params["embed"])
    drafters = xp.concatenate([params[f"heads.{k}"] for k in range(1, config.n_mtp_heads)])  # ((K-1)V, C)
    h = _forward(config, params, cache, history, stats, precision)[:, -1:]  # the last position's (1, 1, C)
    token = pick(_host_logits(h, params["heads.0"], precision)[0], history)
    history.append(token)
    yield token
    produced = 1
    while len(history) < config.context:
        room = min(config.context - len(history), budget - produced) - 1  # tokens worth drafting
        drafts = _draft(config, params, h, token, drafters, room, threshold, precision)
        m = len(drafts)
        stats.drafted += m
        start = cache.length  # position of `token`
        hs = _forward(config, params, cache, [token, *drafts], stats, precision)  # (1, 1 + m, C)
        checks = _host_logits(hs, params["heads.0"], precision)  # (1 + m, V): head 0 after each input token
        for i in range(m + 1):
            g = pick(checks[i], history)
            history.append(g)
            produced += 1
            yield g
            if i < m and g == drafts[i]:
                stats.accepted += 1
                continue
            cache.rollback(start + i + 1)  # keep `token` and the i accepted drafts
            token, h = g, hs[:, i : i + 1]
            break


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
    draft_threshold: float = 0.1,
    precision: ek.Precision = ek.EXACT,
) -> Iterator[int]:
    """An iterator over up to max_new_tokens new token ids after prompt_ids (streaming).

    temperature 0 is greedy decoding. A stop token ends generation and is not yielded. Generation
    also ends when prompt + output fill the context. speculative=True drafts with the MTP heads
    (needs K >= 2; greedy output is identical to plain greedy). Pass a GenerationStats to read counters.
    draft_threshold: a draft whose drafting head gives it less probability than this is not proposed
    (the chain of drafts stops there), so hopeless drafts cost no verification; 0 proposes every draft.
    It never changes the output, only the speed. precision: how the products are computed on the GPU
    (euler_kernels.Precision).
    Arguments are checked at once, before the first token is asked for.

    >>> from euler_model import preset, init_params
    >>> cfg = preset("tiny"); p = init_params(cfg)
    >>> len(list(generate(cfg, p, [1, 2, 3], 4, temperature=0.0)))
    4
    """
    prompt = checked_prompt(config, prompt_ids, "generate: the prompt")
    check_sampling_args(temperature, top_k, top_p, repetition_penalty)
    stats = GenerationStats() if stats is None else stats
    stop = {int(t) for t in stop_tokens}
    hold = partial(one_blas_thread_for, params["embed"])  # NumPy: small products, one BLAS thread each
    if not (speculative and config.n_mtp_heads > 1):
        limit = max(0, min(int(max_new_tokens), config.context - len(prompt)))  # the context's room
        picker = Picker(temperature, top_k, top_p, repetition_penalty)
        return _streamed(config, params, prompt, limit, stop, seed, picker, stats, hold, precision)
    pick = partial(
        choose_token,
        rng=np.random.default_rng(seed),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        repetition_penalty=repetition_penalty,
    )
    xp = ek.get_array_module(params["embed"])
    cache = KVCache(config, 1, dtype=params["embed"].dtype, xp=xp)
    steps = _speculative(
        config, params, cache, prompt, pick, stats, max_new_tokens, draft_threshold, precision
    )
    return _until_stop(steps, max_new_tokens, stop, stats, hold)


def _until_stop(
    steps: Iterator[int], max_new: int, stop: set[int], stats: GenerationStats, hold: Callable[[], Any]
) -> Iterator[int]:
    """Pass tokens on until max_new were yielded or a stop token (not yielded) comes; each step runs
    inside `hold()` (not across the yield: the caller's own work between tokens keeps its BLAS threads)."""
    count = 0
    while count < max_new:
        with hold():
            token = next(steps, None)
        if token is None or token in stop:
            return
        count += 1
        stats.generated += 1
        yield token
