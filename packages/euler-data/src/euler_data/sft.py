"""SFT sets: Alpaca-style records -> chat template -> tokens + loss mask, split by example hash.

Files per split (``train`` / ``val``): ``sft_{split}_tokens.bin`` (uint16), ``sft_{split}_mask.bin``
(uint8, 1 on response tokens and their closing ``<|end|>``), ``sft_{split}_offsets.bin`` (int64,
examples + 1 boundaries: example i is ``tokens[offsets[i]:offsets[i+1]]``), and ``sft_meta.json``.
Examples longer than ``context`` tokens are dropped ("too_long"); the loaders pad or pack the rest.
The files are written into ``sft.new/`` and then replace the folder's previous set (``replace_files``),
so an interrupted or refused build leaves the previous set as it was.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from euler_data.chat import _check, _segments, alpaca_messages, render_chat
from euler_data.dataset_folder import SFT_META, SFT_STAGING, replace_files
from euler_data.errors import DataError
from euler_data.meta import open_bin
from euler_data.network import resolve_mirror
from euler_data.recipe import SourceSpec
from euler_data.sources import resolve
from euler_data.workers import stop_workers

TOKENIZER = "tokenizer.json"
TEMPLATE = "<|user|>\\n{instruction}[\\n\\n{input}]<|end|>\\n<|assistant|>\\n{output}<|end|>"
Example = tuple[list[dict] | None, str | None]  # (messages, drop reason)
Taken = tuple[Any, str | None]  # (what a record made, None), or (None, the reason it was dropped)


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


def read_records(
    path: Path, take: Callable[[object], tuple[Any, str | None]]
) -> list[tuple[Any, str | None]]:
    """take(record) for every record of a .json array or a JSON-lines file (either gzip-compressed or
    not): (what it made, None) or (None, the reason it was dropped); a line that is not UTF-8 or not JSON
    is dropped as such."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as err:
            raise DataError(str(path), f"not a readable gzip file: {err}") from err
    if data.lstrip()[:1] == b"[":
        try:
            records = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as err:
            raise DataError(str(path), f"not a valid JSON array: {err}") from err
        return [take(r) for r in records]
    out = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            out.append(take(json.loads(line.decode("utf-8"))))
        except UnicodeDecodeError:
            out.append((None, "not_utf8"))
        except ValueError:
            out.append((None, "malformed_json"))
    return out


def read_examples(path: Path) -> list[Example]:
    """Every record of a .json array or a JSON-lines file, as (messages, drop reason)."""
    return read_records(path, to_messages)


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


def write_split(
    folder: Path, split: str, examples: list[tuple[list[int], list[int]]], prefix: str = "sft"
) -> dict[str, int]:
    """Write one split's three files ({prefix}_{split}_tokens / _mask / _offsets.bin); returns its counts."""
    lengths = np.array([len(ids) for ids, _ in examples], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # (n + 1,)
    tokens = np.array([t for ids, _ in examples for t in ids], dtype=np.uint16)
    mask = np.array([m for _, ms in examples for m in ms], dtype=np.uint8)
    tokens.tofile(folder / f"{prefix}_{split}_tokens.bin")
    mask.tofile(folder / f"{prefix}_{split}_mask.bin")
    offsets.tofile(folder / f"{prefix}_{split}_offsets.bin")
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
    check_chat_tokenizer(tok)
    examples = [e for p in paths for e in read_examples(p)]
    kept, dropped = first_of_each(examples, render_chat)
    keep = [(msgs, render_chat(msgs)) for msgs in kept]
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
    staging = new_staging(folder / SFT_STAGING)
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
    move_in(folder, staging, SFT_META, meta, tok)
    return meta


def source_paths(specs: list[str], mirror: str | Path | None, downloads: Path) -> list[Path]:
    """The files of sources as `--source` names them: a named source from the mirror (the argument, else
    $EULER_DATA_MIRROR), else downloaded into `downloads`; or a file or folder."""
    folder = resolve_mirror(mirror)
    return [Path(i.location) for s in specs for i in resolve(SourceSpec(s), folder, downloads)]


def read_chat_examples(
    specs: list[str], mirror: str | Path | None, downloads: Path
) -> tuple[list[list[dict]], Counter]:
    """(conversations, drop reasons counted) of SFT sources (source_paths): each record's messages, the
    first of each conversation kept (a repeat counted as "duplicate"), as build_sft keeps them."""
    paths = source_paths(specs, mirror, downloads)
    return first_of_each([e for path in paths for e in read_examples(path)], render_chat)


def first_of_each(records: list[Taken], key: Callable[[Any], str]) -> tuple[list[Any], Counter]:
    """What the records made, the first of each key kept, and the drop reasons counted ("duplicate" for
    a key seen before)."""
    dropped = Counter(reason for _, reason in records if reason)
    seen: set[str] = set()
    keep = []
    for item, reason in records:
        if reason is None:
            k = key(item)
            dropped["duplicate"] += k in seen
            if k not in seen:
                keep.append(item)
            seen.add(k)
    return keep, dropped


def check_chat_tokenizer(tok: Any) -> None:
    """DataError unless the tokenizer has the chat template's special tokens."""
    for name in ("<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>"):
        if name not in tok.special_tokens:
            raise DataError(
                "tokenizer", f"no {name} special token: train it with euler_bpe.CHAT_SPECIAL_TOKENS"
            )


def new_staging(staging: Path) -> Path:
    """An empty staging folder for a new set (what an interrupted build left there removed)."""
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def move_in(folder: Path, staging: Path, record: str, meta: dict[str, Any], tok: Any) -> None:
    """Write the set's record file (meta) and, for a folder without one, the tokenizer into staging, then
    move the staged set into the folder whole (replace_files)."""
    (staging / record).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    if not (folder / TOKENIZER).exists():
        tok.save(staging / TOKENIZER)
    replace_files(folder, staging, record)


def read_sft(folder, split: str):
    """(tokens uint16 memmap, mask uint8 memmap, offsets int64, sft_meta) of one split."""
    return read_split(folder, split, "sft", SFT_META)


def read_split(folder, split: str, prefix: str, record: str):
    """(tokens uint16 memmap, mask uint8 memmap, offsets int64, the record) of one split of a set that
    ``euler-data {prefix}`` wrote (files {prefix}_{split}_tokens / _mask / _offsets.bin)."""
    folder = Path(folder)
    meta_path = folder / record
    if not meta_path.is_file():
        raise DataError(str(meta_path), f"no {record}: build the set with `euler-data {prefix}`")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    offsets = np.fromfile(folder / f"{prefix}_{split}_offsets.bin", dtype=np.int64)
    tokens = open_bin(folder / f"{prefix}_{split}_tokens.bin", np.uint16)
    mask = open_bin(folder / f"{prefix}_{split}_mask.bin", np.uint8)
    return tokens, mask, offsets, meta
