"""Stage 6, mix: ``pieces`` -> ``mixed``, the order of documents in train.bin and val.bin.

A train piece of a source with weight ``w`` appears ``floor(w)`` times, plus once more when its hash
fraction is below ``w - floor(w)`` (so 0.5 keeps about half, 2.0 doubles). Val pieces appear once,
unweighted, so validation measures the natural text. Within a split the order is a seeded hash shuffle.
``mixed(split, ord, doc_id, part, copy)``.
"""

from __future__ import annotations

import duckdb


def mix(con: duckdb.DuckDBPyConnection, seed: int) -> dict[str, int]:
    """Stage 6: fill ``mixed``; returns the number of document copies per split."""
    con.execute(
        """CREATE OR REPLACE TABLE mixed AS
        WITH w AS (
            SELECT p.doc_id, p.part, p.split, CASE WHEN p.split = 'val' THEN 1.0 ELSE s.weight END AS weight,
                md5_number_upper(? || ':w:' || p.doc_id)::DOUBLE / 18446744073709551616.0 AS u
            FROM pieces p JOIN sources s USING (source)
        ), copies AS (
            SELECT *, (floor(weight) + CASE WHEN u < weight - floor(weight) THEN 1 ELSE 0 END)::BIGINT AS n
            FROM w
        )
        SELECT split, doc_id, part, c.copy,
            md5_number_upper(? || ':mix:' || doc_id || ':' || part || ':' || c.copy) AS ord
        FROM copies, LATERAL (SELECT unnest(range(n)) AS copy) c
        ORDER BY split, ord""",
        [str(seed), str(seed)],
    )
    rows = con.execute("SELECT split, count(*) FROM mixed GROUP BY split").fetchall()
    return {"train": 0, "val": 0, **dict(rows)}
