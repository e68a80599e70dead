"""End-to-end `prepare` on the mirror's books + web text: MB/s per stage and in total, and the
tokenization stage against tiktoken (GPT-2 encoding, one thread) on exactly the same text.

    python benchmarks/bench_data.py --mirror ../shared/data --reps 3 --json docs/benchmarks/data.json

Each repetition runs a full `prepare` into a fresh folder and then tiktoken on the pieces that run
tokenized, so the two sides alternate under the same machine load; medians are reported.

``--scale 0.3,1,3 --work DIR``: FineWeb-Edu-shaped parquet of that many GB of text (``scale_corpus``,
built from the mirror's books) and ``euler-data prepare`` on it in a child process, polled four times
a second for the memory of its process tree (RSS and PSS: the forked workers share pages) and the disk
of its intermediates; then tiktoken (one thread), euler-bpe (one thread) and euler-bpe's
``encode_batch`` with 2 workers, interleaved three times on a 20 MB sample of the same text.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import psutil
import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks

from euler_bpe import Tokenizer
from euler_data import Recipe, SourceSpec, prepare

sys.path.insert(0, str(Path(__file__).parent))
import scale_corpus  # the sibling script

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
        out = Path(tmp) / "out"
        meta = prepare(recipe(mirror, vocab_size), out, mirror=mirror, quiet=True, keep_intermediate=True)
        total_s = time.perf_counter() - start
        texts = pieces(Path(tmp) / "out")
        tik = mb_per_s(enc.encode_ordinary, texts)
        ours_1 = mb_per_s(Tokenizer.load(Path(tmp) / "out" / "tokenizer.json").encode, texts)
    stages = {name: s["mb_per_s"] for name, s in meta["stages"].items()}
    return {"total_s": total_s, "stages": stages, "tiktoken": tik, "euler_1": ours_1, "meta": meta}


INTERMEDIATE = ("pipeline.duckdb", "pipeline.duckdb.wal", "duckdb_tmp", "pieces.tokens", "raw_staging.jsonl")


def folder_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (0 when it is gone)."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass
    return total


def tree_memory(proc: psutil.Process) -> tuple[int, int, int]:
    """(sum of RSS, sum of PSS, largest single RSS) over a process and its descendants."""
    rss = pss = top = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            info = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss, pss, top = rss + info.rss, pss + getattr(info, "pss", info.rss), max(top, info.rss)
    return rss, pss, top


def measure_prepare(source: Path, out: Path, vocab_size: int, extra: list[str]) -> dict:
    """Run ``euler-data prepare`` in a child process; peak memory, peak intermediate disk, wall time."""
    cmd = [sys.executable, "-m", "euler_data.cli", "prepare", "--source", str(source), "--out", str(out),
           "--vocab-size", str(vocab_size), "--quiet", *extra]  # fmt: skip
    start = time.perf_counter()
    proc = psutil.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = {"rss_tree": 0, "pss_tree": 0, "rss_one": 0, "disk": 0}
    while proc.poll() is None:
        rss, pss, one = tree_memory(proc)
        disk = sum(folder_bytes(out / name) for name in INTERMEDIATE)
        for key, value in zip(peak, (rss, pss, one, disk)):
            peak[key] = max(peak[key], value)
        time.sleep(0.25)
    wall = time.perf_counter() - start
    stdout, stderr = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"prepare failed ({proc.returncode}): {stderr.strip()[-2000:]}")
    # no ru_maxrss: a child's high-water mark starts at this process's RSS when it forks (2 GiB after
    # writing a 1 GB corpus here), and RUSAGE_CHILDREN keeps the maximum over every earlier point
    return {"wall_s": round(wall, 1), "peak": peak, "stdout": stdout.strip()}


def sample_text(folder: Path, mb: float = 20) -> list[str]:
    """The first documents of the parquet shards, about ``mb`` MB of text."""
    con = duckdb.connect()
    rows = con.execute(
        "SELECT text FROM read_parquet(?) LIMIT ?", [str(folder / "*.parquet"), int(mb * 1e6 / 4000)]
    ).fetchall()
    con.close()
    return [t for (t,) in rows]


def encoder_speeds(enc, tokenizer: Path, texts: list[str], reps: int) -> dict:
    """MB/s on the same texts, interleaved so that all see the same load (medians of ``reps``): tiktoken
    GPT-2 one thread, euler-bpe one thread, and ``encode_batch(workers=2, typecode="H")`` as the
    tokenize stage calls it (a freshly loaded tokenizer each time: cold word caches)."""
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    names = ("tiktoken_1thread", "euler_encode_1thread", "euler_batch_2workers")
    runs: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(reps):
        runs["tiktoken_1thread"].append(mb_per_s(enc.encode_ordinary, texts))
        runs["euler_encode_1thread"].append(mb_per_s(Tokenizer.load(tokenizer).encode, texts))
        tok = Tokenizer.load(tokenizer)
        start = time.perf_counter()
        tok.encode_batch(texts, workers=2, typecode="H")  # includes starting the two workers
        runs["euler_batch_2workers"].append(nbytes / 1e6 / (time.perf_counter() - start))
        tok.close()
    out = {f"{name}_mb_per_s": round(statistics.median(v), 2) for name, v in runs.items()}
    ratio = out["euler_batch_2workers_mb_per_s"] / out["tiktoken_1thread_mb_per_s"]
    out["batch_2workers_vs_tiktoken"] = round(ratio, 3)
    return out


def scale_point(mirror: Path, work: Path, gb: float, vocab_size: int, enc, extra: list[str]) -> dict:
    source = work / f"corpus_{gb:g}gb"
    if not source.is_dir():
        scale_corpus.write_corpus(mirror, source, gb * 1000)
    out = work / f"out_{gb:g}gb"
    shutil.rmtree(out, ignore_errors=True)
    run = measure_prepare(source, out, vocab_size, extra)
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    texts = sample_text(source)
    encoders = encoder_speeds(enc, out / "tokenizer.json", texts, reps=3)
    gib = 1 << 30
    return {
        "gb_text": gb,
        "parquet_mb": round(folder_bytes(source) / 1e6, 1),
        "wall_s": run["wall_s"],
        "peak_rss_tree_gib": round(run["peak"]["rss_tree"] / gib, 3),
        "peak_pss_tree_gib": round(run["peak"]["pss_tree"] / gib, 3),
        "peak_rss_one_process_gib": round(run["peak"]["rss_one"] / gib, 3),
        "peak_intermediate_disk_mb": round(run["peak"]["disk"] / 1e6, 1),
        "final_db_mb": round(folder_bytes(out / "pipeline.duckdb") / 1e6, 1),
        "tokens": meta["tokens"],
        "shards": {split: len(files) for split, files in meta["shards"].items()},
        "documents": {"in": meta["documents_in"], "kept": meta["documents_kept"]},
        "stages": {name: s["seconds"] for name, s in meta["stages"].items()},
        "tokenize_mb_per_s": meta["stages"]["tokenize"]["mb_per_s"],
        **encoders,
        "load_after": os.getloadavg(),
    }


def main_scale(args) -> None:
    mirror, work = Path(args.mirror).resolve(), Path(args.work)
    enc = gpt2_encoding(mirror)
    extra = ["--workers", str(args.workers)]
    points = []
    for gb in (float(x) for x in args.scale.split(",")):
        points.append(scale_point(mirror, work, gb, args.vocab_size, enc, extra))
        print(json.dumps(points[-1]), flush=True)
        if not args.keep_outputs:
            shutil.rmtree(work / f"out_{gb:g}gb", ignore_errors=True)
    result = {"points": points, "machine": {"cpus": psutil.cpu_count(), "load_before": args.load_before}}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mirror", default=os.environ.get("EULER_DATA_MIRROR", "../shared/data"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--scale", help="comma-separated GB of text, e.g. 0.3,1,3: the scaling benchmark")
    parser.add_argument("--work", default="/tmp/euler-data-scale", help="--scale: corpora and outputs here")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--keep-outputs", action="store_true", help="--scale: keep each prepared folder")
    args = parser.parse_args()
    if args.scale:
        args.load_before = os.getloadavg()
        main_scale(args)
        return
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
