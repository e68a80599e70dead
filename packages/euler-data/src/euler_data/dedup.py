"""Stage 4, dedup: ``filtered`` -> ``deduped``; the first (lowest doc_id) copy of a text is kept.

"duplicate": the same cleaned text (md5); "near_duplicate": the same text after lower-casing and
collapsing every run of non-letters/digits to one space (md5 of that normal form). Optionally
(``minhash_threshold``), also "similar": a bottom-k MinHash sketch (the 64 smallest hashes of each
document's 5-word shingles) estimates the Jaccard similarity of every pair sharing a sketch hash as
``shared / (2 * 64 - shared)``; the later document of a pair at or above the threshold is dropped.
Raw sources (``::raw``: bytes, not prose) are only deduplicated exactly.
"""

from __future__ import annotations

import duckdb

from euler_data.db import source_attr

NORMAL_FORM = r"trim(lower(regexp_replace(text, '[^\p{L}\p{N}]+', ' ', 'g')))"


def dedup(con: duckdb.DuckDBPyConnection, near: bool = True) -> int:
    """Stage 4: ``deduped(doc_id, source, text, hash, reason)``; returns how many are kept.

    The ranking runs over a narrow table of hashes (no text), sorted; the text joins back by position
    (both tables in doc_id order), so the text is streamed once and never sorted.
    """
    raw = source_attr(con, "raw", "source")
    con.execute(
        f"""CREATE OR REPLACE TABLE dedup_keys AS SELECT doc_id, reason,
            CASE WHEN reason IS NULL THEN md5(text) END AS hash,
            CASE WHEN reason IS NOT NULL THEN NULL WHEN {raw} THEN 'raw:' || md5(text)
                ELSE md5({NORMAL_FORM}) END AS norm
        FROM filtered"""
    )
    near_rule = "WHEN row_number() OVER (PARTITION BY norm ORDER BY doc_id) > 1 THEN 'near_duplicate'"
    con.execute(
        f"""CREATE OR REPLACE TABLE dedup_reasons AS SELECT doc_id, hash, CASE
            WHEN reason IS NOT NULL THEN reason
            WHEN row_number() OVER (PARTITION BY hash ORDER BY doc_id) > 1 THEN 'duplicate'
            {near_rule if near else ""}
        END AS reason FROM dedup_keys ORDER BY doc_id"""
    )
    misaligned = con.execute(
        "SELECT count(*) FROM filtered f POSITIONAL JOIN dedup_reasons r "
        "WHERE f.doc_id IS DISTINCT FROM r.doc_id"
    ).fetchone()[0]
    if misaligned:  # the positional join below needs both sides in doc_id order
        raise RuntimeError(f"dedup: {misaligned} rows of filtered and dedup_reasons do not line up")
    con.execute(
        """CREATE OR REPLACE TABLE deduped AS SELECT f.doc_id, f.source,
            CASE WHEN f.reason IS NULL THEN f.text END AS text, r.hash, r.reason
        FROM filtered f POSITIONAL JOIN dedup_reasons r"""
    )
    con.execute("DROP TABLE dedup_keys; DROP TABLE dedup_reasons")
    return con.execute("SELECT count(*) FROM deduped WHERE reason IS NULL").fetchone()[0]


SKETCH = 64  # hashes kept per document
SIMILAR_PAIRS = f"""
WITH kept AS (
    SELECT doc_id, string_split({NORMAL_FORM}, ' ') AS w FROM deduped
    WHERE reason IS NULL AND source NOT IN (SELECT source FROM sources WHERE raw)
), words AS (
    SELECT doc_id, unnest(w) AS word, generate_subscripts(w, 1) AS pos FROM kept
), shingles AS (
    SELECT doc_id, hash(word, lead(word, 1) OVER d, lead(word, 2) OVER d, lead(word, 3) OVER d,
        lead(word, 4) OVER d) AS h, lead(word, 4) OVER d IS NOT NULL AS complete
    FROM words WINDOW d AS (PARTITION BY doc_id ORDER BY pos)
), bottom AS (
    SELECT doc_id, h FROM (SELECT DISTINCT doc_id, h FROM shingles WHERE complete)
    QUALIFY row_number() OVER (PARTITION BY doc_id ORDER BY h) <= {SKETCH}
)
SELECT a.doc_id AS first, b.doc_id AS later, count(*) AS shared
FROM bottom a JOIN bottom b ON a.h = b.h AND a.doc_id < b.doc_id GROUP BY ALL
"""


def drop_similar(con: duckdb.DuckDBPyConnection, threshold: float) -> int:
    """Mark the later document of each pair with estimated Jaccard >= threshold "similar"; returns kept."""
    con.execute(
        f"""UPDATE deduped SET reason = 'similar' WHERE doc_id IN (
            SELECT later FROM ({SIMILAR_PAIRS}) WHERE shared / (2.0 * {SKETCH} - shared) >= ?)""",
        [float(threshold)],
    )
    return con.execute("SELECT count(*) FROM deduped WHERE reason IS NULL").fetchone()[0]
