"""`euler-train make-pairs`: preference pairs from an SFT source and the model itself, for users without
preference data. For each conversation of the source, the reference reply (its last assistant message)
is the chosen one and the model's own sample for the same prompt (the turns before it, in the chat
template) the rejected one. The output is JSON lines of `{"prompt": [messages], "chosen": str, "rejected":
str}`, the record format `euler-data prefs --source FILE` reads, so the pairs are built into a preference
set (tokenized, split by prompt, counted) the way any other pairs are, and can be read and edited first.

Every conversation is accounted for: written, or counted under one reason: the source's own drop reasons
(malformed records, duplicates...), `prompt_too_long` (the prompt leaves the model no room to reply),
`same_as_reference` (the sample equals the reference reply: no preference). With --seed S, conversation i
(from 0, in the source's order) samples with seed S + i, as `generate --batch-file` does. The output is
written whole or not at all (a staged file moved in); an existing one is replaced only with --overwrite.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import euler_data
from euler_train.checkpoint import write_file
from euler_train.config import ConfigError
from euler_train.sampling import (
    SamplingModel,
    complete_batch,
    decode_stream,
    encode_prompt,
    load_for_sampling,
    note_if_not_tuned,
)


def check_out(args: argparse.Namespace) -> Path:
    """--out, refused before any work when it exists (without --overwrite) or its folder does not."""
    out = Path(args.out)
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; name the JSON-lines file to write")
    if out.exists() and not args.overwrite:
        raise ConfigError(f"--out {out} exists; pass --overwrite to replace it")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {out}: the folder {out.parent} does not exist")
    return out


def sample_replies(
    model: SamplingModel, args: argparse.Namespace, prompts: list[list[int]], numbers: list[int]
) -> list[tuple[str, bool]]:
    """The model's reply to each prompt (ids of an open assistant turn, at most context - 1 of them) and
    whether a stop token ended it, decoded together, each at most --max-new-tokens or the context's room;
    the prompt of conversation number i samples with seed --seed + i."""
    seeds = None if args.seed is None else [args.seed + i for i in numbers]
    done = complete_batch(model, args, prompts, seeds)  # generate_batch keeps each in the context's room
    return [("".join(decode_stream(model.tokenizer, iter(d.tokens), ())), d.stop is not None) for d in done]


def run_make_pairs(args: argparse.Namespace) -> int:
    out = check_out(args)
    with tempfile.TemporaryDirectory(prefix="euler-make-pairs-") as downloads:
        conversations, dropped = euler_data.read_chat_examples(args.source, args.mirror, Path(downloads))
    if args.limit is not None:
        dropped["over_limit"] += max(0, len(conversations) - args.limit)
        conversations = conversations[: args.limit]
    if not conversations:
        drops = dict(sorted(dropped.items()))
        raise ConfigError(f"--source {' '.join(args.source)}: no conversation to sample (dropped {drops})")
    model = load_for_sampling(args.checkpoint, args.device)
    note_if_not_tuned(model)
    room = model.mcfg.context - 1  # a prompt of `room` tokens leaves one to sample
    asked = []  # (conversation number, prompt messages, reference reply, prompt ids)
    for i, c in enumerate(conversations):
        if c[-1]["role"] != "assistant" or len(c) < 2:
            dropped["no_prompt_and_final_reply"] += 1
            continue
        ids = encode_prompt(model.tokenizer, c[:-1])
        if len(ids) > room:
            dropped["prompt_too_long"] += 1
            continue
        asked.append((i, c[:-1], c[-1]["content"], ids))
    records, cut = [], 0  # cut: written replies that ran to their limit, no stop token
    for start in range(0, len(asked), args.batch_size):
        chunk = asked[start : start + args.batch_size]
        replies = sample_replies(model, args, [a[3] for a in chunk], [a[0] for a in chunk])
        for (_, prompt, chosen, _), (rejected, stopped) in zip(chunk, replies):
            if rejected.strip() == chosen.strip():
                dropped["same_as_reference"] += 1
                continue
            records.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
            cut += not stopped
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    write_file(out, lambda tmp: tmp.write_text(lines, encoding="utf-8"))
    counts = ", ".join(f"{k} {v}" for k, v in sorted(dropped.items()) if v) or "none"
    print(
        f"euler-train make-pairs: {len(records)} pairs written to {out} (dropped: {counts}; {cut} of the "
        f"rejected replies ran to the token limit unfinished: --max-new-tokens); build a preference set "
        f"with: euler-data prefs --source {out} --out DATASET"
    )
    return 0
