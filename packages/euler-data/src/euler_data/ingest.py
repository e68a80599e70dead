"""Stage 1, ingest: every source's records into the ``raw`` table, unreadable ones kept with a reason.

``raw(doc_id, source, file, text, score, reason)``: one row per document in; ``reason`` is NULL when
the text was read, else why not (the document is counted as dropped for that reason; a folder's file
of an extension no reader takes is one document dropped as "unknown_extension"). A raw source
(``::raw``, bytes mode) gives one row per file, its bytes stored as ``raw_bytes`` says, and
``sources.raw`` is true for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import duckdb

from euler_data.errors import DataError
from euler_data.readers import Record, read_json_file, read_raw, read_txt
from euler_data.recipe import Recipe, SourceSpec
from euler_data.sources import UNKNOWN, Input

RAW_COLUMNS = {
    "doc_id": "BIGINT",
    "source": "VARCHAR",
    "file": "VARCHAR",
    "text": "VARCHAR",
    "score": "DOUBLE",
    "reason": "VARCHAR",
}
_SCHEMA = ", ".join(f"{k} {v}" for k, v in RAW_COLUMNS.items())
STAGING = "raw_staging.jsonl"  # records on their way into `raw`


def create_tables(con: duckdb.DuckDBPyConnection, recipe: Recipe) -> None:
    """Fresh ``raw`` and ``sources`` tables (a rerun of ingest starts over)."""
    con.execute(f"CREATE OR REPLACE TABLE raw ({_SCHEMA})")
    con.execute(
        "CREATE OR REPLACE TABLE sources (source VARCHAR PRIMARY KEY, spec VARCHAR, weight DOUBLE, "
        "split_mode VARCHAR, min_score DOUBLE, raw BOOLEAN)"
    )
    for s in recipe.sources:
        row = [s.label, s.spec, s.weight, s.split_mode, s.min_score, s.docs == "raw"]
        con.execute("INSERT INTO sources VALUES (?, ?, ?, ?, ?, ?)", row)


def python_records(item: Input, source: SourceSpec, max_chars: int) -> Iterator[Record]:
    """Records of a text-like input, read in Python so that bad lines are counted one by one; a raw
    source's input is one record of its bytes (a byte is a character there)."""
    path = Path(item.location)
    if source.docs == "raw":
        if "://" in item.location:
            raise DataError(source.spec, f"::raw reads local files only, not {item.location}")
        return iter([read_raw(path, max_chars)])
    if item.fmt == UNKNOWN:  # a folder's file of an extension no reader takes
        return iter([(None, None, "unknown_extension")])
    if item.fmt == "txt":
        return read_txt(path, source.docs, max_chars * 4)  # a UTF-8 character is at most 4 bytes
    return read_json_file(path, source.text_field, source.score_field)


def write_staging(
    staging, records: Iterable[Record], source: str, file: str, first_id: int
) -> tuple[int, int]:
    """Append records as JSON lines that DuckDB loads in one query; returns the next free doc_id and
    the longest line's UTF-8 bytes."""
    next_id, longest = first_id, 0
    for text, score, reason in records:
        row = {"doc_id": next_id, "source": source, "file": file, "text": text, "score": score}
        line = json.dumps({**row, "reason": reason}, ensure_ascii=False) + "\n"
        staging.write(line)
        longest = max(longest, len(line) if line.isascii() else len(line.encode("utf-8")))
        next_id += 1
    return next_id, longest


def load_staging(con: duckdb.DuckDBPyConnection, staging: Path, longest: int) -> None:
    """``raw`` += the staged JSON lines (DuckDB's JSON reader, typed columns); its read buffers are sized
    by the longest line (the reader allocates ``maximum_object_size`` per thread)."""
    columns = "{" + ", ".join(f"'{k}': '{v}'" for k, v in RAW_COLUMNS.items()) + "}"
    con.execute(
        f"INSERT INTO raw SELECT * FROM read_json(?, format = 'newline_delimited', columns = {columns}, "
        f"maximum_object_size = {max(longest + 1, 1 << 20)})",
        [str(staging)],
    )


def flush_staging(con: duckdb.DuckDBPyConnection, out, staging: Path, longest: int) -> int:
    """Load the records staged so far (if any) and empty the staging file; returns the new longest (0)."""
    out.flush()
    if out.tell():
        load_staging(con, staging, longest)
        out.seek(0)
        out.truncate()
    return 0


def parquet_columns(con: duckdb.DuckDBPyConnection, location: str) -> list[str]:
    try:
        rows = con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [location]).fetchall()
        return [row[0] for row in rows]
    except duckdb.Error as err:
        raise DataError(location, f"cannot read parquet: {err}") from err


def ingest_parquet(con: duckdb.DuckDBPyConnection, item: Input, source: SourceSpec, first_id: int) -> int:
    """``raw`` += the rows of a parquet file, read by DuckDB (local path or ``hf://`` when online)."""
    if item.location.startswith(("hf://", "http://", "https://")):
        con.execute("INSTALL httpfs; LOAD httpfs")
    columns = parquet_columns(con, item.location)
    if source.text_field not in columns:
        raise DataError(item.location, f"no {source.text_field!r} column (columns: {', '.join(columns)})")
    field = source.score_field
    score = f'TRY_CAST("{field}" AS DOUBLE)' if field in columns else "NULL::DOUBLE"
    limit = f"LIMIT {int(item.limit)}" if item.limit else ""
    text = f'TRY_CAST("{source.text_field}" AS VARCHAR)'
    query = (
        f"INSERT INTO raw SELECT ? + row_number() OVER () - 1, ?, ?, {text}, {score}, "
        f"CASE WHEN {text} IS NULL THEN 'no_text' END FROM (SELECT * FROM read_parquet(?) {limit})"
    )
    try:
        inserted = con.execute(query, [first_id, source.label, item.location, item.location]).fetchone()[0]
    except duckdb.Error as err:
        raise DataError(item.location, f"cannot read parquet: {err}") from err
    return first_id + inserted


def ingest(con, recipe: Recipe, inputs: dict[str, list[Input]], workdir: Path, progress=None) -> int:
    """Stage 1: fill ``raw`` from every source's inputs; returns the number of documents in."""
    create_tables(con, recipe)
    staging = workdir / STAGING
    next_id, longest = 0, 0
    with open(staging, "w", encoding="utf-8") as out:
        for source in recipe.sources:
            for item in inputs[source.label]:
                if item.fmt == "parquet" and source.docs != "raw":
                    longest = flush_staging(con, out, staging, longest)  # raw stays in doc_id order
                    next_id = ingest_parquet(con, item, source, next_id)
                else:
                    records = python_records(item, source, recipe.filter.max_chars)
                    next_id, line = write_staging(out, records, source.label, item.location, next_id)
                    longest = max(longest, line)
                if progress is not None:
                    progress.update(1)
        flush_staging(con, out, staging, longest)
    staging.unlink()
    return con.execute("SELECT count(*) FROM raw").fetchone()[0]
