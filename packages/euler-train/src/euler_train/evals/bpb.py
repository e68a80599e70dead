"""Bits per byte of text files, or of a dataset folder's validation split.

Text files: each file is one document, its bytes encoded with the checkpoint's tokenizer (`encode_bytes`,
so any bytes work) and framed as euler-data stores documents, ``<|endoftext|> doc <|endoftext|>``; every
token after the first ``<|endoftext|>`` is scored (the document's tokens and the ``<|endoftext|>`` that
closes it, what meta.json counts), and bpb = the summed -log2 p over the files' bytes.

A dataset folder: the whole of ``val.bin``, bpb = the mean next-token loss in bits x the split's tokens per
byte from meta.json (`batches.bits_per_byte`, the rule of the trainer's ``val_bpb``).

Both read a sequence in consecutive windows of context + 1 tokens that overlap by one token, so every
token but the first is predicted once, with up to `context` tokens before it.

>>> [r.ids.tolist() for r in windows(np.arange(6), 2)]
[[0, 1, 2], [2, 3, 4], [4, 5]]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from euler_data import read_meta
from euler_data.meta import open_bin
from euler_train.batches import bits_per_byte, bytes_per_token
from euler_train.config import ConfigError
from euler_train.evals.scoring import Row, score_rows
from euler_train.sampling import EOT, SamplingModel

Progress = Callable[[int], None] | None


def windows(seq: np.ndarray, context: int) -> list[Row]:
    """Windows of context + 1 tokens starting every `context` tokens; all but each one's first scored."""
    scored = np.ones(context + 1, dtype=np.int8)
    scored[0] = 0
    rows = []
    for start in range(0, max(len(seq) - 1, 0), context):
        ids = seq[start : start + context + 1]
        rows.append(Row(ids, scored[: len(ids)]))  # views: nothing is copied
    return rows


def read_files(paths: list[str]) -> list[tuple[str, bytes]]:
    """(path, bytes) of each text file; ConfigError for a missing or empty one."""
    out = []
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p}: no such file")
        data = p.read_bytes()
        if not data:
            raise ConfigError(f"{p}: the file is empty; bits per byte needs at least one byte")
        out.append((path, data))
    return out


def files_bpb(
    model: SamplingModel, files: list[tuple[str, bytes]], batch_size: int, progress: Progress
) -> dict:
    """Bits per byte of the files together (each framed by <|endoftext|>, see the module docstring)."""
    tok = model.tokenizer
    if EOT not in tok.special_tokens:
        raise ConfigError(f"the checkpoint's tokenizer has no {EOT} token to frame documents with")
    eot = tok.special_tokens[EOT]
    rows = []
    for _, data in files:
        seq = np.array([eot, *tok.encode_bytes(data), eot], dtype=np.int64)
        rows += windows(seq, model.mcfg.context)
    scores = score_rows(model, rows, batch_size, progress)
    n_bytes = sum(len(data) for _, data in files)
    return {
        "bpb": -float(scores.logprob.sum()) / math.log(2) / n_bytes,
        "tokens": int(scores.scored.sum()),
        "bytes": n_bytes,
        "files": [path for path, _ in files],
    }


def check_split(folder: str) -> tuple[dict[str, Any], float]:
    """(meta.json, val bytes per token) of a dataset folder with a val split to score; else ConfigError."""
    meta = read_meta(folder)
    bpt = bytes_per_token(meta, "val")
    if bpt is None:
        raise ConfigError(f"{folder}/meta.json has no byte and token counts of the val split")
    val = Path(folder) / "val.bin"
    if not val.is_file():
        raise ConfigError(f"{folder} has no val.bin (a folder made by `euler-data prepare`)")
    if val.stat().st_size < 4:  # uint16 tokens
        raise ConfigError(f"{val} holds {val.stat().st_size // 2} tokens; bits per byte needs two or more")
    return meta, bpt


def split_bpb(model: SamplingModel, folder: str, batch_size: int, progress: Progress) -> dict:
    """Bits per byte of a dataset folder's whole val split (see the module docstring)."""
    meta, bpt = check_split(folder)
    same_tokenizer(model, meta.get("tokenizer_fingerprint"), f"{folder}/meta.json")
    seq = open_bin(Path(folder) / "val.bin", np.uint16)  # (N,)
    scores = score_rows(model, windows(seq, model.mcfg.context), batch_size, progress)
    tokens = int(scores.scored.sum())
    loss = -float(scores.logprob.sum()) / tokens  # mean nats per predicted token
    return {"bpb": bits_per_byte(loss, bpt), "loss": loss, "tokens": tokens, "data": str(folder)}


def same_tokenizer(model: SamplingModel, fingerprint: str | None, where: str) -> None:
    """ConfigError when a data folder was tokenized with another tokenizer than the checkpoint's."""
    mine = model.tokenizer.fingerprint
    if fingerprint and fingerprint != mine:
        raise ConfigError(
            f"tokenizer mismatch: {where} was made with tokenizer {fingerprint[:12]}…, the checkpoint "
            f"has {mine[:12]}…; evaluate on data prepared with the checkpoint's tokenizer.json"
        )
