"""Stage 4, dedup: ``filtered`` -> ``deduped``; the first (lowest doc_id) copy of a text is kept.

"duplicate": the same cleaned text (md5); "near_duplicate": the same text after lower-casing and
collapsing every run of non-letters/digits to one space (md5 of that normal form).
"""

from __future__ import annotations

import duckdb

NORMAL_FORM = r"trim(lower(regexp_replace(text, '[^\p{L}\p{N}]+', ' ', 'g')))"


def dedup(con: duckdb.DuckDBPyConnection, near: bool = True) -> int:
    """Stage 4: ``deduped(doc_id, source, text, hash, reason)``; returns how many are kept."""
    near_rule = "WHEN row_number() OVER (PARTITION BY norm ORDER BY doc_id) > 1 THEN 'near_duplicate'"
    con.execute(
        f"""CREATE OR REPLACE TABLE deduped AS
        WITH h AS (
            SELECT *, md5(text) AS hash, md5({NORMAL_FORM}) AS norm FROM filtered WHERE reason IS NULL
        ), ranked AS (
            SELECT doc_id, source, text, hash, CASE
                WHEN row_number() OVER (PARTITION BY hash ORDER BY doc_id) > 1 THEN 'duplicate'
                {near_rule if near else ""}
            END AS reason FROM h
        )
        SELECT * FROM ranked
        UNION ALL SELECT doc_id, source, NULL, NULL, reason FROM filtered WHERE reason IS NOT NULL
        ORDER BY doc_id"""
    )
    return con.execute("SELECT count(*) FROM deduped WHERE reason IS NULL").fetchone()[0]
