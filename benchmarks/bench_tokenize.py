"""The tokenize stage of `euler-data prepare` against tiktoken (GPT-2, one thread) on the same text.

    hatch run bench:python -m euler_data.cli prepare --source CORPUS --out DIR --keep-intermediate --quiet
    hatch run bench:python benchmarks/bench_tokenize.py --folder DIR --mirror ../shared/data --reps 3

``DIR`` is a folder that ``prepare --keep-intermediate`` wrote (its ``pipeline.duckdb`` keeps every
table). Each repetition, interleaved so that all see the same load: tiktoken ``encode_ordinary`` over
every piece the stage encodes, one thread; then the stage itself in a child process on a copy of the
database: the tokenizer is trained as stage 7 trains it (untimed; in a fresh run stage 8 gets it with
its word cache warmed from training), then stage 8 as the pipeline runs it (``encode_pieces`` with
``--workers`` processes and the shards written) is timed. The stage's ``pieces.tokens`` must equal the
one in ``DIR`` byte for byte (the ids did not change), else the script stops. Medians are reported,
with the load average before and after each measurement.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).parent))
from bench_data import gpt2_encoding  # the sibling script


def piece_texts(folder: Path) -> list[str]:
    """The texts stage 8 encodes (raw sources are encoded from bytes; this corpus has none)."""
    con = duckdb.connect(str(folder / "pipeline.duckdb"), read_only=True)
    texts = [t for (t,) in con.execute("SELECT text FROM pieces ORDER BY doc_id, part").fetchall()]
    con.close()
    return texts


def run_stage(work: Path, workers: int, cold: bool) -> dict:
    """In this (child) process: stage 7's tokenizer, then stage 8 timed, as ``pipeline._tokenize`` runs it."""
    from euler_data import Recipe, shards
    from euler_data import tokenizer as tokenizer_stage
    from euler_data.db import connect

    con = connect(work)
    tok = tokenizer_stage.load_tokenizer(work / "tokenizer.json")  # a resumed run's: word cache empty
    if not cold:
        saved, tok = tok, tokenizer_stage.train_tokenizer(con, tok.vocab_size, Recipe.tokenizer_sample_bytes)
        if tok != saved:
            raise SystemExit("the tokenizer trained again differs from tokenizer.json (another recipe?)")
    nbytes = con.execute("SELECT sum(strlen(text)) FROM pieces").fetchone()[0]
    con.close()
    start = time.perf_counter()
    shards.encode_pieces(work, tok, workers)
    con = connect(work)
    shards.tokenize(con, tok, work, None)
    seconds = time.perf_counter() - start
    con.close()
    return {"seconds": seconds, "mb": nbytes / 1e6}


def stage_once(folder: Path, work: Path, workers: int, cold: bool, src: str | None = None) -> dict:
    """The stage in a fresh child process on a copy of ``folder``'s database (``src``: import euler-bpe
    from that source folder instead)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    shutil.copy(folder / "pipeline.duckdb", work / "pipeline.duckdb")
    shutil.copy(folder / "tokenizer.json", work / "tokenizer.json")
    con = duckdb.connect(str(work / "pipeline.duckdb"))
    con.execute("DROP TABLE IF EXISTS tokenized")  # from the run that wrote folder: start the stage afresh
    con.close()
    cmd = [sys.executable, __file__, "--run-stage", str(work), "--workers", str(workers)]
    env = {**os.environ, "PYTHONPATH": src} if src else None
    out = subprocess.run(
        cmd + (["--cold"] if cold else []), check=True, capture_output=True, text=True, env=env
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not filecmp.cmp(work / "pieces.tokens", folder / "pieces.tokens", shallow=False):
        raise SystemExit(f"the stage's {work / 'pieces.tokens'} differs from {folder / 'pieces.tokens'}")
    return result


def tiktoken_once(enc, texts: list[str], nbytes: int) -> float:
    start = time.perf_counter()
    for text in texts:
        enc.encode_ordinary(text)
    return nbytes / 1e6 / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folder", help="a folder written by `euler-data prepare --keep-intermediate`")
    parser.add_argument("--mirror", default=os.environ.get("EULER_DATA_MIRROR", "../shared/data"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cold", action="store_true", help="load tokenizer.json (a resumed run) instead")
    parser.add_argument("--work", default="/tmp/euler-bench-tokenize", help="scratch copy of the database")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--baseline-src",
        help="also run the stage importing euler-bpe from this folder (e.g. an older commit's "
        "packages/euler-bpe/src from git archive), interleaved: before/after on the same load",
    )
    parser.add_argument("--run-stage", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.run_stage:
        print(json.dumps(run_stage(Path(args.run_stage), args.workers, args.cold)))
        return
    folder = Path(args.folder)
    enc = gpt2_encoding(Path(args.mirror).resolve())
    texts = piece_texts(folder)
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    runs: dict[str, list] = {"tiktoken_mb_per_s": [], "stage_mb_per_s": [], "load": []}
    if args.baseline_src:
        runs["baseline_stage_mb_per_s"] = []
    for _ in range(args.reps):
        load = [os.getloadavg()[0]]
        runs["tiktoken_mb_per_s"].append(round(tiktoken_once(enc, texts, nbytes), 2))
        load.append(os.getloadavg()[0])
        stage = stage_once(folder, Path(args.work), args.workers, args.cold)
        runs["stage_mb_per_s"].append(round(stage["mb"] / stage["seconds"], 2))
        if args.baseline_src:
            base = stage_once(folder, Path(args.work), args.workers, args.cold, args.baseline_src)
            runs["baseline_stage_mb_per_s"].append(round(base["mb"] / base["seconds"], 2))
        runs["load"].append([*load, os.getloadavg()[0]])
        print(json.dumps({k: v[-1] for k, v in runs.items()}), flush=True)
    shutil.rmtree(args.work, ignore_errors=True)
    tik, ours = (statistics.median(runs[k]) for k in ("tiktoken_mb_per_s", "stage_mb_per_s"))
    result = {
        "mb": round(nbytes / 1e6, 2),
        "workers": args.workers,
        "cold_cache": args.cold,
        **runs,
        "tiktoken_median": tik,
        "stage_median": ours,
        "stage_vs_tiktoken": round(ours / tik, 3),
        "ratio_per_rep": [round(s / t, 3) for s, t in zip(runs["stage_mb_per_s"], runs["tiktoken_mb_per_s"])],
        "cpus": os.cpu_count(),
        **(
            {"baseline_median": statistics.median(runs["baseline_stage_mb_per_s"])}
            if args.baseline_src
            else {}
        ),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
