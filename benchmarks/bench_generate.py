"""Greedy generation, tokens/s: euler-model's generate_batch vs Hugging Face transformers' `generate` on
the same weights (exported with euler-model's save_hf, loaded as LlamaForCausalLM), in one run.

For each batch size (default 1 and 32) and precision (fp32, and bf16 on the GPU): B prompts of
--prompt-len random ids (or windows of --prompts-from's val split), --new-tokens new tokens each (no stop
token: every row makes all of them), the best of --repeats timed runs after one warm-up, prefill included
on both sides. Rows printed:

  euler graph    generate_batch, the decode step captured as a CUDA graph (GPU only)
  euler eager    generate_batch launched from Python (on the CPU the only way)
  euler spec     generate_batch(speculative=True): the MTP heads draft, each step verifies (K >= 2;
                 graph on the GPU); the same greedy tokens, with the drafts' acceptance printed
  euler one      generate(), the one-prompt streaming generator (batch 1 only): a batch of one, each token
                 read back as its step ends
  hf eager       transformers generate, dynamic cache
  hf compiled    transformers generate, static cache + torch.compile (GPU, --hf-compile; may fail: said)

then (GPU) the captured step's steady rate, from the time of --new-tokens less that of an eighth as many,
with the memory bandwidth it uses: the bytes a plain step must read at least (every layer's matrices and
head 0, bf16 copies under bf16; the norms; each row's cached keys and values so far, float32) over the step's
time, as a share of the device's peak (its memory clock and bus width, or --peak-gbs); and, per setting,
the ratio of euler's best to transformers' best and how many rows of our tokens equal
theirs (float rounding may flip a near-tie and the rest of a row with it). The load averages before and
after are printed: on a shared machine they decide how far a figure can be trusted.

Run (from the repository root):
  hatch run bench:python benchmarks/bench_generate.py                       # CPU, `small`
  hatch run bench:python benchmarks/bench_generate.py --device gpu --preset gpu --new-tokens 400
  hatch run bench:python benchmarks/bench_generate.py --device gpu --preset 1b --no-hf --quick \
      --precisions bf16
  hatch run bench:python benchmarks/bench_generate.py --checkpoint CKPT --prompts-from runs/data/DATASET
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def _flag(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


# read before NumPy loads: BLAS threads
os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = _flag("--threads", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from bench_generate_calls import prompt_windows  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

import euler_kernels as ek  # noqa: E402
from euler_data.meta import open_split  # noqa: E402
from euler_kernels.heap import keep_freed_memory  # noqa: E402
from euler_model import (  # noqa: E402
    PRESETS,
    GenerationStats,
    generate,
    generate_batch,
    init_params,
    load_checkpoint,
    preset,
    save_hf,
)


def timed(fn, repeats: int) -> tuple[list[list[int]], float]:
    """(output of fn, best seconds of `repeats` runs after one warm-up)."""
    out, best = fn(), float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return out, best


def euler_runs(
    cfg,
    params,
    prompts,
    n,
    gpu: bool,
    quick: bool,
    stats: GenerationStats,
    graph_stats: GenerationStats,
    precision: ek.Precision,
) -> dict:
    """name -> a function generating the rows' new tokens with euler-model in `precision` (quick: no
    uncaptured GPU rows); the speculative row adds its drafts to `stats`, the graph row says in
    `graph_stats.decode` how its steps ran (a capture that failed runs them eagerly)."""

    def batched(graph: bool, speculative: bool = False):
        def run():
            if speculative:
                kw = {"speculative": True, "stats": stats}
            else:
                kw = {"stats": graph_stats} if graph else {}
            out = generate_batch(
                cfg, params, prompts, n, temperature=0.0, cuda_graph=graph, precision=precision, **kw
            )
            return [c.tokens for c in out]

        return run

    runs = {"euler graph": batched(True)} if gpu else {}
    if not (gpu and quick):
        runs["euler eager"] = batched(False)
    if cfg.n_mtp_heads > 1:
        runs["euler spec"] = batched(True, speculative=True)
    if len(prompts) == 1 and not (gpu and quick):
        runs["euler one"] = lambda: [
            list(generate(cfg, params, prompts[0], n, temperature=0.0, precision=precision))
        ]
    return runs


def hf_runs(folder: str, prompts, n, device: str, dtype, compile_too: bool) -> dict:
    """name -> a function generating the rows' new tokens with transformers (greedy, min = max tokens)."""
    model = LlamaForCausalLM.from_pretrained(folder, torch_dtype=dtype).to(device).eval()
    ids = torch.tensor(prompts, device=device)

    def run(**extra):
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
                **extra,
            )
        if device == "cuda":
            torch.cuda.synchronize()
        return out[:, ids.shape[1] :].tolist()

    runs = {"hf eager": run}
    if compile_too:
        compiled = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        runs["hf compiled"] = lambda: _with_forward(
            model, compiled, lambda: run(cache_implementation="static")
        )
    return runs


