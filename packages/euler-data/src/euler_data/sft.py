"""SFT sets: Alpaca-style records -> chat template -> tokens + loss mask, split by example hash.

Files per split (``train`` / ``val``): ``sft_{split}_tokens.bin`` (uint16), ``sft_{split}_mask.bin``
(uint8, 1 on response tokens and their closing ``<|end|>``), ``sft_{split}_offsets.bin`` (int64,
examples + 1 boundaries: example i is ``tokens[offsets[i]:offsets[i+1]]``), and ``sft_meta.json``.
Examples longer than ``context`` tokens are dropped ("too_long"); the loaders pad or pack the rest.
The files are written into ``sft.new/`` and then replace the folder's previous set (``replace_files``),
so an interrupted or refused build leaves the previous set as it was.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from euler_data.chat import _check, _segments, alpaca_messages, render_chat
from euler_data.dataset_folder import SFT_META, SFT_STAGING, replace_files
from euler_data.errors import DataError
from euler_data.meta import open_bin
from euler_data.workers import stop_workers

TOKENIZER = "tokenizer.json"
TEMPLATE = "<|user|>\\n{instruction}[\\n\\n{input}]<|end|>\\n<|assistant|>\\n{output}<|end|>"
Example = tuple[list[dict] | None, str | None]  # (messages, drop reason)


def to_messages(obj: object) -> Example:
    """An Alpaca record or a ``{"messages": [...]}`` record as messages, else (None, reason)."""
    if not isinstance(obj, dict):
        return None, "malformed_json"
    if isinstance(obj.get("messages"), list):
        msgs = obj["messages"]
    elif isinstance(obj.get("instruction"), str) and isinstance(obj.get("output"), str):
        msgs = alpaca_messages(
            {**obj, "input": obj.get("input") if isinstance(obj.get("input"), str) else ""}
        )
    else:
        return None, "not_a_chat_record"
    try:
        _check(msgs)
    except ValueError:
        return None, "not_a_chat_record"
    if not any(m["role"] == "assistant" and m["content"].strip() for m in msgs):
        return None, "empty_response"
    return msgs, None


def _parse_line(line: bytes) -> Example:
    try:
        return to_messages(json.loads(line.decode("utf-8")))
    except UnicodeDecodeError:
        return None, "not_utf8"
    except ValueError:
        return None, "malformed_json"


def read_examples(path: Path) -> list[Example]:
    """Every record of a .json array or a JSON-lines file, as (messages, drop reason)."""
    data = path.read_bytes()
    if data.lstrip()[:1] != b"[":
        return [_parse_line(line) for line in data.split(b"\n") if line.strip()]
    try:
        records = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise DataError(str(path), f"not a valid JSON array: {err}") from err
    return [to_messages(r) for r in records]


def encode_examples(tok, conversations: list[list[dict]], workers: int) -> list[tuple[list[int], list[int]]]:
    """``encode_chat`` for many conversations, the text pieces encoded in one parallel batch."""
    segs = [_segments(msgs, False) for msgs in conversations]
    texts = [text for s in segs for text, special, _ in s if not special]
    encoded = iter(tok.encode_batch(texts, workers=workers))
    out = []
    for s in segs:
        ids: list[int] = []
        mask: list[int] = []
        for text, special, loss in s:
            piece = [tok.special_tokens[text]] if special else next(encoded)
            ids += piece
            mask += [int(loss)] * len(piece)
        out.append((ids, mask))
    return out


def split_of(rendered: str, seed: int, val_fraction: float) -> str:
    """'val' for a seeded-hash fraction ``val_fraction`` of the examples, else 'train'."""
    digest = hashlib.md5(f"{seed}:{rendered}".encode()).digest()
    return "val" if int.from_bytes(digest[:8], "big") / 2.0**64 < val_fraction else "train"


def write_split(folder: Path, split: str, examples: list[tuple[list[int], list[int]]]) -> dict[str, int]:
    """Write one split's three files; returns its counts."""
    lengths = np.array([len(ids) for ids, _ in examples], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # (n + 1,)
    tokens = np.array([t for ids, _ in examples for t in ids], dtype=np.uint16)
    mask = np.array([m for _, ms in examples for m in ms], dtype=np.uint8)
    tokens.tofile(folder / f"sft_{split}_tokens.bin")
    mask.tofile(folder / f"sft_{split}_mask.bin")
    offsets.tofile(folder / f"sft_{split}_offsets.bin")
    return {"examples": len(examples), "tokens": len(tokens), "response_tokens": int(mask.sum())}


def check_sft_options(context: int | None, val_fraction: float) -> None:
    """The numbers ``sft`` takes, checked before any work (ValueError naming the flag); a context of None
    is taken from the folder later."""
    if context is not None and (isinstance(context, bool) or not isinstance(context, int) or context < 1):
        raise ValueError(f"context must be an integer >= 1, got {context!r} (--context)")
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction!r} (--val-fraction)")


