"""``euler-data inspect``: counts, sample documents and a token-length histogram, as text."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from euler_bpe import Tokenizer
from euler_data.meta import open_split, read_meta
from euler_data.sft import read_sft


def doc_lengths(shards: list[np.ndarray], eot: int) -> np.ndarray:
    """Token count of each document of a split's files, read one file at a time (documents end with
    ``eot``; a document may continue into the next shard): (documents,) int64."""
    ends, offset = [np.array([-1])], 0
    for tokens in shards:
        ends.append(np.flatnonzero(tokens == eot) + offset)  # positions of the separators
        offset += len(tokens)
    return np.diff(np.concatenate(ends)) - 1


def histogram(lengths: np.ndarray, width: int = 40) -> list[str]:
    """Power-of-two bins of document lengths, one text bar per bin."""
    if len(lengths) == 0:
        return ["  (no documents)"]
    top = int(np.ceil(np.log2(max(int(lengths.max()), 1) + 1)))
    edges = [0] + [2**k for k in range(1, top + 1)]
    counts, _ = np.histogram(lengths, bins=[*edges, edges[-1] * 2])
    peak = max(int(counts.max()), 1)
    lines = []
    for lo, hi, n in zip(edges, [*edges[1:], edges[-1] * 2], counts):
        if n:
            lines.append(f"  [{lo:>9,}, {hi:>9,})  {n:>6}  " + "#" * max(1, round(width * n / peak)))
    return lines


def counts_lines(meta: dict) -> list[str]:
    lines = [
        f"documents: {meta['documents_in']} in, {meta['documents_kept']} kept, dropped {meta['dropped']}",
        f"tokens: {meta['tokens']}  bytes: {meta['bytes']}  vocab: {meta['vocab_size']}",
        f"tokenizer: {meta.get('tokenizer', 'bpe')} {meta['tokenizer_fingerprint']}",
        f"{'source':<24} {'in':>6} {'kept':>6} {'train docs':>10} {'train tok':>12} "
        f"{'val docs':>9} {'val tok':>10}",
    ]
    for name, s in meta["sources"].items():
        tr, va = s.get("train", {}), s.get("val", {})
        lines.append(
            f"{name:<24} {s['documents_in']:>6} {s.get('documents_kept', 0):>6} {tr.get('documents', 0):>10} "
            f"{tr.get('tokens', 0):>12} {va.get('documents', 0):>9} {va.get('tokens', 0):>10}"
        )
    return lines


def sample_lines(folder: Path, eot: int, samples: int, chars: int = 160) -> list[str]:
    """The first ``samples`` documents of train.bin (or of the first train shard), decoded and cut to
    ``chars`` characters."""
    if samples <= 0:
        return []
    tok = Tokenizer.load(folder / "tokenizer.json")
    tokens = open_split(folder, "train")[0]
    ends = np.flatnonzero(tokens[:50_000_000] == eot)[:samples]
    lines, start = [], 0
    for end in ends:
        lines.append("  " + shown(tok.decode_bytes(tokens[start:end].tolist()[:chars]), chars))
        start = end + 1
    return lines


def shown(data: bytes, chars: int) -> str:
    """A sample as a JSON string of at most ``chars`` characters, or as a bytes literal if it is not
    UTF-8 (a raw file of a bytes-mode set).

    >>> shown("naïve".encode()[:3], 9), shown(b"\\x1f\\x8b\\x08", 9)
    ('"na"', "b'\\\\x1f\\\\x8b\\\\x08'")
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.end != len(data) or err.reason != "unexpected end of data":
            return repr(data[:chars])
        text = data[: err.start].decode("utf-8")  # only the cut at the end split a character
    return json.dumps(text[:chars], ensure_ascii=False)


def sft_lines(folder: Path) -> list[str]:
    """Counts and example lengths of an SFT set."""
    lines = []
    for split in ("train", "val"):
        _, _, offsets, meta = read_sft(folder, split)
        lines.append(f"sft {split}: {meta[split]} ")
        lines += histogram(np.diff(offsets))
    lines.append(f"sft dropped: {meta['dropped']}  template: {meta['template']}")
    return lines


def inspect_folder(folder: str | Path, samples: int = 3) -> str:
    """The whole report for a dataset folder (pretraining shards and/or an SFT set)."""
    folder = Path(folder)
    has_sft = (folder / "sft_meta.json").is_file()
    if has_sft and not (folder / "meta.json").is_file():
        return "\n".join(sft_lines(folder))
    meta = read_meta(folder)
    lines = counts_lines(meta)
    for split in ("train", "val"):
        lengths = doc_lengths(open_split(folder, split, meta), meta["eot_id"])
        lines.append(f"{split}: tokens per document ({len(lengths)} documents)")
        lines += histogram(lengths)
    lines.append(f"samples (first {samples} train documents):")
    lines += sample_lines(folder, meta["eot_id"], samples)
    return "\n".join(lines + (sft_lines(folder) if has_sft else []))
