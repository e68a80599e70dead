"""Stage 8, tokenize: every piece encoded once (both cores), then written in mix order as token shards.

A shard is uint16 token ids, each document followed by ``<|endoftext|>``: ``doc0 <eot> doc1 <eot> ...``.
Pieces are encoded in batches of about ``BATCH_CHARS`` characters and appended to a scratch file
(``pieces.tokens``); after a batch is on disk (fsync), its ``(doc_id, part, start, tokens)`` rows go to
the ``tokenized`` table, so a killed run resumes after the last recorded batch (the scratch file is cut
back to what the table accounts for). Memory holds one batch, never the corpus or its index.

The shards are then cut from the scratch file in the mix order, streamed: ``val.bin`` always (one file:
euler-train's bpb eval reads it whole), and ``train.bin`` while the train split has at most
``shard_tokens`` tokens (nanoGPT's layout); a larger train split is cut into ``train_00000.bin``,
``train_00001.bin``, ... of exactly ``shard_tokens`` tokens (the last one shorter; a document may
continue in the next shard), which concatenated are the ``train.bin`` a single file would have been.
``meta.json["shards"]`` lists each split's files and token counts in order. A piece of a raw source
(``::raw``) is encoded from its exact bytes (``encode_bytes``), never as text.
"""

from __future__ import annotations

import os
import sys
from array import array
from pathlib import Path

import duckdb
import numpy as np

from euler_bpe import ENDOFTEXT, Tokenizer
from euler_data.db import connect, source_attr
from euler_data.raw_bytes import as_bytes, stored_bytes
from euler_data.workers import stop_workers

BATCH_CHARS = 64_000_000  # text per encode_batch call (the workers and their word caches stay between calls)
SCRATCH = "pieces.tokens"
FETCH_ROWS = 65_536  # mix-order rows per fetch while writing the shards
Batch = list[tuple[int, int, int, int]]  # (doc_id, part, start, tokens) of each piece of a batch


def write_uint16_le(out, ids: array) -> None:
    """Write an ``array('H')`` of token ids as little-endian uint16 (the shards' layout)."""
    if sys.byteorder == "big":
        ids.byteswap()
    ids.tofile(out)


def create_tokenized(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        "CREATE OR REPLACE TABLE tokenized (doc_id BIGINT, part INTEGER, start BIGINT, tokens BIGINT)"
    )


def record_batch(con: duckdb.DuckDBPyConnection, batch: Batch) -> None:
    """``tokenized`` += one encoded batch's rows (four lists in one statement: executemany is slow)."""
    if batch:
        columns = [list(c) for c in zip(*batch)]
        con.execute(
            "INSERT INTO tokenized SELECT unnest(?::BIGINT[]), unnest(?::INTEGER[]), unnest(?::BIGINT[]), "
            "unnest(?::BIGINT[])",
            columns,
        )


def resume_point(con: duckdb.DuckDBPyConnection, scratch: Path) -> tuple[int, tuple[int, int]]:
    """(tokens already in the scratch file, last (doc_id, part) encoded); starts over when they disagree."""
    tables = {t for (t,) in con.execute("SHOW TABLES").fetchall()}
    if "tokenized" in tables and scratch.is_file():
        done = con.execute("SELECT coalesce(sum(tokens), 0) FROM tokenized").fetchone()[0]
        last = con.execute(
            "SELECT doc_id, part FROM tokenized ORDER BY doc_id DESC, part DESC LIMIT 1"
        ).fetchone()
        if last is not None and scratch.stat().st_size >= 2 * done:
            return int(done), (int(last[0]), int(last[1]))
    create_tokenized(con)
    return 0, (-1, -1)


def fetch_batch(con: duckdb.DuckDBPyConnection, after: tuple[int, int]) -> list[tuple[int, int, str, bool]]:
    """The next pieces ``(doc_id, part, text, raw)`` after ``after`` in (doc_id, part) order, about
    BATCH_CHARS characters.

    ``pieces`` is stored in (doc_id, part) order (split writes it as a projection of ``deduped``), so
    the rows stream in that order from a range scan: no ``ORDER BY``, which sorted (and spilled) all the
    remaining text for every batch, a cost quadratic in the corpus.
    """
    raw = source_attr(con, "raw", "source")
    cursor = con.execute(f"SELECT doc_id, part, text, {raw} FROM pieces WHERE doc_id >= ?", [after[0]])
    rows, size, last = [], 0, after
    while size < BATCH_CHARS and (chunk := cursor.fetchmany(64)):  # overshoot: at most 63 pieces
        for row in chunk:
            if row[:2] <= last:  # at or before the resume point, or out of order
                if row[:2] > after:
                    raise RuntimeError(f"tokenize: pieces are not in (doc_id, part) order at {row[:2]}")
                continue
            rows.append(row)
            size += len(row[2])
            last = row[:2]
    return rows


