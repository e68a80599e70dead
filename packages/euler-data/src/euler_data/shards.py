"""Stage 8, tokenize: every piece encoded once (both cores), written in mix order to train.bin / val.bin.

A bin is uint16 token ids, each document followed by ``<|endoftext|>``: ``doc0 <eot> doc1 <eot> ...``.
Per-piece token counts go to the ``tokenized`` table for ``meta.json`` and ``inspect``.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np

from euler_bpe import ENDOFTEXT, Tokenizer

BATCH_CHARS = 64_000_000  # text per encode_batch call: each call starts worker processes with cold caches


def _batches(rows: list[tuple[int, int, str]]):
    """Group (doc_id, part, text) rows into batches of about BATCH_CHARS characters."""
    batch, size = [], 0
    for row in rows:
        batch.append(row)
        size += len(row[2])
        if size >= BATCH_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def fetch_pieces(con: duckdb.DuckDBPyConnection) -> list[tuple[int, int, str]]:
    """(doc_id, part, text) of every piece."""
    return con.execute("SELECT doc_id, part, text FROM pieces ORDER BY doc_id, part").fetchall()


def encode_pieces(rows, tok: Tokenizer, workers: int, progress=None) -> dict[tuple[int, int], np.ndarray]:
    """Encode each piece once: (doc_id, part) -> uint16 ids.

    Run it with no DuckDB connection open: the workers are forked, and forking a process while
    DuckDB's threads run can crash or hang the children.
    """
    encoded: dict[tuple[int, int], np.ndarray] = {}
    for batch in _batches(rows):
        ids = tok.encode_batch([text for _, _, text in batch], workers=workers)
        for (doc_id, part, text), seq in zip(batch, ids):
            encoded[(doc_id, part)] = np.asarray(seq, dtype=np.uint16)
            if progress is not None:
                progress.update(len(text.encode("utf-8")))
    return encoded


def write_tokenized(con: duckdb.DuckDBPyConnection, encoded: dict[tuple[int, int], np.ndarray]) -> None:
    """The ``tokenized(doc_id, part, tokens)`` table of token counts."""
    keys = list(encoded)
    columns = [[d for d, _ in keys], [p for _, p in keys], [len(encoded[k]) for k in keys]]
    con.execute(  # three lists in one statement: executemany costs ~0.5 ms per row
        "CREATE OR REPLACE TABLE tokenized AS SELECT unnest(?::BIGINT[]) AS doc_id, "
        "unnest(?::INTEGER[]) AS part, unnest(?::BIGINT[]) AS tokens",
        columns,
    )


def write_bins(con, encoded: dict[tuple[int, int], np.ndarray], eot: int, folder: Path) -> dict[str, int]:
    """Write ``train.bin`` and ``val.bin`` in the ``mixed`` order; returns tokens per split."""
    eot_arr = np.array([eot], dtype=np.uint16)
    totals = {}
    for split in ("train", "val"):
        order = con.execute("SELECT doc_id, part FROM mixed WHERE split = ? ORDER BY ord", [split]).fetchall()
        total = 0
        with open(folder / f"{split}.bin", "wb") as out:
            for key in order:
                out.write(encoded[key].tobytes())
                out.write(eot_arr.tobytes())
                total += len(encoded[key]) + 1
        totals[split] = total
    return totals


def tokenize(con: duckdb.DuckDBPyConnection, encoded, tok: Tokenizer, folder: Path) -> dict[str, int]:
    """Stage 8 (after ``encode_pieces``): the counts table and the bins; returns tokens per split."""
    write_tokenized(con, encoded)
    return write_bins(con, encoded, tok.special_tokens[ENDOFTEXT], folder)
