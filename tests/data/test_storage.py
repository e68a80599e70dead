"""The pipeline's DuckDB file on disk: tables written compressed into the file (not through the WAL),
freed blocks given back by `rewrite`, and tokenize reading pieces in stored order."""

from __future__ import annotations

from pathlib import Path

import pytest

from euler_data import shards
from euler_data.db import DB_NAME, connect, rewrite
from tests.data.conftest import prose

DOCS = 3000  # rows of ~9 kB: about 27 MB of text, more than one row group


def _fill(folder: Path):
    con = connect(folder)
    texts = [prose(seed, words=1500) for seed in range(50)]
    con.execute(
        "CREATE TABLE docs AS SELECT i AS doc_id, 'a' AS source, (?::VARCHAR[])[i % 50 + 1] || i AS text "
        "FROM range(?) t(i)",
        [texts, DOCS],
    )
    text_bytes = con.execute("SELECT sum(strlen(text)) FROM docs").fetchone()[0]
    return con, text_bytes


def _wal(folder: Path) -> int:
    wal = folder / f"{DB_NAME}.wal"
    return wal.stat().st_size if wal.exists() else 0


def test_a_large_table_goes_into_the_file_not_the_wal(tmp_path):
    con, text_bytes = _fill(tmp_path)
    # committed, not yet checkpointed: with DuckDB's default row groups (122,880 rows) all of it would
    # sit uncompressed in the write-ahead log, as large as the text
    assert _wal(tmp_path) < text_bytes / 10
    con.close()


def test_rewrite_keeps_the_chosen_tables_and_gives_the_freed_blocks_back(tmp_path):
    con, _ = _fill(tmp_path)
    con.execute("CREATE TABLE narrow AS SELECT doc_id, source FROM docs")
    con.execute("CHECKPOINT")
    full = (tmp_path / DB_NAME).stat().st_size
    expected = con.execute("SELECT doc_id, source FROM docs").fetchall()
    con.close()
    rewrite(tmp_path, {"docs": "doc_id, source", "narrow": "*"})
    assert (tmp_path / DB_NAME).stat().st_size < full / 5  # the text's blocks are gone from the disk
    assert not (tmp_path / f"{DB_NAME}.compact").exists()
    con = connect(tmp_path)
    assert con.execute("SELECT * FROM docs").fetchall() == expected  # in stored order
    assert con.execute("SELECT count(*) FROM narrow").fetchone()[0] == DOCS
    con.close()


def test_fetch_batch_streams_pieces_in_order_from_the_resume_point(tmp_path, monkeypatch):
    con, _ = _fill(tmp_path)
    con.execute("CREATE TABLE sources AS SELECT 'a' AS source, false AS raw")
    con.execute("CREATE TABLE pieces AS SELECT doc_id, unnest([0, 1]) AS part, source, text FROM docs")
    monkeypatch.setattr(shards, "BATCH_CHARS", 2_000_000)
    seen, after = [], (-1, -1)
    while rows := shards.fetch_batch(con, after):
        assert sum(len(r[2]) for r in rows) < shards.BATCH_CHARS + 64 * 10_000
        seen += [r[:2] for r in rows]
        after = rows[-1][:2]
    assert seen == [(d, p) for d in range(DOCS) for p in (0, 1)]  # each piece once, in order
    assert shards.fetch_batch(con, (5, 0))[0][:2] == (5, 1)  # a resume inside a document
    con.execute("CREATE OR REPLACE TABLE pieces AS SELECT * FROM pieces ORDER BY doc_id DESC")
    with pytest.raises(RuntimeError, match="not in"):
        shards.fetch_batch(con, (-1, -1))
    con.close()