def _with_forward(model, forward, fn):
    plain, model.forward = model.forward, forward
    try:
        return fn()
    finally:
        model.forward = plain


def read_bytes(cfg, params, batch: int, positions: float, precision: ek.Precision) -> float:
    """Bytes one plain decode step of `batch` rows must read at least: every layer's matrices and head 0
    (bf16 copies under a bf16 precision, else float32: decode_step.inference_weights), the norms, and each
    row's cached keys and values at `positions` (float32, (L, B, Hkv, S, D))."""
    matrices = sum(
        v.size for k, v in params.items() if k == "heads.0" or (k.startswith("layers.") and v.ndim == 2)
    )
    norms = sum(v.size for k, v in params.items() if v.ndim == 1)
    cache = 2 * cfg.n_layers * batch * cfg.n_kv_heads * cfg.head_dim * positions
    return matrices * (2 if precision.bf16 else 4) + 4 * (norms + cache)


def peak_bandwidth(override_gbs: float | None) -> float | None:
    """Bytes/s the GPU's memory moves at most: 2 transfers a clock over its bus (CuPy's device attributes),
    or --peak-gbs; None where neither is known."""
    if override_gbs:
        return override_gbs * 1e9
    attributes = ek.require_cuda().cuda.Device().attributes
    clock_khz, bus_bits = attributes.get("MemoryClockRate"), attributes.get("GlobalMemoryBusWidth")
    return 2 * clock_khz * 1e3 * bus_bits / 8 if clock_khz and bus_bits else None


