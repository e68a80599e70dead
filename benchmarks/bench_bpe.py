"""euler-bpe side by side with tiktoken (encoding) and HF tokenizers (training), on the same text.

    python benchmarks/bench_bpe.py [--data ../shared/data] [--reps 3] [--json out.json]

Encoding: all Gutenberg books of the data mirror (27 MB), GPT-2's merges, every id checked equal.
Training: vocab 4096 on the first 10 MB of the books; peak memory: training on all 27 MB in a fresh
process (ru_maxrss). Runs are interleaved, medians reported.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import tiktoken
import tokenizers
from tokenizers import models, pre_tokenizers, trainers

from euler_bpe import GPT2_PATTERN, Tokenizer

REPO = Path(__file__).resolve().parents[1]


def load_books(data: Path) -> list[str]:
    return [p.read_text(encoding="utf-8") for p in sorted((data / "gutenberg").glob("*.txt"))]


def gpt2_pair(data: Path) -> tuple[Tokenizer, tiktoken.Encoding]:
    ours = Tokenizer.from_gpt2(data / "gpt2_bpe" / "vocab.bpe", data / "gpt2_bpe" / "encoder.json")
    ranks = {ours.token_bytes(i): i for i in range(ours.vocab_size) if i != 50256}
    ref = tiktoken.Encoding(
        name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256}
    )
    return ours, ref


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the encode_batch workers)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def timed(fn):
    """(wall seconds, CPU seconds, result) of fn()."""
    start, cpu = time.perf_counter(), cpu_seconds()
    out = fn()
    return time.perf_counter() - start, cpu_seconds() - cpu, out


def encode_runs(data: Path, books: list[str]) -> tuple[dict, object]:
    """The encoders to time (functions of no arguments) on fresh GPT-2 tokenizers (empty caches),
    and a function that makes the first call of the "_warm" pool and returns how to close it."""
    ours, ref = gpt2_pair(data)
    other, kept = gpt2_pair(data)[0], gpt2_pair(data)[0]
    return {
        "tiktoken_1_thread": lambda: [ref.encode_ordinary(b) for b in books],
        "ours_1_process_cold": lambda: [ours.encode(b) for b in books],
        "ours_1_process_warm": lambda: [ours.encode(b) for b in books],
        # Workers start with empty caches; close() joins them, so that their CPU time is counted.
        "ours_encode_batch_2_workers_cold": lambda: (other.encode_batch(books, workers=2), other.close())[0],
        # A second call on the same pool (as euler-data makes them): the workers' caches are warm.
        "ours_encode_batch_2_workers_warm": lambda: kept.encode_batch(books, workers=2),
        "tiktoken_batch_2_threads": lambda: ref.encode_ordinary_batch(books, num_threads=2),
    }, lambda: (kept.encode_batch(books, workers=2), kept.close)[1]


def bench_encode(data: Path, books: list[str], reps: int) -> dict:
    """MB/s: tiktoken 1 thread, ours cold (fresh cache) and warm, ours encode_batch 2 workers."""
    mb = sum(len(b.encode("utf-8")) for b in books) / 1e6
    times: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for rep in range(reps):
        results = {}
        runs, warm_up = encode_runs(data, books)
        close = warm_up()  # the first encode_batch call of the pool used by the "_warm" run
        for name, fn in runs.items():
            seconds, cpu_s, results[name] = timed(fn)
            times.setdefault(name, []).append(seconds)
            cpu.setdefault(name, []).append(cpu_s)
        close()
        if rep == 0:
            expected = results["tiktoken_1_thread"]
            assert all(r == expected for r in results.values()), "ids differ from tiktoken"
            n_tokens = sum(map(len, expected))
        print(f"  encode rep {rep}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()), flush=True)
    speed = {k: mb / statistics.median(v) for k, v in times.items()}
    ref_speed = speed["tiktoken_1_thread"]
    return {
        "megabytes": round(mb, 2),
        "tokens": n_tokens,
        "MB_per_s": {k: round(v, 2) for k, v in speed.items()},
        "wall_seconds_median": {k: round(statistics.median(v), 2) for k, v in times.items()},
        "cpu_seconds_median": {k: round(statistics.median(v), 2) for k, v in cpu.items()},
        "ratio_1_process_cold": round(speed["ours_1_process_cold"] / ref_speed, 3),
        "ratio_1_process_warm": round(speed["ours_1_process_warm"] / ref_speed, 3),
        "ratio_batch_2_workers_cold": round(speed["ours_encode_batch_2_workers_cold"] / ref_speed, 3),
        "ratio_batch_2_workers_warm": round(speed["ours_encode_batch_2_workers_warm"] / ref_speed, 3),
        "note": "cpu_seconds of the _warm batch run count no worker time (its workers end later)",
    }


def hf_train(text: str, vocab_size: int) -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([text[i : i + (1 << 20)] for i in range(0, len(text), 1 << 20)], trainer)
    return tok


def bench_train(books: list[str], reps: int, vocab_size: int = 4096, size: int = 10_000_000) -> dict:
    text = "".join(books)[:size]
    times: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}  # HF's threads are in process_time too
    for rep in range(reps):
        runs = {
            "hf_tokenizers_BpeTrainer": lambda: hf_train(text, vocab_size),
            "ours_1_process": lambda: Tokenizer.train([text], vocab_size),
            "ours_2_workers": lambda: Tokenizer.train([text], vocab_size, workers=2),
        }
        for name, fn in runs.items():
            seconds, cpu_s, tok = timed(fn)
            times.setdefault(name, []).append(seconds)
            cpu.setdefault(name, []).append(cpu_s)
            vocab = tok.get_vocab_size() if isinstance(tok, tokenizers.Tokenizer) else tok.vocab_size
        print(f"  train rep {rep}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    hf = med["hf_tokenizers_BpeTrainer"]
    return {
        "megabytes": round(len(text.encode("utf-8")) / 1e6, 2),
        "vocab_size": vocab,
        "seconds": {k: round(v, 2) for k, v in med.items()},
        "cpu_seconds_median": {k: round(statistics.median(v), 2) for k, v in cpu.items()},
        "ratio_1_process": round(med["ours_1_process"] / hf, 2),
        "ratio_2_workers": round(med["ours_2_workers"] / hf, 2),
    }


PEAK = """
import json, sys, time
from pathlib import Path
books = [p for p in sorted(Path(sys.argv[1], "gutenberg").glob("*.txt"))]
which = sys.argv[2]
start = time.perf_counter()
if which == "ours":
    from euler_bpe import Tokenizer
    Tokenizer.train(books, vocab_size=4096)
