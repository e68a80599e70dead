"""Stage 3, filter: ``clean`` -> ``filtered``, each document kept (reason NULL) or dropped for one reason.

Reasons, first match wins: the ingest reason, "empty", "too_long", "too_short", "low_score" (the
source's ``min_score``), "too_few_words", "not_prose" (letters and spaces over all characters below
``min_alpha_ratio``: tables, code dumps, binary junk). A raw source's files (``::raw``, where a
character is a byte) are dropped only when empty or longer than ``max_chars`` bytes.
"""

from __future__ import annotations

import duckdb

from euler_data.db import source_attr
from euler_data.recipe import FilterConfig

# a filter's reason -> the FilterConfig field that sets its bar, and how to lower it
FIXES = {
    "too_short": ("min_chars", "--min-chars N"),
    "too_long": ("max_chars", "max_chars in the recipe's [filter]"),
    "low_score": (None, "the source's min_score"),
    "too_few_words": ("min_words", "min_words in the recipe's [filter]"),
    "not_prose": ("min_alpha_ratio", "min_alpha_ratio in the recipe's [filter]"),
}


def reason_sql(f: FilterConfig, raw: str = "s.raw", min_score: str = "s.min_score") -> str:
    """The SQL CASE giving a document's drop reason (NULL = kept); ``raw`` and ``min_score`` are the
    SQL of the document's source's attributes."""
    letters = r"length(regexp_replace(c.text, '[^\p{L}\s]', '', 'g'))"
    words = r"len(regexp_extract_all(c.text, '\S+'))"
    return f"""CASE
        WHEN c.reason IS NOT NULL THEN c.reason
        WHEN length(c.text) = 0 THEN 'empty'
        WHEN length(c.text) > {int(f.max_chars)} THEN 'too_long'
        WHEN {raw} THEN NULL
        WHEN length(c.text) < {int(f.min_chars)} THEN 'too_short'
        WHEN {min_score} IS NOT NULL AND coalesce(c.score, -1e300) < {min_score} THEN 'low_score'
        WHEN {words} < {int(f.min_words)} THEN 'too_few_words'
        WHEN {letters} < {float(f.min_alpha_ratio)} * length(c.text) THEN 'not_prose'
    END"""


def filter_docs(con: duckdb.DuckDBPyConnection, f: FilterConfig) -> int:
    """Stage 3: ``filtered(doc_id, source, text, reason)``; returns how many are kept."""
    reason = reason_sql(f, source_attr(con, "raw", "c.source"), source_attr(con, "min_score", "c.source"))
    con.execute(  # a projection of `clean`, streamed in its doc_id order
        f"CREATE OR REPLACE TABLE filtered AS SELECT c.doc_id, c.source, c.text, {reason} AS reason "
        "FROM clean c"
    )
    return con.execute("SELECT count(*) FROM filtered WHERE reason IS NULL").fetchone()[0]