def steady_decode(
    cfg, params, prompts, n: int, seconds_n: float, repeats: int, precision: ek.Precision, peak: float | None
) -> None:
    """Print the captured decode step's own rate: the time of n tokens less that of n // 8, per token, and
    what is left of the call (prefill, weights, the eager first step, capture) as its fixed cost; then the
    bandwidth the step uses (read_bytes at the rows' mean position over the step's time) and its share of
    `peak`."""
    short = max(2, n // 8)

    def call():
        return generate_batch(cfg, params, prompts, short, temperature=0.0, precision=precision)

    _, seconds_short = timed(call, repeats)
    step = (seconds_n - seconds_short) / (n - short)
    print(
        f"batch {len(prompts):3d}  euler graph steady decode: {step * 1e6:.0f} us a step = "
        f"{len(prompts) / step:,.0f} tok/s; fixed cost of a call {(seconds_n - n * step) * 1e3:.1f} ms"
    )
    positions = np.mean([len(p) for p in prompts]) + (short + n) / 2  # the steady steps' mean position
    used = read_bytes(cfg, params, len(prompts), positions, precision) / step
    share = (
        f" = {used / peak:.0%} of the peak {peak / 1e12:.2f} TB/s" if peak else " (peak unknown: --peak-gbs)"
    )
    print(f"batch {len(prompts):3d}  euler graph steady decode reads {used / 1e12:.2f} TB/s{share}")


def agreement(ours: list[list[int]], theirs: list[list[int]]) -> str:
    same = sum(a == b for a, b in zip(ours, theirs))
    prefix = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(ours, theirs)]
    return f"{same}/{len(ours)} rows equal, mean common prefix {np.mean(prefix):.1f} tokens"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="small", choices=sorted(PRESETS))
    p.add_argument("--checkpoint", help="model.safetensors of a trained model (default: random weights)")
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    p.add_argument("--batches", default="1,32", help="batch sizes, comma-separated")
    p.add_argument("--precisions", default=None, help="fp32,bf16 (default: fp32 on the CPU, both on the GPU)")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="BLAS and torch threads on the CPU")
    p.add_argument("--hf-compile", action="store_true", help="also transformers with static cache + compile")
    p.add_argument("--no-hf", action="store_true", help="leave out transformers (the larger presets: slow)")
    p.add_argument("--peak-gbs", type=float, help="the GPU's peak memory bandwidth, GB/s (default: asked)")
    p.add_argument("--quick", action="store_true", help="GPU: leave out the uncaptured euler rows (slow)")
    p.add_argument(
        "--prompts-from", help="an euler-data dataset folder: prompts are windows of its val split"
    )
    args = p.parse_args()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    gpu = args.device == "gpu"
    if not gpu:
        keep_freed_memory()  # as euler-train does for its CPU runs (euler_kernels/heap.py)
    xp = ek.require_cuda() if gpu else np
    if args.checkpoint:
        cfg, host, _ = load_checkpoint(args.checkpoint)
    else:
        cfg, host = preset(args.preset), init_params(preset(args.preset), seed=0)
    if args.prompt_len + args.new_tokens > cfg.context:
        sys.exit(
            f"bench_generate: prompt {args.prompt_len} + {args.new_tokens} new tokens > context {cfg.context}"
        )
    params = {k: xp.asarray(v) for k, v in host.items()}
    folder = tempfile.mkdtemp(prefix="bench_generate_")
    save_hf(cfg, host, folder)
    precisions = (args.precisions or ("fp32,bf16" if gpu else "fp32")).split(",")
    try:  # how euler's products are computed on the GPU, for each name
        products_of = {name: ek.Precision(name) for name in precisions}
    except ValueError as err:
        p.error(str(err))
    print(
        f"# {args.checkpoint or args.preset}, {args.device}, threads {args.threads}, "
        f"prompt {args.prompt_len}, new tokens {args.new_tokens}; load average {os.getloadavg()}"
    )
    print(f"# numpy {np.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
    rng = np.random.default_rng(0)
    val = np.concatenate(open_split(args.prompts_from, "val")) if args.prompts_from else None
    for b in [int(x) for x in args.batches.split(",")]:
        prompts = prompt_windows(rng, val, b, args.prompt_len, cfg.vocab_size)
        for precision in precisions:
            products = products_of[precision]
            dtype = torch.bfloat16 if precision == "bf16" else torch.float32
            results, spec, graph_stats = {}, GenerationStats(), GenerationStats()
            run = (cfg, params, prompts, args.new_tokens, gpu, args.quick, spec, graph_stats, products)
            runs = euler_runs(*run)
            for name, fn in runs.items():
                results[name] = timed(fn, args.repeats)
            hf = (
                {}
                if args.no_hf
                else hf_runs(
                    folder, prompts, args.new_tokens, "cuda" if gpu else "cpu", dtype, args.hf_compile
                )
            )
            for name, fn in hf.items():
                try:
                    results[name] = timed(fn, args.repeats)
                except Exception as err:  # torch.compile's failures are many and version-dependent
                    print(f"  {name}: did not run ({type(err).__name__}: {str(err).splitlines()[0][:100]})")
            tokens = b * args.new_tokens
            for name, (_, seconds) in results.items():
                print(
                    f"batch {b:3d} {precision}  {name:12s} {tokens / seconds:10.0f} tok/s  ({seconds:.3f} s)"
                )
            if gpu:
                print(f"batch {b:3d} {precision}  euler graph decode steps ran as: {graph_stats.decode}")
                seconds = results["euler graph"][1]
                peak = peak_bandwidth(args.peak_gbs)
                steady_decode(cfg, params, prompts, args.new_tokens, seconds, args.repeats, products, peak)
            if spec.drafted:
                print(
                    f"batch {b:3d} {precision}  euler spec: {spec.accepted:,} of {spec.drafted:,} drafts "
                    f"accepted ({spec.acceptance_rate:.0%}); tokens equal to euler's plain greedy: "
                    f"{agreement(results['euler spec'][0], results[next(iter(results))][0])}"
                )
            if not hf:
                continue
            ours = min((s, n) for n, (_, s) in results.items() if n.startswith("euler") and n != "euler one")
            theirs = min((s, n) for n, (_, s) in results.items() if n.startswith("hf"))
            print(
                f"batch {b:3d} {precision}  {ours[1]} / {theirs[1]}: {theirs[0] / ours[0]:.2f}x; "
                f"tokens: {agreement(results[ours[1]][0], results[theirs[1]][0])}"
            )
    print(f"# load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
