"""End-to-end `prepare` on the mirror's books + web text: MB/s per stage and in total, and the
tokenization stage against tiktoken (GPT-2 encoding, one thread) on exactly the same text.

    python benchmarks/bench_data.py --mirror ../shared/data --reps 3 --json docs/benchmarks/data.json

Each repetition runs a full `prepare` into a fresh folder and then tiktoken on the pieces that run
tokenized, so the two sides alternate under the same machine load; medians are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
import psutil
import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

from euler_bpe import Tokenizer
from euler_data import Recipe, SourceSpec, prepare

GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def gpt2_encoding(mirror: Path) -> tiktoken.Encoding:
    """tiktoken's GPT-2 encoding built from the mirror's files (no network here)."""
    bpe = mirror / "gpt2_bpe"
    ranks = data_gym_to_mergeable_bpe_ranks(str(bpe / "vocab.bpe"), str(bpe / "encoder.json"))
    return tiktoken.Encoding("gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})


def recipe(mirror: Path, vocab_size: int) -> Recipe:
    manifest = json.loads((mirror / "gutenberg" / "manifest.json").read_text(encoding="utf-8"))
    ids = ",".join(str(entry["ebook_id"]) for entry in manifest)
    sources = (SourceSpec(f"gutenberg:{ids}"), SourceSpec(str(mirror / "web_text"), name="web_text"))
    return Recipe(sources=sources, vocab_size=vocab_size)


def input_bytes(mirror: Path) -> int:
    books = sum(p.stat().st_size for p in (mirror / "gutenberg").glob("*.txt"))
    return books + sum(p.stat().st_size for p in (mirror / "web_text").iterdir())


def pieces(folder: Path) -> list[str]:
    """The texts the tokenize stage encoded."""
    con = duckdb.connect(str(folder / "pipeline.duckdb"), read_only=True)
    texts = [t for (t,) in con.execute("SELECT text FROM pieces ORDER BY doc_id, part").fetchall()]
    con.close()
    return texts


def mb_per_s(encode, texts: list[str]) -> float:
    """Throughput of ``encode(text)`` over the texts, one thread."""
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    start = time.perf_counter()
    for text in texts:
        encode(text)
    return nbytes / 1e6 / (time.perf_counter() - start)


def one_rep(mirror: Path, vocab_size: int, enc: tiktoken.Encoding) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        meta = prepare(recipe(mirror, vocab_size), Path(tmp) / "out", mirror=mirror, quiet=True)
        total_s = time.perf_counter() - start
        texts = pieces(Path(tmp) / "out")
        tik = mb_per_s(enc.encode_ordinary, texts)
        ours_1 = mb_per_s(Tokenizer.load(Path(tmp) / "out" / "tokenizer.json").encode, texts)
    stages = {name: s["mb_per_s"] for name, s in meta["stages"].items()}
    return {"total_s": total_s, "stages": stages, "tiktoken": tik, "euler_1": ours_1, "meta": meta}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mirror", default=os.environ.get("EULER_DATA_MIRROR", "../shared/data"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    mirror = Path(args.mirror).resolve()
    enc = gpt2_encoding(mirror)
    load_before = os.getloadavg()
    reps = [one_rep(mirror, args.vocab_size, enc) for _ in range(args.reps)]
    mb_in = input_bytes(mirror) / 1e6
    med = lambda xs: statistics.median(xs)  # noqa: E731
    stages = {name: med([r["stages"][name] for r in reps]) for name in reps[0]["stages"]}
    ours, theirs = stages["tokenize"], med([r["tiktoken"] for r in reps])
    result = {
        "input_mb": round(mb_in, 2),
        "reps": args.reps,
        "total_s_median": round(med([r["total_s"] for r in reps]), 2),
        "total_mb_per_s": round(mb_in / med([r["total_s"] for r in reps]), 2),
        "stage_mb_per_s_median": stages,
        "tokenize_mb_per_s": {
            "euler tokenize stage (2 workers)": ours,
            "euler encode (1 thread, cold cache)": round(med([r["euler_1"] for r in reps]), 2),
            "tiktoken gpt2 (1 thread)": round(theirs, 2),
        },
        "tokenize_ratio": round(ours / theirs, 3),
        "tokens": reps[0]["meta"]["tokens"],
        "documents": {"in": reps[0]["meta"]["documents_in"], "kept": reps[0]["meta"]["documents_kept"]},
        "machine": {"cpus": psutil.cpu_count(), "load_before": load_before, "load_after": os.getloadavg()},
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
