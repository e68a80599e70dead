"""FineWeb-Edu-shaped parquet from the mirror's real text, for ``bench_data.py --scale``.

Columns as FineWeb-Edu has them: ``text, id, url, score, int_score, token_count``. Each document is a
seeded run of 3 to 40 consecutive paragraphs of one of the mirror's Project Gutenberg books, so the
text is real prose and nearly every document is distinct. The folder holds shards of about
``shard_mb`` of text (``000_00000.parquet``, ...), as FineWeb-Edu's ``sample/10BT/`` does.

    python benchmarks/scale_corpus.py --mirror ../shared/data --mb 300 --out /tmp/scale/0.3gb
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import duckdb
import numpy as np

PARAGRAPH = re.compile(r"\n\s*\n")


def book_paragraphs(mirror: Path) -> list[list[str]]:
    """Each book's paragraphs (at least 40 characters each)."""
    books = []
    for path in sorted((mirror / "gutenberg").glob("*.txt")):
        text = path.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
        paras = [p.strip() for p in PARAGRAPH.split(text) if len(p.strip()) >= 40]
        if len(paras) > 50:
            books.append(paras)
    return books


def documents(books: list[list[str]], rng: np.random.Generator, nbytes: int):
    """Yield documents until about ``nbytes`` of UTF-8 text."""
    total = 0
    while total < nbytes:
        paras = books[int(rng.integers(len(books)))]
        length = int(rng.integers(3, 41))
        first = int(rng.integers(0, len(paras) - length))
        doc = "\n\n".join(paras[first : first + length])
        total += len(doc.encode("utf-8"))
        yield doc


def write_shard(path: Path, docs: list[str], first_id: int, rng: np.random.Generator) -> None:
    """One parquet shard with FineWeb-Edu's columns (scores drawn like its 0-5 classifier scores)."""
    score = rng.uniform(2.5, 5.0, size=len(docs)).tolist()
    ids = [f"<urn:uuid:{first_id + i:012d}>" for i in range(len(docs))]
    urls = [f"https://example.org/doc/{first_id + i}" for i in range(len(docs))]
    con = duckdb.connect()
    con.execute("SET preserve_insertion_order = true")
    con.execute(
        "CREATE TABLE t AS SELECT unnest(?::VARCHAR[]) AS text, unnest(?::VARCHAR[]) AS id, "
        "unnest(?::VARCHAR[]) AS url, unnest(?::DOUBLE[]) AS score",
        [docs, ids, urls, score],
    )
    con.execute(
        f"COPY (SELECT text, id, url, score, round(score)::BIGINT AS int_score, "
        f"(strlen(text) // 4)::BIGINT AS token_count FROM t) TO '{path}' "
        "(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 10000)"
    )
    con.close()


def write_corpus(mirror: Path, out: Path, mb: float, shard_mb: float = 250, seed: int = 0) -> int:
    """Write the shards; returns the UTF-8 bytes of text written."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    books = book_paragraphs(mirror)
    shard, size, total, first_id, n = [], 0, 0, 0, 0
    for doc in documents(books, rng, int(mb * 1e6)):
        shard.append(doc)
        size += len(doc.encode("utf-8"))
        if size >= shard_mb * 1e6:
            write_shard(out / f"000_{n:05d}.parquet", shard, first_id, rng)
            first_id, n, total, shard, size = first_id + len(shard), n + 1, total + size, [], 0
    if shard:
        write_shard(out / f"000_{n:05d}.parquet", shard, first_id, rng)
        total += size
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mirror", default="../shared/data")
    parser.add_argument("--mb", type=float, required=True, help="MB of text to write")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    total = write_corpus(Path(args.mirror), Path(args.out), args.mb)
    print(f"wrote {args.out}: {total / 1e6:.1f} MB of text")


if __name__ == "__main__":
    main()
