"""The pipeline's persistent DuckDB database: one file per output folder, one table per stage."""

from __future__ import annotations

from pathlib import Path

import duckdb

DB_NAME = "pipeline.duckdb"


def connect(folder: str | Path) -> duckdb.DuckDBPyConnection:
    """Open (or create) ``folder/pipeline.duckdb``; every stage reads and writes tables there.

    >>> con = connect(tmp_path)  # doctest: +SKIP
    >>> con.sql("SHOW TABLES").fetchall()  # doctest: +SKIP
    [('raw',), ('clean',), ...]
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(folder / DB_NAME))
    con.execute("SET preserve_insertion_order = true")
    return con


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None):
    """The single value a query returns."""
    return con.execute(sql, params or []).fetchone()[0]
