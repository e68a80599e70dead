"""Whole-call times of generate_batch on the GPU, call after call: what a call costs with its decoder kept
(euler_model's decode_batch.py) against a decoder made for every call, plain and speculative, one run.

For each batch size and precision (bf16, fp32): --calls calls in a row of B prompts (windows of
--prompts-from's val split, or random ids) with --new-tokens greedy tokens each (no stop token). "kept":
call 1 makes the decoder, call 2 also records the prompt pattern's prefill, later calls replay it.
"made each call": release_kept_decoders() before every call (every call pays the setup, as before the
decoders were kept). Printed: each call's milliseconds, the best of calls 3.. as tok/s, the drafts accepted,
and speculative / plain for both ways. Every call's tokens must equal the first plain call's (else it
stops with an error).

    python benchmarks/bench_generate_calls.py --checkpoint CKPT --prompts-from runs/data/DATASET
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import euler_kernels as ek
from euler_data.meta import open_split
from euler_model import (
    GenerationStats,
    generate_batch,
    init_params,
    load_checkpoint,
    preset,
    release_kept_decoders,
)

MODES = ("made each call", "kept")


def prompt_windows(rng, val, b: int, length: int, vocab_size: int) -> list[list[int]]:
    """b prompts of `length` ids: windows of the val tokens `val` at random starts, or random ids if None."""
    if val is None:
        return rng.integers(0, vocab_size, (b, length)).tolist()
    starts = rng.integers(0, len(val) - length, b)
    return [val[i : i + length].astype(np.int64).tolist() for i in starts]


def timed_calls(cfg, params, prompts, n: int, calls: int, mode: str, speculative: bool, want, precision):
    """Seconds of each call, the last call's stats and output (checked against `want` when given); the
    products computed in `precision` (an euler_kernels.Precision)."""
    times, out, stats = [], None, None
    release_kept_decoders()
    for _ in range(calls):
        if mode == "made each call":
            release_kept_decoders()
        stats = GenerationStats()
        start = time.perf_counter()
        kw = {"speculative": speculative, "stats": stats, "precision": precision}
        out = generate_batch(cfg, params, prompts, n, 0.0, **kw)
        times.append(time.perf_counter() - start)
        if want is not None and out != want:
            sys.exit(f"bench_generate_calls: {mode}, speculative={speculative}: tokens differ from greedy")
    return times, stats, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", help="model.safetensors of a trained model (default: gpu preset, random)")
    p.add_argument("--prompts-from", help="an euler-data dataset folder (prompts: windows of its val split)")
    p.add_argument("--batches", default="1,32")
    p.add_argument("--precisions", default="bf16,fp32")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=400)
    p.add_argument("--calls", type=int, default=6)
    args = p.parse_args()
    if args.calls < 3:
        p.error("--calls must be at least 3 (the best of calls 3.. is printed)")  # one line, exit 2
    try:
        products_of = {name: ek.Precision(name) for name in args.precisions.split(",")}
        cp = ek.require_cuda()
        if args.checkpoint:
            cfg, host, _ = load_checkpoint(args.checkpoint)
        else:
            cfg, host = preset("gpu"), init_params(preset("gpu"), seed=0)
        val = np.concatenate(open_split(args.prompts_from, "val")) if args.prompts_from else None
    except (OSError, RuntimeError, ValueError) as err:  # a bad precision, no GPU, a bad checkpoint or dataset
        p.error(str(err).splitlines()[0])
    params = {k: cp.asarray(v) for k, v in host.items()}
    rng = np.random.default_rng(0)
    n = args.new_tokens
    print(f"# {args.checkpoint or 'gpu preset, random weights'}, prompt {args.prompt_len}, new tokens {n}")
    for b in [int(x) for x in args.batches.split(",")]:
        prompts = prompt_windows(rng, val, b, args.prompt_len, cfg.vocab_size)
        for precision in args.precisions.split(","):
            products = products_of[precision]  # how the products are computed
            best, want = {}, None
            for mode in MODES:
                for speculative in (False, True):
                    run = (cfg, params, prompts, n, args.calls, mode, speculative, want, products)
                    times, stats, out = timed_calls(*run)
                    want = out if want is None else want
                    best[mode, speculative] = min(times[2:])
                    drafts = f", {stats.acceptance_rate:.0%} of drafts accepted" if speculative else ""
                    calls = " ".join(f"{t * 1e3:.1f}" for t in times)
                    print(
                        f"batch {b:3d} {precision} {mode:14s} {'spec ' if speculative else 'plain'}  ms: "
                        f"{calls}  best of 3..: {b * n / best[mode, speculative]:,.0f} tok/s{drafts}"
                    )
            for mode in MODES:
                ratio = best[mode, False] / best[mode, True]
                print(f"batch {b:3d} {precision} {mode:14s} speculative / plain: {ratio:.2f}x")


if __name__ == "__main__":
    main()
