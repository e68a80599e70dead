"""`euler-train generate --batch-file FILE`: every prompt of a file continued, --batch-size at a time.

FILE holds one prompt per line (lines end with \\n or \\r\\n; an empty line is an empty prompt, which
samples a new document as `--prompt ""` does), or, when its name ends in `.jsonl`, one JSON object per
line with a string "prompt". The output is one JSON line per prompt, in the file's order, on stdout:
{"prompt": ..., "completion": ..., "tokens": N, "stopped": true when <|end|> or <|endoftext|> ended it}.
The completion is the text of the sampled tokens (U+FFFD for bytes that are not UTF-8). With --seed S,
prompt i (from 0) samples with seed S + i, so its completion is that of `generate --prompt P --seed S+i`.

The file is read and checked before the model is loaded: a file that is missing, not UTF-8, empty or
(jsonl) not one object with a string "prompt" per line is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, TextIO

import euler_model
from euler_train.config import ConfigError
from euler_train.sampling import SamplingModel, complete_batch, decode_stream, prompt_to_ids


def _jsonl_prompt(line: str, where: str) -> str:
    """The "prompt" of one jsonl line; ConfigError saying what is wrong with it."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ConfigError(
            f'{where}: not JSON ({err.msg}); each line must be one object with a "prompt"'
        ) from None
    if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
        raise ConfigError(f'{where}: expected an object with a string "prompt", got {line[:60]!r}')
    return record["prompt"]


def read_batch_file(path: str) -> list[str]:
    """The prompts of a batch file (see the module docstring); ConfigError for a file that is unusable."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"--batch-file {path}: no such file")
    data = file.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ConfigError(f"--batch-file {path}: line {line} is not UTF-8 (byte {err.start})") from None
    lines = text.split("\n")
    if lines[-1] == "":  # the newline that ends the last line
        lines.pop()
    lines = [line.removesuffix("\r") for line in lines]
    if not lines:
        raise ConfigError(f"--batch-file {path}: the file holds no prompts")
    if file.suffix != ".jsonl":
        return lines
    return [_jsonl_prompt(line, f"--batch-file {path}: line {i}") for i, line in enumerate(lines, 1)]


def check_batch_args(args: argparse.Namespace) -> list[str]:
    """The prompts to continue, checked with the flags, before any model is loaded."""
    if args.speculative and (args.temperature != 0 or args.repetition_penalty != 1.0):
        raise ConfigError(
            "--speculative with --batch-file is greedy only: add --temperature 0 (no --repetition-penalty)"
        )
    if args.draft_tree is not None and not args.speculative:
        raise ConfigError("--draft-tree shapes the drafts of --speculative: add --speculative")
    return read_batch_file(args.batch_file)


def check_draft_tree(model: SamplingModel, args: argparse.Namespace) -> None:
    """ConfigError unless --draft-tree (if given) suits the model's drafting heads; before any decoding."""
    if args.speculative and args.draft_tree is not None:
        try:
            euler_model.checked_draft_tree(model.mcfg, args.draft_tree)
        except ValueError as err:
            raise ConfigError(f"--draft-tree {','.join(map(str, args.draft_tree))}: {err}") from None


def _completions(model: SamplingModel, args: argparse.Namespace, prompts: list[str], first: int) -> list:
    """generate_batch over prompts first, first + 1, ... (their seeds, their names in notes)."""
    ids = [prompt_to_ids(model, args, p, args.chat, f"prompt {first + i}") for i, p in enumerate(prompts)]
    seeds = None if args.seed is None else [args.seed + first + i for i in range(len(prompts))]
    return complete_batch(model, args, ids, seeds, speculative=args.speculative, draft_tree=args.draft_tree)


def write_batch_generation(
    model: SamplingModel, args: argparse.Namespace, prompts: list[str], stdout: TextIO
) -> None:
    """One JSON line per prompt on stdout, args.batch_size prompts decoded together."""
    check_draft_tree(model, args)
    tok = model.tokenizer
    for start in range(0, len(prompts), args.batch_size):
        chunk = prompts[start : start + args.batch_size]
        for prompt, done in zip(chunk, _completions(model, args, chunk, start)):
            text = "".join(decode_stream(tok, iter(done.tokens), ()))
            row: dict[str, Any] = {"prompt": prompt, "completion": text, "tokens": len(done.tokens)}
            stdout.write(json.dumps({**row, "stopped": done.stop is not None}) + "\n")
        stdout.flush()