elif which == "hf":
    import tokenizers
    from tokenizers import models, pre_tokenizers, trainers
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=4096, initial_alphabet=alphabet, show_progress=False)
    tok.train([str(b) for b in books], trainer)
else:
    import euler_bpe, tokenizers
seconds = time.perf_counter() - start
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent through fork and exec.
status = Path("/proc/self/status").read_text().splitlines()
peak = int(next(line for line in status if line.startswith("VmHWM")).split()[1]) / 1024
print(json.dumps({"seconds": round(seconds, 2), "max_rss_MB": round(peak, 1)}))
"""


def bench_peak_memory(data: Path) -> dict:
    """Peak RSS (VmHWM) of training to 4096 on all books, each in a fresh process (baseline: imports)."""
    out = {}
    for which in ("baseline", "ours", "hf"):
        done = subprocess.run([sys.executable, "-c", PEAK, str(data), which], capture_output=True, text=True)
        out[which] = json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-500:]}
        print(f"  peak memory {which}: {out[which]}", flush=True)
    return out


def main() -> None:
    default = Path(os.environ.get("EULER_DATA_MIRROR", REPO.parent / "shared" / "data"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=default)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--skip", nargs="*", default=[], choices=["encode", "train", "memory"])
    args = parser.parse_args()
    books = load_books(args.data)
    report = {"cpu_count": os.cpu_count(), "load_average_before": os.getloadavg()}
    if "encode" not in args.skip:
        report["encode"] = bench_encode(args.data, books, args.reps)
    if "train" not in args.skip:
        report["train"] = bench_train(books, args.reps)
    if "memory" not in args.skip:
        report["peak_memory_train_27MB"] = bench_peak_memory(args.data)
    report["load_average_after"] = os.getloadavg()
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
