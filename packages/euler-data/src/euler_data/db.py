"""The pipeline's persistent DuckDB database: one file per output folder, one table per stage.

Every connection runs under an explicit ``memory_limit`` (``MEMORY_LIMIT``, or the environment variable
``EULER_DATA_MEMORY_LIMIT``, e.g. ``4GB``) and spills what does not fit to ``DIR/duckdb_tmp/``, so a
stage's memory does not grow with the corpus (DuckDB's own default is 80% of the machine's RAM).

The file is attached with row groups of ``ROW_GROUP_SIZE`` rows (DuckDB's default is 122,880). DuckDB
writes a table's finished row groups straight into the file, compressed; rows of an unfinished one wait
and reach the write-ahead log uncompressed at commit. A corpus has few rows of long text (300 MB of
web documents is ~35,000 rows), so with the default a stage's whole output would go through the WAL, as
large as the text itself, besides the compressed input table.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import duckdb

from euler_data.dataset_folder import DB_NAME

TEMP_NAME = "duckdb_tmp"
MEMORY_LIMIT = "1GB"  # DuckDB's buffer pool; sorts, joins and windows spill beyond it
ROW_GROUP_SIZE = 2048  # rows (DuckDB's vector size, its smallest): tens of MB of documents
ALIAS = "pipeline"  # the attached file's name in SQL


def connect(folder: str | Path) -> duckdb.DuckDBPyConnection:
    """Open (or create) ``folder/pipeline.duckdb``; every stage reads and writes tables there.

    >>> con = connect(tmp_path)  # doctest: +SKIP
    >>> con.sql("SHOW TABLES").fetchall()  # doctest: +SKIP
    [('raw',), ('clean',), ...]
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    limit = os.environ.get("EULER_DATA_MEMORY_LIMIT") or MEMORY_LIMIT
    config = {"memory_limit": limit, "temp_directory": str(folder / TEMP_NAME)}
    try:
        con = duckdb.connect(config=config)
    except duckdb.Error as err:
        if "memory" in str(err).lower():
            raise ValueError(f"EULER_DATA_MEMORY_LIMIT={limit!r}: {str(err).splitlines()[0]}") from err
        raise
    attach(con, folder / DB_NAME, ALIAS)
    con.execute(f"USE {ALIAS}")
    con.execute("SET preserve_insertion_order = true")
    return con


def attach(con: duckdb.DuckDBPyConnection, path: Path, alias: str) -> None:
    """Attach a database file as ``alias``, with the pipeline's row groups (see the module's note)."""
    quoted = str(path).replace("'", "''")
    con.execute(f"ATTACH '{quoted}' AS {alias} (ROW_GROUP_SIZE {ROW_GROUP_SIZE})")


def rewrite(folder: str | Path, tables: dict[str, str]) -> None:
    """Replace ``folder/pipeline.duckdb`` by a fresh file holding only ``tables`` (name -> the columns
    to keep, SQL), in their stored order: DuckDB reuses a dropped table's blocks but never gives them
    back to the disk. A kill or an error (a full disk) before the final rename leaves the old file whole."""
    db, fresh = Path(folder) / DB_NAME, Path(folder) / f"{DB_NAME}.compact"
    _remove_db(fresh)  # what a failed rewrite left
    con = connect(folder)
    try:
        attach(con, fresh, "fresh")
        for table, columns in tables.items():
            con.execute(f"CREATE TABLE fresh.{table} AS SELECT {columns} FROM {table}")
        con.execute("CHECKPOINT fresh")  # into the file itself, raising if it cannot (a full disk)
    except BaseException:
        con.close()
        _remove_db(fresh)
        raise
    con.close()
    fresh.replace(db)
    Path(f"{db}.wal").unlink(missing_ok=True)


def _remove_db(path: Path) -> None:
    """Delete a database file and its write-ahead log."""
    for name in (path, Path(f"{path}.wal")):
        name.unlink(missing_ok=True)


def remove_temp(folder: str | Path) -> None:
    """Remove the spill folder (DuckDB leaves it behind when a process is killed)."""
    shutil.rmtree(Path(folder) / TEMP_NAME, ignore_errors=True)


def sql_literal(value) -> str:
    """A Python value as a SQL literal (strings quoted, None as NULL)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(float(value))
    return "'" + str(value).replace("'", "''") + "'"


def source_attr(con: duckdb.DuckDBPyConnection, column: str, name: str = "source") -> str:
    """SQL for the ``sources`` table's ``column`` of each row's source, as a CASE over literals.

    A join with ``sources`` would do the same, but a projection keeps the rows streaming in their stored
    (doc_id) order, so the big text tables need no sort.
    """
    rows = con.execute(f"SELECT source, {column} FROM sources ORDER BY source").fetchall()
    whens = " ".join(f"WHEN {sql_literal(s)} THEN {sql_literal(v)}" for s, v in rows)
    return f"(CASE {name} {whens} END)" if rows else "NULL"


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None):
    """The single value a query returns."""
    return con.execute(sql, params or []).fetchone()[0]