def encode_pieces(folder: Path, tok: Tokenizer, workers: int, progress=None) -> int:
    """Encode every piece once into ``folder/pieces.tokens`` and ``tokenized``; returns the tokens.

    The connection is closed while a batch is encoded: encode_batch forks its workers, and forking while
    DuckDB's threads run can crash or hang the children.
    """
    scratch = folder / SCRATCH
    con = connect(folder)
    offset, after = resume_point(con, scratch)
    with open(scratch, "ab") as out:
        out.truncate(2 * offset)  # drop a batch written but not recorded before a kill
        batch: Batch = []
        while True:
            record_batch(con, batch)
            rows = fetch_batch(con, after)
            con.close()
            if not rows:
                break
            batch = []
            for (doc_id, part, text, raw), seq in zip(rows, encode_rows(tok, rows, workers)):
                write_uint16_le(out, seq)
                batch.append((doc_id, part, offset, len(seq)))
                offset += len(seq)
                if progress is not None:
                    progress.update(stored_bytes(text, raw))
            out.flush()
            os.fsync(out.fileno())  # on disk before the table says so
            after = rows[-1][:2]
            con = connect(folder)
    stop_workers(tok)
    return offset


def encode_rows(tok: Tokenizer, rows: list[tuple[int, int, str, bool]], workers: int) -> list[array]:
    """The ids of each fetched piece as ``array('H')``: text in one ``encode_batch``, raw ones by bytes."""
    # array('H') straight from the workers: no Python ints to build and pack again
    texts = tok.encode_batch([text for *_, text, raw in rows if not raw], workers=workers, typecode="H")
    encoded = iter(texts)
    return [array("H", tok.encode_bytes(as_bytes(text))) if raw else next(encoded) for *_, text, raw in rows]


class ShardWriter:
    """Writes one split's token stream as ``{split}.bin``, or as shards of ``shard_tokens`` tokens."""

    def __init__(self, folder: Path, split: str, shard_tokens: int | None):
        self.folder, self.split, self.size = folder, split, shard_tokens
        self.files: list[dict] = []
        self.out = None

    def _next_file(self) -> None:
        if self.out is not None:
            self.out.close()
        name = f"{self.split}.bin" if self.size is None else f"{self.split}_{len(self.files):05d}.bin"
        self.files.append({"file": name, "tokens": 0})
        self.out = open(self.folder / name, "wb")

    def write(self, data: bytes) -> None:
        """Append uint16 tokens, starting a new shard whenever the current one is full."""
        while data or self.out is None:
            if self.out is None or (self.size is not None and self.files[-1]["tokens"] == self.size):
                self._next_file()
            room = len(data) // 2 if self.size is None else self.size - self.files[-1]["tokens"]
            head, data = data[: 2 * room], data[2 * room :]
            self.out.write(head)
            self.files[-1]["tokens"] += len(head) // 2

    def close(self) -> list[dict]:
        if self.out is None:
            self._next_file()  # an empty split is one empty file, as before
        self.out.close()
        return self.files


def split_files(folder: Path, split: str) -> list[Path]:
    """Token files of a split left in ``folder`` (by an earlier or interrupted run)."""
    return [p for p in [folder / f"{split}.bin", *sorted(folder.glob(f"{split}_[0-9]*.bin"))] if p.is_file()]


def write_split(con, split: str, eot: int, folder: Path, shard_tokens: int | None, dest: Path) -> list[dict]:
    """Write one split into ``dest`` in the ``mixed`` order, streamed from ``folder``'s scratch file;
    returns its shard list."""
    total = con.execute(
        "SELECT coalesce(sum(t.tokens + 1), 0) FROM mixed m JOIN tokenized t USING (doc_id, part) "
        "WHERE m.split = ?",
        [split],
    ).fetchone()[0]
    sharded = split == "train" and shard_tokens is not None and total > shard_tokens
    for path in split_files(dest, split):
        path.unlink()
    writer = ShardWriter(dest, split, shard_tokens if sharded else None)
    eot_bytes = np.array([eot], dtype="<u2").tobytes()
    cursor = con.execute(
        "SELECT t.start, t.tokens FROM mixed m JOIN tokenized t USING (doc_id, part) WHERE m.split = ? "
        "ORDER BY m.ord",
        [split],
    )
    fd = os.open(folder / SCRATCH, os.O_RDONLY)
    try:
        while rows := cursor.fetchmany(FETCH_ROWS):
            # pread, not a memory map: mapped pages of the scratch file would count in the RSS
            writer.write(b"".join(os.pread(fd, 2 * n, 2 * start) + eot_bytes for start, n in rows))
    finally:
        os.close(fd)
    return writer.close()


def tokenize(
    con: duckdb.DuckDBPyConnection,
    tok: Tokenizer,
    folder: Path,
    shard_tokens: int | None,
    dest: Path | None = None,
) -> dict:
    """Stage 8 (after ``encode_pieces``): the shards, in ``dest`` (default ``folder``); returns
    ``{split: [{"file", "tokens"}, ...]}``."""
    eot = tok.special_tokens[ENDOFTEXT]
    dest = folder if dest is None else dest
    return {split: write_split(con, split, eot, folder, shard_tokens, dest) for split in ("train", "val")}