def nothing_kept(n_in: int, dropped: Counter, context: int, shortest_too_long: int) -> DataError:
    """The error of a set that keeps no example, with the fix when the context is what dropped them."""
    too_long = dropped["too_long"]
    fix = f"(the shortest has {shortest_too_long}); pass --context {shortest_too_long}"
    if too_long and too_long == n_in:
        return DataError("sft", f"kept 0 of {n_in} examples: all are longer than the context of {context} "
                                f"tokens {fix}")  # fmt: skip
    counts = dict(sorted((k, v) for k, v in dropped.items() if v))
    longer = f"; {too_long} are longer than the context of {context} tokens {fix}" if too_long else ""
    return DataError("sft", f"kept 0 of {n_in} examples (dropped {counts}){longer}")


def build_sft(paths: list[Path], folder, tok, context: int = 512, val_fraction: float = 0.05, seed: int = 0,
              workers: int = 2) -> dict[str, Any]:  # fmt: skip
    """Build an SFT set in ``folder`` from Alpaca-style files; returns (and writes) ``sft_meta.json``.

    A folder without ``tokenizer.json`` gets ``tok``'s (the set is read with it). A set that would keep
    no example is refused (DataError) and the folder keeps what it held.
    """
    check_sft_options(context, val_fraction)
    folder = Path(folder)
    for name in ("<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>"):
        if name not in tok.special_tokens:
            raise DataError(
                "tokenizer", f"no {name} special token: train it with euler_bpe.CHAT_SPECIAL_TOKENS"
            )
    examples = [e for p in paths for e in read_examples(p)]
    dropped = Counter(reason for _, reason in examples if reason)
    seen, keep = set(), []
    for msgs, reason in examples:
        if reason is None:
            text = render_chat(msgs)
            dropped["duplicate"] += text in seen
            if text not in seen:
                keep.append((msgs, text))
            seen.add(text)
    splits: dict[str, list] = {"train": [], "val": []}
    encoded = encode_examples(tok, [m for m, _ in keep], workers)
    stop_workers(tok)
    longest = max((len(ids) for ids, _ in encoded), default=0)
    for (_, text), enc in zip(keep, encoded):
        if len(enc[0]) > context:
            dropped["too_long"] += 1
            continue
        splits[split_of(text, seed, val_fraction)].append(enc)
    if not any(splits.values()):
        shortest = min((len(ids) for ids, _ in encoded), default=0)
        raise nothing_kept(len(examples), dropped, context, shortest)
    staging = folder / SFT_STAGING
    shutil.rmtree(staging, ignore_errors=True)  # what an interrupted build left
    staging.mkdir(parents=True)
    counts = {split: write_split(staging, split, rows) for split, rows in splits.items()}
    meta = {
        "examples_in": len(examples),
        "examples_kept": sum(c["examples"] for c in counts.values()),
        "dropped": {k: v for k, v in sorted(dropped.items()) if v},
        **{split: c for split, c in counts.items()},
        "template": TEMPLATE,
        "context_hint": context,
        "longest_tokens": longest,
        "tokenizer_fingerprint": tok.fingerprint,
        "vocab_size": tok.vocab_size,
        "eot_id": tok.special_tokens["<|endoftext|>"],
    }
    (staging / SFT_META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    if not (folder / TOKENIZER).exists():
        tok.save(staging / TOKENIZER)
    replace_files(folder, staging, SFT_META)
    return meta


def sft_files(folder: Path) -> list[Path]:
    """The files of an SFT set in `folder` that exist."""
    names = [SFT_META] + [
        f"sft_{s}_{kind}.bin" for s in ("train", "val") for kind in ("tokens", "mask", "offsets")
    ]
    return [folder / n for n in names if (folder / n).exists()]


def read_sft(folder, split: str):
    """(tokens uint16 memmap, mask uint8 memmap, offsets int64, sft_meta) of one split."""
    folder = Path(folder)
    meta_path = folder / SFT_META
    if not meta_path.is_file():
        raise DataError(str(meta_path), "no sft_meta.json: build the set with `euler-data sft`")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    offsets = np.fromfile(folder / f"sft_{split}_offsets.bin", dtype=np.int64)
    tokens = open_bin(folder / f"sft_{split}_tokens.bin", np.uint16)
    mask = open_bin(folder / f"sft_{split}_mask.bin", np.uint8)
    return tokens, mask, offsets, meta
