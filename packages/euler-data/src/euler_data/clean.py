"""Stage 2, clean: ``raw`` -> ``clean`` with one SQL query.

Line endings to ``\\n``, control characters (all but tab and newline) and the byte-order mark removed,
Unicode NFC, the Project Gutenberg header (up to ``*** START OF ... ***``) and footer (from
``*** END OF ...``) cut, surrounding whitespace trimmed. Raw sources (``::raw``) are left as they are.

>>> clean_text(con, "\\ufeffa\\r\\nb\\x00")  # doctest: +SKIP
'a\\nb'
"""

from __future__ import annotations

import duckdb

from euler_data.db import source_attr

# RE2 patterns; (?s) lets '.' cross lines
CONTROL = r"[\x00-\x08\x0B\x0C\x0E-\x1F\x7F-\x9F\x{FEFF}]"
PG_HEADER = r"(?s)^.*?\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG[^\n]*\n"
PG_FOOTER = r"(?s)\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG.*$"
# "End of the Project Gutenberg EBook of <title>" just before the footer; titles may wrap onto 2 more lines
PG_LAST_LINE = r"(?is)\n[^\n]*end of (the )?project gutenberg[^\n]*(\n[^\n]+){0,2}\s*$"


def clean_sql(column: str) -> str:
    """The SQL expression that cleans text ``column`` (innermost step first)."""
    expr = f"replace(replace({column}, chr(13) || chr(10), chr(10)), chr(13), chr(10))"
    expr = f"regexp_replace({expr}, '{CONTROL}', '', 'g')"  # before NFC: nfc_normalize stops at a NUL
    expr = f"nfc_normalize({expr})"
    expr = f"regexp_replace({expr}, '{PG_HEADER}', '')"
    expr = f"regexp_replace({expr}, '{PG_FOOTER}', '')"
    expr = f"regexp_replace({expr}, '{PG_LAST_LINE}', '')"
    return f"trim({expr}, ' ' || chr(9) || chr(10))"


def clean(con: duckdb.DuckDBPyConnection) -> int:
    """Stage 2: ``clean(doc_id, source, text, score, reason)``; returns the number of rows."""
    raw = source_attr(con, "raw", "r.source")
    con.execute(  # a projection of `raw`, streamed in its doc_id order
        f"CREATE OR REPLACE TABLE clean AS SELECT r.doc_id, r.source, CASE WHEN r.reason IS NOT NULL "
        f"THEN NULL WHEN {raw} THEN r.text ELSE {clean_sql('r.text')} END AS text, r.score, r.reason "
        "FROM raw r"
    )
    return con.execute("SELECT count(*) FROM clean").fetchone()[0]


def clean_text(con: duckdb.DuckDBPyConnection, text: str) -> str:
    """Clean one string with the same SQL (for tests and ``inspect``)."""
    return con.execute(f"SELECT {clean_sql('?')}", [text]).fetchone()[0]
