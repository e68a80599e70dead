"""Stage 5, split: ``deduped`` -> ``pieces``, each kept document to train or val, deterministically.

Hash split: ``u = md5_number_upper(seed:hash) / 2**64``, val when ``u < val_fraction``; if that leaves
val empty while there are two or more documents, the one with the smallest ``u`` goes to val. Position
split (Tiny Shakespeare, one document): the first ``1 - val_fraction`` of its characters go to train,
the rest to val, as nanoGPT does. ``pieces(doc_id, part, source, split, text)``; ``part`` is 0, or 1
for the val half of a position split.
"""

from __future__ import annotations

import duckdb

UNIT = "(md5_number_upper(? || ':' || hash)::DOUBLE / 18446744073709551616.0)"  # in [0, 1)


def split(con: duckdb.DuckDBPyConnection, val_fraction: float, seed: int) -> dict[str, int]:
    """Stage 5: fill ``pieces``; returns the number of pieces per split."""
    f = float(val_fraction)
    con.execute(
        f"""CREATE OR REPLACE TABLE pieces AS
        WITH kept AS (
            SELECT d.*, s.split_mode, {UNIT} AS u FROM deduped d JOIN sources s USING (source)
            WHERE d.reason IS NULL
        ), hashed AS (
            SELECT *, min(u) OVER () AS u_min, count(*) OVER () AS n FROM kept WHERE split_mode = 'hash'
        ), cut AS (
            SELECT *, floor(length(text) * (1 - {f}))::BIGINT AS cut_at FROM kept
            WHERE split_mode = 'position'
        )
        SELECT doc_id, 0 AS part, source, CASE
            WHEN u < {f} OR ({f} > 0 AND n > 1 AND u_min >= {f} AND u = u_min) THEN 'val' ELSE 'train'
        END AS split, text FROM hashed
        UNION ALL SELECT doc_id, 0, source, 'train', substr(text, 1, cut_at) FROM cut
        UNION ALL SELECT doc_id, 1, source, 'val', substr(text, cut_at + 1) FROM cut
            WHERE cut_at < length(text)
        ORDER BY doc_id, part""",
        [str(seed)],
    )
    rows = con.execute("SELECT split, count(*) FROM pieces GROUP BY split").fetchall()
    return {"train": 0, "val": 0, **dict(rows)}
