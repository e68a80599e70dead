"""The chat evaluation of a checkpoint on the held-out (val) split of an SFT set made by `euler-data sft`.

- response bpb: the bits of every response token and of its closing ``<|end|>`` (the tokens SFT trains
  on: the set's loss mask), given the conversation before it, over the UTF-8 bytes of the responses' text;
- stop rate: the share of greedy replies to the prompts (each conversation up to its last assistant
  turn, as `chat` feeds the model) that end with ``<|end|>`` within `max_new_tokens` new tokens; a reply
  that reaches the limit or the end of the context first, or ends with ``<|endoftext|>``, did not stop;
- mean reply length: the tokens of each greedy reply before its stop token (all of them when none came).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import euler_model
from euler_data.sft import SFT_META, read_sft
from euler_train.config import ConfigError
from euler_train.evals.bpb import same_tokenizer
from euler_train.evals.scoring import Row, fit_row, score_rows
from euler_train.sampling import END, EOT, SamplingModel, note

SAMPLES = 3  # greedy replies quoted in the result


def val_examples(folder: str | Path) -> tuple[list[Row], dict[str, Any]]:
    """Every held-out example as a Row (ids, loss mask) and the set's sft_meta.json; ConfigError when the
    folder holds no SFT set or its val split no example."""
    folder = Path(folder)
    names = [SFT_META] + [f"sft_val_{kind}.bin" for kind in ("tokens", "mask", "offsets")]
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise ConfigError(f"{folder} has no {', '.join(missing)}: make an SFT set with `euler-data sft`")
    tokens, mask, offsets, meta = read_sft(folder, "val")
    rows = [Row(tokens[a:b], mask[a:b]) for a, b in itertools.pairwise(offsets)]
    if not rows:
        raise ConfigError(f"{folder}: the SFT set's val split holds no examples (see its sft_meta.json)")
    return rows, meta


def reply_start(mask: np.ndarray) -> int:
    """Index of the first token of the last assistant turn: the start of the mask's last run of ones."""
    ones = np.flatnonzero(np.asarray(mask))
    breaks = np.flatnonzero(np.diff(ones) > 1)
    return int(ones[breaks[-1] + 1] if len(breaks) else ones[0])


def reply_stops(model: SamplingModel) -> tuple[list[int], int | None]:
    """The ids that end a reply (<|end|>, <|endoftext|>, those the tokenizer has) and <|end|>'s (or None)."""
    specials = model.tokenizer.special_tokens
    return sorted({specials.get(END), specials.get(EOT)} - {None}), specials.get(END)


def greedy_reply(model: SamplingModel, prompt: list[int], limit: int) -> tuple[list[int], bool]:
    """The greedy reply's tokens before its stop token, and whether that stop was <|end|> within `limit`."""
    stops, end = reply_stops(model)
    reply = []
    replies = euler_model.generate(model.mcfg, model.params, prompt, limit, 0.0, precision=model.precision)
    for token in replies:
        if token in stops:
            return reply, token == end
        reply.append(token)
    return reply, False


def greedy_replies(
    model: SamplingModel, prompts: list[list[int]], limits: list[int], batch_size: int, progress: Any
) -> list[tuple[list[int], bool]]:
    """greedy_reply of each prompt, batch_size prompts decoded together (euler-model's generate_batch,
    whose rows equal generate's token for token)."""
    stops, end = reply_stops(model)
    out = []
    for start in range(0, len(prompts), batch_size):
        rows = slice(start, start + batch_size)
        done = euler_model.generate_batch(
            model.mcfg,
            model.params,
            prompts[rows],
            limits[rows],
            temperature=0.0,
            stop_tokens=stops,
            precision=model.precision,
        )
        out += [(c.tokens, c.stop is not None and c.stop == end) for c in done]
        if progress is not None:
            progress(len(done))
    return out


def response_bytes(tok: Any, row: Row) -> int:
    """UTF-8 bytes of the text of the tokens `score_rows` scores in a row (masked, after position 0; special
    tokens such as <|end|> have none)."""
    specials = set(tok.special_tokens.values())
    pairs = zip(row.ids[1:].tolist(), row.mask[1:].tolist())
    return sum(len(tok.token_bytes(t)) for t, m in pairs if m and t not in specials)


def replies(
    model: SamplingModel,
    rows: list[Row],
    max_new_tokens: int,
    progress: Callable[[int], None] | None,
    batch_size: int = 16,
) -> list[tuple[list[int], list[int], bool]]:
    """(prompt, reply, stopped) of each example, said on stderr when the context cuts prompts or leaves
    less room than max_new_tokens; batch_size replies are decoded together."""
    context, prompts, limits, cut, short = model.mcfg.context, [], [], 0, 0
    for row in rows:
        prompt = row.ids[: reply_start(row.mask)].tolist()
        if len(prompt) > context - 1:
            prompt, cut = prompt[-(context - 1) :], cut + 1
        limits.append(min(max_new_tokens, context - len(prompt)))
        short += limits[-1] < max_new_tokens
        prompts.append(prompt)
    answers = greedy_replies(model, prompts, limits, batch_size, progress)
    out = [(prompt, reply, stopped) for prompt, (reply, stopped) in zip(prompts, answers)]
    if cut:
        note(
            f"{cut} of {len(rows)} prompts are longer than the context - 1 ({context - 1} tokens): "
            "each is cut to its end"
        )
    if short:
        note(
            f"the context ({context} tokens) leaves {short} of {len(rows)} prompts room for fewer than "
            f"{max_new_tokens} new tokens; those replies end at the context's end"
        )
    return out


def evaluate_chat(
    model: SamplingModel,
    folder: str,
    batch_size: int,
    max_items: int | None,
    max_new_tokens: int,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Response bpb, stop rate and mean reply length on the first `max_items` held-out examples."""
    rows, meta = val_examples(folder)
    same_tokenizer(model, meta.get("tokenizer_fingerprint"), f"{folder}/{SFT_META}")
    held_out, rows = len(rows), rows[:max_items]
    scores = score_rows(model, rows, batch_size, progress)
    if scores.cut:
        note(
            f"{scores.cut} examples are longer than the context + 1 ({model.mcfg.context + 1} tokens) and "
            f"are scored on their end; {scores.lost} of their response tokens fell in the cut (not scored)"
        )
    n_bytes = sum(response_bytes(model.tokenizer, fit_row(r, model.mcfg.context)[0]) for r in rows)
    answered = replies(model, rows, max_new_tokens, progress, batch_size)
    decode = model.tokenizer.decode
    return {
        "n": len(rows),
        "held_out": held_out,
        "response_bpb": -float(scores.logprob.sum()) / math.log(2) / max(n_bytes, 1),
        "response_tokens": int(scores.scored.sum()),
        "response_bytes": n_bytes,
        "stop_rate": sum(stopped for _, _, stopped in answered) / len(answered),
        "mean_reply_tokens": sum(len(reply) for _, reply, _ in answered) / len(answered),
        "max_new_tokens": max_new_tokens,
        "data": str(folder),
        "samples": [
            {"prompt": decode(p), "reply": decode(r), "stopped": s} for p, r, s in answered[:SAMPLES]
        ],
    }
