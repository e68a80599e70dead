"""Stage 8, tokenize: every piece encoded once (both cores), written in mix order to train.bin / val.bin.

A bin is uint16 token ids, each document followed by ``<|endoftext|>``: ``doc0 <eot> doc1 <eot> ...``.
Pieces are encoded in batches of about ``BATCH_CHARS`` characters and appended to a scratch file
(``pieces.tokens``), so memory holds one batch; the bins are then cut from it in the mix order.
Per-piece token counts go to the ``tokenized`` table for ``meta.json`` and ``inspect``. A piece of a raw
source (``::raw``) is encoded from its exact bytes (``encode_bytes``), never as text.
"""

from __future__ import annotations

import sys
from array import array
from pathlib import Path

import duckdb
import numpy as np

from euler_bpe import ENDOFTEXT, Tokenizer
from euler_data.db import connect
from euler_data.meta import open_bin
from euler_data.raw_bytes import as_bytes, stored_bytes
from euler_data.workers import stop_workers

BATCH_CHARS = 64_000_000  # text per encode_batch call (the workers and their word caches stay between calls)
SCRATCH = "pieces.tokens"
Index = dict[tuple[int, int], tuple[int, int]]  # (doc_id, part) -> (start, length) in the scratch file


def write_uint16_le(out, ids: array) -> None:
    """Write an ``array('H')`` of token ids as little-endian uint16 (the bins' layout)."""
    if sys.byteorder == "big":
        ids.byteswap()
    ids.tofile(out)


def fetch_batch(folder: Path, after: tuple[int, int]) -> list[tuple[int, int, str, bool]]:
    """The next pieces ``(doc_id, part, text, raw)`` after ``after`` in (doc_id, part) order, about
    BATCH_CHARS characters.

    The connection is closed on return: encode_batch forks its workers, and forking while DuckDB's
    threads run can crash or hang the children.
    """
    con = connect(folder)
    try:
        cursor = con.execute(
            "SELECT doc_id, part, text, s.raw FROM pieces JOIN sources s USING (source) "
            "WHERE doc_id > ? OR (doc_id = ? AND part > ?) ORDER BY doc_id, part",
            [after[0], after[0], after[1]],
        )
        rows, size = [], 0
        while size < BATCH_CHARS and (row := cursor.fetchone()) is not None:
            rows.append(row)
            size += len(row[2])
        return rows
    finally:
        con.close()


def encode_pieces(folder: Path, tok: Tokenizer, workers: int, progress=None) -> Index:
    """Encode every piece once into ``folder/pieces.tokens``; returns where each one lies."""
    index: Index = {}
    offset, after = 0, (-1, -1)
    with open(folder / SCRATCH, "wb") as out:
        while rows := fetch_batch(folder, after):
            for (doc_id, part, text, raw), seq in zip(rows, encode_rows(tok, rows, workers)):
                write_uint16_le(out, seq)
                index[(doc_id, part)] = (offset, len(seq))
                offset += len(seq)
                if progress is not None:
                    progress.update(stored_bytes(text, raw))
            after = rows[-1][:2]
    stop_workers(tok)
    return index


def encode_rows(tok: Tokenizer, rows: list[tuple[int, int, str, bool]], workers: int) -> list[array]:
    """The ids of each fetched piece as ``array('H')``: text in one ``encode_batch``, raw ones by bytes."""
    # array('H') straight from the workers: no Python ints to build and pack again
    texts = tok.encode_batch([text for *_, text, raw in rows if not raw], workers=workers, typecode="H")
    encoded = iter(texts)
    return [array("H", tok.encode_bytes(as_bytes(text))) if raw else next(encoded) for *_, text, raw in rows]


def write_tokenized(con: duckdb.DuckDBPyConnection, index: Index) -> None:
    """The ``tokenized(doc_id, part, tokens)`` table of token counts."""
    keys = list(index)
    columns = [[d for d, _ in keys], [p for _, p in keys], [index[k][1] for k in keys]]
    con.execute(  # three lists in one statement: executemany costs ~0.5 ms per row
        "CREATE OR REPLACE TABLE tokenized AS SELECT unnest(?::BIGINT[]) AS doc_id, "
        "unnest(?::INTEGER[]) AS part, unnest(?::BIGINT[]) AS tokens",
        columns,
    )


def write_bins(con, index: Index, eot: int, folder: Path) -> dict[str, int]:
    """Write ``train.bin`` and ``val.bin`` in the ``mixed`` order; returns tokens per split."""
    scratch = folder / SCRATCH
    tokens = open_bin(scratch, np.uint16)  # every piece's tokens, back to back
    eot_bytes = np.array([eot], dtype=np.uint16).tobytes()
    totals = {}
    for split in ("train", "val"):
        order = con.execute("SELECT doc_id, part FROM mixed WHERE split = ? ORDER BY ord", [split]).fetchall()
        total = 0
        with open(folder / f"{split}.bin", "wb") as out:
            for key in order:
                start, length = index[key]
                out.write(tokens[start : start + length].tobytes() + eot_bytes)
                total += length + 1
        totals[split] = total
    del tokens  # release the map before the scratch file goes
    return totals


def tokenize(con: duckdb.DuckDBPyConnection, index: Index, tok: Tokenizer, folder: Path) -> dict[str, int]:
    """Stage 8 (after ``encode_pieces``): the counts table and the bins; returns tokens per split."""
    write_tokenized(con, index)
    totals = write_bins(con, index, tok.special_tokens[ENDOFTEXT], folder)
    (folder / SCRATCH).unlink()
    return totals
