"""Speculative generate_batch against plain greedy for each draft tree, over many prompts, on the GPU: how
much each tree pays on a trained model, and whether its tokens stay plain greedy's.

For each checkpoint, dataset (--prompts-from; prompts are windows of its val split) and precision: --prompts
single-prompt calls of --new-tokens greedy tokens. Each call is timed plain and with every draft tree of
--trees (best of --repeats after one warm-up; the decoders are kept across calls). Printed per tree: the
median ratio speculative / plain over the prompts with its range, the share of drafts accepted, tokens per
forward, and in how many prompts the tokens equal plain greedy's.

    python benchmarks/bench_draft_trees.py CKPT [CKPT ...] --prompts-from runs/data/DATASET [...]
    python benchmarks/bench_draft_trees.py CKPT --prompts-from D --trees "0;0,1;0,1,0"   # chains 1-2, a tree
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import euler_kernels as ek
from euler_data.meta import open_split
from euler_model import GenerationStats, generate_batch, load_checkpoint, release_kept_decoders
from euler_model.decode_step import checked_draft_tree


def best_call(cfg, params, prompts, n: int, repeats: int, **kw):
    """(best seconds of `repeats` calls after one warm-up, the tokens, the last call's stats)."""
    times, out, stats = [], None, None
    for _ in range(repeats + 1):
        stats = GenerationStats()
        start = time.perf_counter()
        out = generate_batch(cfg, params, prompts, n, 0.0, stats=stats, **kw)
        times.append(time.perf_counter() - start)
    return min(times[1:]), out, stats


def parse_trees(text: str) -> list[tuple[int, ...]]:
    """'0;0,1' -> [(0,), (0, 1)]: draft trees as parents lists, separated by ';'."""
    return [tuple(int(p) for p in tree.split(",")) for tree in text.split(";")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoints", nargs="+", help="model.safetensors files of trained models")
    p.add_argument("--prompts-from", nargs="+", required=True, help="euler-data dataset folders")
    p.add_argument("--trees", default="0;0,1;0,1,2", help="';'-separated draft trees ('0,1,2': a chain of 3)")
    p.add_argument("--precisions", default="bf16")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=400)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    try:
        products_of = {name: ek.Precision(name) for name in args.precisions.split(",")}
        trees = parse_trees(args.trees)
        cp = ek.require_cuda()
        models = [load_checkpoint(path)[:2] for path in args.checkpoints]
        for cfg, _ in models:
            for tree in trees:
                checked_draft_tree(cfg, tree)
        vals = [np.concatenate(open_split(folder, "val")) for folder in args.prompts_from]
    except (OSError, RuntimeError, ValueError) as err:  # a bad precision or tree, no GPU, a missing file
        p.error(str(err).splitlines()[0])  # one line, exit 2
    n = args.new_tokens
    print(f"# {args.prompts} prompts of {args.prompt_len} tokens, {n} new tokens, best of {args.repeats}")
    for path, (cfg, host) in zip(args.checkpoints, models, strict=True):
        params = {k: cp.asarray(v) for k, v in host.items()}
        kind = "conditioned heads" if cfg.mtp_conditioned else "plain heads"
        for folder, val in zip(args.prompts_from, vals, strict=True):
            for precision in args.precisions.split(","):
                products = products_of[precision]  # how the products are computed
                starts = np.random.default_rng(1).integers(0, len(val) - args.prompt_len, args.prompts)
                ratios = {tree: [] for tree in trees}
                accepted = {tree: [] for tree in trees}
                per_forward = {tree: [] for tree in trees}
                equal = dict.fromkeys(trees, 0)
                plain_rates = []
                for start in starts:
                    prompts = [val[start : start + args.prompt_len].astype(np.int64).tolist()]
                    plain, want, _ = best_call(cfg, params, prompts, n, args.repeats, precision=products)
                    plain_rates.append(n / plain)
                    for tree in trees:
                        kw = {"speculative": True, "draft_tree": tree, "precision": products}
                        spec, out, stats = best_call(cfg, params, prompts, n, args.repeats, **kw)
                        ratios[tree].append(plain / spec)
                        accepted[tree].append(stats.acceptance_rate)
                        per_forward[tree].append(stats.tokens_per_forward)
                        equal[tree] += out == want
                print(
                    f"{path} ({kind}), {os.path.basename(os.path.normpath(folder))} val, {precision}: "
                    f"plain {np.median(plain_rates):,.0f} tok/s (median)"
                )
                for tree in trees:
                    r = np.array(ratios[tree])
                    print(
                        f"  tree {tree}: spec/plain median {np.median(r):.3f} ({r.min():.2f}-{r.max():.2f}); "
                        f"drafts accepted {np.mean(accepted[tree]):.1%}, "
                        f"{np.mean(per_forward[tree]):.2f} tokens a forward, "
                        f"equal to plain greedy {equal[tree]}/{args.prompts}"
                    )
        release_kept_decoders()


if __name__ == "__main__":
    main()
