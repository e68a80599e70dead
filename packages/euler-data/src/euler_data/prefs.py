"""Preference sets: pairs of replies to one prompt, the chosen one and the rejected one, as chat tokens.

Two record formats are read (JSON lines, plain or gzip, or a JSON array):

- Anthropic's HH-RLHF: ``{"chosen": "\\n\\nHuman: ...\\n\\nAssistant: ...", "rejected": ...}``, two whole
  dialogues; the turns both share are the prompt, the last assistant reply of each the response;
- ``{"prompt": ..., "chosen": ..., "rejected": ...}``: the prompt a string (one user turn) or a message
  list, each reply a string or a message list whose last message is the assistant's reply (any messages
  before it must repeat the prompt, or are the prompt when it is absent).

Each pair is kept or dropped under one reason (counted in ``prefs_meta.json``): ``malformed_json``,
``not_utf8``, ``not_a_preference_record``, ``prompts_differ`` (the dialogues part before their last
reply), ``empty_response``, ``identical_responses``, ``duplicate`` (the same prompt and replies again),
``too_long`` (prompt and the longer reply above the context). Pairs are split by a seeded hash of their
prompt, so a prompt's pairs all land in one split.

Files per split (``train`` / ``val``): ``prefs_{split}_tokens.bin`` (uint16), ``prefs_{split}_mask.bin``
(uint8, 1 on the last reply's tokens and its ``<|end|>``: a multi-turn prompt's earlier assistant turns
are prompt), ``prefs_{split}_offsets.bin`` (int64): sequence
2i is pair i's prompt and chosen reply, 2i + 1 the same prompt and the rejected one. Built in
``prefs.new/`` and moved in whole (``replace_files``), as an SFT set is.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from euler_data.chat import _check, render_chat
from euler_data.dataset_folder import PREFS_META, PREFS_STAGING
from euler_data.errors import DataError
from euler_data.sft import (
    check_chat_tokenizer,
    check_sft_options,
    encode_examples,
    first_of_each,
    move_in,
    new_staging,
    read_records,
    read_split,
    split_of,
    write_split,
)
from euler_data.workers import stop_workers

TOKENIZER = "tokenizer.json"
HUMAN, ASSISTANT = "\n\nHuman: ", "\n\nAssistant: "
LOUD_SHARE = 0.25  # dropping more of the pairs than this is a warning
Pair = tuple[tuple[list[dict], str, str] | None, str | None]  # ((prompt, chosen, rejected), drop reason)


def hh_dialogue(text: str) -> list[dict] | None:
    """An HH-RLHF dialogue ("\\n\\nHuman: ...\\n\\nAssistant: ...") as messages, None if it is not one.

    >>> hh_dialogue("\\n\\nHuman: hi\\n\\nAssistant: hello")
    [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'hello'}]
    """
    if not text.startswith(HUMAN):
        return None
    messages, rest = [], text
    while rest:
        role = "user" if rest.startswith(HUMAN) else "assistant" if rest.startswith(ASSISTANT) else None
        if role is None:
            return None
        rest = rest[len(HUMAN if role == "user" else ASSISTANT) :]
        ends = [i for i in (rest.find(HUMAN), rest.find(ASSISTANT)) if i >= 0]
        end = min(ends) if ends else len(rest)
        messages.append({"role": role, "content": rest[:end].strip()})
        rest = rest[end:]
    return messages


def _reply(value: object, prompt: list[dict] | None) -> tuple[list[dict] | None, str | None]:
    """(the prompt, the reply text) of one side of a {prompt, chosen, rejected} record, or (None, None)."""
    if isinstance(value, str):
        return prompt, value
    if not isinstance(value, list) or not value or not isinstance(value[-1], dict):
        return None, None
    last, before = value[-1], list(value[:-1])
    if last.get("role") != "assistant" or not isinstance(last.get("content"), str):
        return None, None
    if prompt is not None and before and before != prompt:
        return None, None
    return (prompt if prompt is not None else before) or None, last["content"]


def to_pair(obj: object) -> Pair:
    """One record as ((prompt messages, chosen reply, rejected reply), None), else (None, reason)."""
    if not isinstance(obj, dict) or not {"chosen", "rejected"} <= obj.keys():
        return None, "not_a_preference_record"
    chosen, rejected = obj["chosen"], obj["rejected"]
    if "prompt" not in obj and isinstance(chosen, str) and isinstance(rejected, str):  # HH-RLHF
        a, b = hh_dialogue(chosen), hh_dialogue(rejected)
        if not a or not b or a[-1]["role"] != "assistant" or b[-1]["role"] != "assistant":
            return None, "not_a_preference_record"
        if a[:-1] != b[:-1]:
            return None, "prompts_differ"
        prompt, chosen, rejected = a[:-1], a[-1]["content"], b[-1]["content"]
    else:
        given = obj.get("prompt")
        prompt = [{"role": "user", "content": given}] if isinstance(given, str) else given
        if prompt is not None and not isinstance(prompt, list):
            return None, "not_a_preference_record"
        (p1, chosen), (p2, rejected) = _reply(chosen, prompt), _reply(rejected, prompt)
        if chosen is None or rejected is None or not p1 or p1 != p2:
            return None, "not_a_preference_record" if chosen is None or rejected is None else "prompts_differ"
        prompt = p1
    try:
        _check([*prompt, {"role": "assistant", "content": chosen}])
    except ValueError:
        return None, "not_a_preference_record"
    if not chosen.strip() or not rejected.strip():
        return None, "empty_response"
    if chosen.strip() == rejected.strip():
        return None, "identical_responses"
    return (prompt, chosen, rejected), None


def read_pairs(path: Path) -> list[Pair]:
    """Every record of a JSON-lines file (plain or .gz) or a .json array, as a pair or a drop reason."""
    return read_records(path, to_pair)


def last_reply_only(mask: list[int]) -> list[int]:
    """A conversation's loss mask (1 on every assistant turn, as SFT trains) cut to its last reply: a
    multi-turn prompt's earlier assistant turns are prompt here, scored by neither side of the pair.

    >>> last_reply_only([0, 1, 1, 0, 0, 1, 1])
    [0, 0, 0, 0, 0, 1, 1]
    """
    starts = [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]
    last = starts[-1] if starts else len(mask)
    return [0] * last + list(mask[last:])


def nothing_kept(n_in: int, dropped: Counter, context: int, shortest_too_long: int) -> DataError:
    """The error of a set that keeps no pair, with the fix when the context is what dropped them."""
    counts = dict(sorted((k, v) for k, v in dropped.items() if v))
    longer = ""
    if dropped["too_long"]:
        longer = (
            f"; {dropped['too_long']} are longer than the context of {context} tokens (the shortest has "
            f"{shortest_too_long}); pass --context {shortest_too_long}"
        )
    return DataError("prefs", f"kept 0 of {n_in} pairs (dropped {counts}){longer}")


def build_prefs(
    paths: list[Path],
    folder: Path | str,
    tok: Any,
    context: int = 512,
    val_fraction: float = 0.05,
    seed: int = 0,
    workers: int = 2,
) -> dict[str, Any]:
    """Build a preference set in ``folder`` from preference records; returns (and writes) ``prefs_meta.json``.

    A folder without ``tokenizer.json`` gets ``tok``'s. A set that would keep no pair is refused
    (DataError) and the folder keeps what it held.
    """
    check_sft_options(context, val_fraction)
    folder = Path(folder)
    check_chat_tokenizer(tok)
    pairs = [p for path in paths for p in read_pairs(path)]
    keep, dropped = first_of_each(pairs, json.dumps)  # the same prompt and replies twice: a duplicate
    conversations = [
        [*prompt, {"role": "assistant", "content": reply}] for prompt, *replies in keep for reply in replies
    ]  # chosen, then rejected, of each pair
    encoded = [(ids, last_reply_only(mask)) for ids, mask in encode_examples(tok, conversations, workers)]
    stop_workers(tok)
    splits: dict[str, list] = {"train": [], "val": []}
    lengths = []
    for i, (prompt, _, _) in enumerate(keep):
        chosen, rejected = encoded[2 * i], encoded[2 * i + 1]
        longest = max(len(chosen[0]), len(rejected[0]))
        lengths.append(longest)
        if longest > context:
            dropped["too_long"] += 1
            continue
        splits[split_of(render_chat(prompt), seed, val_fraction)] += [chosen, rejected]
    if not any(splits.values()):
        shortest = min((n for n in lengths if n > context), default=0)
        raise nothing_kept(len(pairs), dropped, context, shortest)
    staging = new_staging(folder / PREFS_STAGING)
    counts = {split: write_split(staging, split, rows, prefix="prefs") for split, rows in splits.items()}
    meta = {
        "pairs_in": len(pairs),
        "pairs_kept": sum(c["examples"] for c in counts.values()) // 2,
        "dropped": {k: v for k, v in sorted(dropped.items()) if v},
        **{split: {**c, "pairs": c["examples"] // 2} for split, c in counts.items()},
        "layout": "sequence 2i: pair i's prompt and chosen reply; 2i + 1: the prompt and the rejected reply",
        "context_hint": context,
        "longest_tokens": max(lengths, default=0),
        "tokenizer_fingerprint": tok.fingerprint,
        "vocab_size": tok.vocab_size,
        "eot_id": tok.special_tokens["<|endoftext|>"],
    }
    move_in(folder, staging, PREFS_META, meta, tok)
    return meta


def read_prefs(folder: Path | str, split: str) -> tuple[Any, Any, np.ndarray, dict]:
    """(tokens uint16 memmap, mask uint8 memmap, offsets int64, prefs_meta) of one split: sequence 2i is
    pair i's chosen side, 2i + 1 its rejected side."""
    return read_split(folder, split, "prefs", PREFS_META)
