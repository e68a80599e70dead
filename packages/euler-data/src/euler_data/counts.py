"""What ``meta.json`` holds, counted by SQL over the pipeline tables.

Bits per byte of a split: ``mean_loss_nats * tokens[split] / (ln 2 * bytes[split])``; ``tokens`` include
the ``<|endoftext|>`` after each document, ``bytes`` are the UTF-8 bytes of the documents' text (of a
raw source, the files' bytes).
"""

from __future__ import annotations

from typing import Any

import duckdb

from euler_data.raw_bytes import bytes_sql


def drop_counts(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """reason -> documents dropped, over every stage (ingest, filter, dedup)."""
    rows = con.execute(
        "SELECT reason, count(*) FROM deduped WHERE reason IS NOT NULL GROUP BY reason ORDER BY reason"
    ).fetchall()
    return dict(rows)


def per_source(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, Any]]:
    """source -> spec, weight, documents in/kept, drops, and documents/bytes/tokens per split."""
    out: dict[str, dict[str, Any]] = {}
    for source, spec, weight, mode in con.execute(
        "SELECT source, spec, weight, split_mode FROM sources ORDER BY source"
    ).fetchall():
        out[source] = {"spec": spec, "weight": weight, "split": mode, "documents_in": 0, "dropped": {}}
    for source, n_in, n_kept in con.execute(
        "SELECT source, count(*), count(*) FILTER (WHERE reason IS NULL) FROM deduped GROUP BY source"
    ).fetchall():
        out[source].update(documents_in=n_in, documents_kept=n_kept)
    for source, reason, n in con.execute(
        "SELECT source, reason, count(*) FROM deduped WHERE reason IS NOT NULL GROUP BY ALL ORDER BY ALL"
    ).fetchall():
        out[source]["dropped"][reason] = n
    for source, split, docs, nbytes, tokens in con.execute(
        f"""SELECT p.source, m.split, count(*), sum({bytes_sql("p.text", "s.raw")}), sum(t.tokens + 1)
        FROM mixed m JOIN pieces p USING (doc_id, part) JOIN tokenized t USING (doc_id, part)
        JOIN sources s ON s.source = p.source GROUP BY ALL ORDER BY ALL"""
    ).fetchall():
        out[source][split] = {"documents": docs, "bytes": int(nbytes), "tokens": int(tokens)}
    return out


def split_totals(sources: dict[str, dict[str, Any]], key: str) -> dict[str, int]:
    """Sum ``key`` ("documents", "bytes", "tokens") over sources, per split."""
    return {s: sum(v.get(s, {}).get(key, 0) for v in sources.values()) for s in ("train", "val")}


def build_meta(con: duckdb.DuckDBPyConnection, tok, extra: dict[str, Any]) -> dict[str, Any]:
    """The meta.json dict (see the module docstring and the README for every key)."""
    sources = per_source(con)
    n_in = con.execute("SELECT count(*) FROM deduped").fetchone()[0]  # every document in, kept or not
    n_kept = con.execute("SELECT count(*) FROM deduped WHERE reason IS NULL").fetchone()[0]
    return {
        "format": "euler-data/1",
        "dtype": "uint16",
        "documents_in": n_in,
        "documents_kept": n_kept,
        "dropped": drop_counts(con),
        "documents": split_totals(sources, "documents"),
        "bytes": split_totals(sources, "bytes"),
        "tokens": split_totals(sources, "tokens"),
        "sources": sources,
        "tokenizer": tok.kind,  # "bytes" (the byte tokenizer) or "bpe"
        "tokenizer_fingerprint": tok.fingerprint,
        "vocab_size": tok.vocab_size,
        "special_tokens": dict(tok.special_tokens),
        "eot_id": tok.special_tokens["<|endoftext|>"],
        **extra,
    }
