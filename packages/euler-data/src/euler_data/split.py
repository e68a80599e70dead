"""Stage 5, split: ``deduped`` -> ``pieces``, each kept document to train or val, deterministically.

Hash split: ``u = md5_number_upper(seed:hash) / 2**64``, val when ``u < val_fraction``; if that leaves
val empty while there are two or more documents, the one with the smallest ``u`` goes to val. Position
split (Tiny Shakespeare, one document): the first ``1 - val_fraction`` of its characters go to train,
the rest to val, as nanoGPT does. ``pieces(doc_id, part, source, split, text)``; ``part`` is 0, or 1
for the val half of a position split.
"""

from __future__ import annotations

import duckdb

from euler_data.db import source_attr

UNIT = "(md5_number_upper(? || ':' || hash)::DOUBLE / 18446744073709551616.0)"  # in [0, 1)


def split(con: duckdb.DuckDBPyConnection, val_fraction: float, seed: int) -> dict[str, int]:
    """Stage 5: fill ``pieces``; returns the number of pieces per split.

    Each kept document becomes a list of its pieces, unnested in place: ``pieces`` comes out in
    (doc_id, part) order as a projection of ``deduped``, with no sort of the text.
    """
    f = float(val_fraction)
    mode = source_attr(con, "split_mode", "source")
    u_min, n = con.execute(
        f"SELECT min({UNIT}), count(*) FROM deduped WHERE reason IS NULL AND {mode} = 'hash'", [str(seed)]
    ).fetchone()
    lone = f > 0 and n > 1 and u_min >= f  # no document drew val: the one with the smallest u goes there
    smallest = f"{UNIT} = '{u_min!r}'::DOUBLE" if lone else "false"  # repr: the exact double
    hash_split = f"CASE WHEN {UNIT} < {f} OR {smallest} THEN 'val' ELSE 'train' END"
    cut = f"floor(length(text) * (1 - {f}))::BIGINT"
    con.execute(
        f"""CREATE OR REPLACE TABLE pieces AS
        SELECT doc_id, part, source, split, text FROM (
            SELECT doc_id, source, unnest(CASE WHEN {mode} = 'hash'
                THEN [{{'part': 0, 'split': {hash_split}, 'text': text}}]
                ELSE list_filter(
                    [{{'part': 0, 'split': 'train', 'text': substr(text, 1, {cut})}},
                     {{'part': 1, 'split': 'val', 'text': substr(text, {cut} + 1)}}],
                    lambda x: x.part = 0 OR {cut} < length(text))
            END, recursive := true)
            FROM deduped WHERE reason IS NULL
        )""",
        [str(seed)] * hash_split.count("?"),
    )
    rows = con.execute("SELECT split, count(*) FROM pieces GROUP BY split").fetchall()
    return {"train": 0, "val": 0, **dict(rows)}
