"""euler-model benchmarks, side by side with PyTorch in the same run.

1. CPU training step (forward + backward), preset `small`, B=16, T=128: euler-model (NumPy) vs a PyTorch
   implementation of the same architecture written here, on the same weights (equal loss checked first).
2. Generation tokens/s with the KV cache on CPU (`small`), plain greedy decoding.
3. Speculative decoding with the MTP heads on a `small` model trained here for a few minutes on Tiny
   Shakespeare (byte-level ids): accepted-draft rate, tokens per forward and speed-up over plain greedy;
   and its ceiling on this machine, on a model trained on a cyclic stream where every draft is right.
4. With CuPy and a CUDA device: tokens/s of the `gpu` preset with the KV cache, and the trained `small`
   model's speculative speed-up on the GPU (skipped otherwise).

Run (from the repository root): hatch run bench:python benchmarks/bench_model.py [--quick] [--threads N]
The results start with the environment: NumPy / torch versions, the BLAS library and the kernel it runs
(threadpoolctl), the thread settings, OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE if set (they select an older,
slower OpenBLAS kernel: to benchmark without them, `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE` before
the command) and the load averages, which decide how far a figure can be trusted on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def _threads_from_argv() -> int:
    """--threads N, read before NumPy is imported (OpenBLAS reads its thread count at load time)."""
    return int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 1


os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(_threads_from_argv())

import numpy as np  # noqa: E402
import threadpoolctl  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from euler_kernels.heap import keep_freed_memory  # noqa: E402
from euler_kernels.optim.adamw import adamw_update  # noqa: E402
from euler_kernels.optim.grad_norm import clip_grad_norm  # noqa: E402
from euler_model import (  # noqa: E402
    GenerationStats,
    count_params,
    forward_loss,
    generate,
    init_params,
    load_checkpoint,
    loss_and_grads,
    preset,
    save_checkpoint,
)
from euler_model.cpu_threads import cpu_workers  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def environment(threads: int) -> dict:
    """What decides the CPU figures: versions, the BLAS library and kernel, threads, load."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in _read("/proc/cpuinfo").splitlines()
            if "model name" in line
        ),
        "unknown",
    )
    blas = [
        {k: lib.get(k) for k in ("internal_api", "version", "architecture", "threading_layer", "num_threads")}
        for lib in threadpoolctl.threadpool_info()
        if lib["user_api"] == "blas"
    ]
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "torch": torch.__version__,
        "numpy_blas": blas,  # the kernel OpenBLAS picked is "architecture"
        "torch_blas": "mkl" if torch.backends.mkl.is_available() else "other",
        "threads": threads,
        "torch_threads": torch.get_num_threads(),
        "euler_cpu_workers": cpu_workers(16),  # worker threads of the B = 16 NumPy step
        "openblas_env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")},
        "load_avg_start": os.getloadavg(),
    }


def busy_cpu_seconds() -> float | None:
    """CPU seconds every process on the machine has used since boot (/proc/stat), None off Linux."""
    first = _read("/proc/stat").split("\n", 1)[0].split()
    if not first or first[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def others_cores(start: tuple, end: tuple) -> float | None:
    """Cores kept busy by other processes between two (wall, busy_cpu_seconds, own process time)
    readings: the machine's CPU time minus this process's, over the wall time."""
    if start[1] is None or end[1] is None:
        return None
    return max(0.0, ((end[1] - start[1]) - (end[2] - start[2])) / (end[0] - start[0]))


def cpu_reading() -> tuple:
    return time.perf_counter(), busy_cpu_seconds(), time.process_time()


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


# --- the same architecture in PyTorch (reference only) -------------------------------------------------


def torch_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on x (B, H, T, D) with cos/sin (T, D/2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def torch_loss(cfg, p: dict[str, torch.Tensor], tokens, targets, mask, cos, sin) -> torch.Tensor:
    """The MTP loss of euler-model, written with torch ops (autograd does the backward)."""
    b, t = tokens.shape
    hq, hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    x = p["embed"][tokens]  # (B, T, C)
    for i in range(cfg.n_layers):
        pre = f"layers.{i}."
        h = F.rms_norm(x, (cfg.dim,), p[pre + "attn_norm"], cfg.norm_eps)
        q = (h @ p[pre + "wq"].T).view(b, t, hq, d).transpose(1, 2)
        k = (h @ p[pre + "wk"].T).view(b, t, hkv, d).transpose(1, 2)
        v = (h @ p[pre + "wv"].T).view(b, t, hkv, d).transpose(1, 2)
        q, k = torch_rope(q, cos[:t], sin[:t]), torch_rope(k, cos[:t], sin[:t])
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + a.transpose(1, 2).reshape(b, t, cfg.dim) @ p[pre + "wo"].T
        h = F.rms_norm(x, (cfg.dim,), p[pre + "ffn_norm"], cfg.norm_eps)
        x = x + (F.silu(h @ p[pre + "w_gate"].T) * (h @ p[pre + "w_up"].T)) @ p[pre + "w_down"].T
    h = F.rms_norm(x, (cfg.dim,), p["norm"], cfg.norm_eps)
    total = 0.0
    for k in range(cfg.n_mtp_heads):
        z = h @ p[f"heads.{k}"].T  # (B, T, V)
        tgt = targets[:, k : k + t].reshape(-1)
        nll = F.cross_entropy(z.reshape(-1, cfg.vocab_size), tgt, reduction="none")
        w = mask[:, k : k + t].reshape(-1)
        total = total + (w * nll).sum() / w.sum().clamp(min=1.0)
    return total / cfg.n_mtp_heads


def torch_tables(cfg):
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
    ang = torch.arange(cfg.context, dtype=torch.float64)[:, None] * inv[None]
    return torch.cos(ang).float(), torch.sin(ang).float()


# --- 1. training step ------------------------------------------------------------------------------------


def bench_train_step(reps: int) -> dict:
    cfg = preset("small")
    params = init_params(cfg, seed=0)
    rng = np.random.default_rng(0)
    b, t = 16, 128
    tokens = rng.integers(0, cfg.vocab_size, (b, t))
    targets = rng.integers(0, cfg.vocab_size, (b, t + cfg.n_mtp_heads - 1))
    mask = np.ones(targets.shape, np.float32)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    tt, tg, tm = torch.from_numpy(tokens), torch.from_numpy(targets), torch.from_numpy(mask)
    cos, sin = torch_tables(cfg)

    def ours():
        return loss_and_grads(cfg, params, tokens, targets, mask)

    def theirs():
        for v in tp.values():
            v.grad = None
        loss = torch_loss(cfg, tp, tt, tg, tm, cos, sin)
        loss.backward()
        return float(loss.detach()), {k: v.grad for k, v in tp.items()}

    (l_ours, g_ours), (l_torch, g_torch) = ours(), theirs()
    grad_err = max(
        float(np.abs(g_ours[k] - g_torch[k].numpy()).max() / (np.abs(g_torch[k].numpy()).max() + 1e-12))
        for k in params
    )
    assert abs(l_ours - l_torch) < 1e-4 * abs(l_torch), (l_ours, l_torch)
    assert grad_err < 1e-3, grad_err
    times = {"euler": [], "torch": []}
    machine_before = cpu_reading()
    for _ in range(reps):  # interleaved, so both see the same machine load
        for name, fn in (("euler", ours), ("torch", theirs)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "preset": "small",
        "batch": b,
        "context": t,
        "params": count_params(cfg),
        "loss_euler": l_ours,
        "loss_torch": l_torch,
        "max_rel_grad_diff": grad_err,
        "reps": reps,
        "median_s_euler": med["euler"],
        "median_s_torch": med["torch"],
        "ratio_euler_over_torch": med["euler"] / med["torch"],
        "tokens_per_s_euler": b * t / med["euler"],
        "tokens_per_s_torch": b * t / med["torch"],
        "other_processes_cores": others_cores(machine_before, cpu_reading()),  # 0 on a quiet machine
        "load_avg_end": os.getloadavg(),
    }


# --- 2./3. generation ------------------------------------------------------------------------------------


def shakespeare_bytes() -> np.ndarray:
    mirror = Path(os.environ.get("EULER_DATA_MIRROR", ROOT.parent / "shared" / "data"))
    files = sorted((mirror / "tinyshakespeare").rglob("*.txt"))
    if not files:
        raise SystemExit(f"bench_model: no Tiny Shakespeare text under {mirror / 'tinyshakespeare'}")
    return np.frombuffer(files[0].read_bytes(), dtype=np.uint8).astype(np.int64)


def cyclic_text(n: int = 200_000, period: int = 53) -> np.ndarray:
    """A synthetic stream in which every token is predictable: 0, 1, ..., period - 1, 0, 1, ..."""
    return np.arange(n, dtype=np.int64) % period


def train_small(data: np.ndarray, seconds: float, seed: int = 0) -> tuple:
    """Train `small` on byte-level ids with AdamW for about `seconds`; returns (cfg, params, log)."""
    cfg = preset("small")
    params = init_params(cfg, seed=seed)
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(x) for k, x in params.items()}
    split = int(0.9 * len(data))
    rng = np.random.default_rng(seed)
    b, t, k_extra = 16, cfg.context, cfg.n_mtp_heads - 1
    log, step, start = [], 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step += 1
        idx = rng.integers(0, split - t - k_extra - 1, b)
        seq = np.stack([data[i : i + t + k_extra + 1] for i in idx])
        loss, grads = loss_and_grads(cfg, params, seq[:, :t], seq[:, 1:])
        clip_grad_norm(grads, 1.0)
        progress = (time.perf_counter() - start) / seconds  # the schedule runs on the time budget
        lr = 3e-3 * min(1.0, step / 50) * (0.1 + 0.9 * max(0.0, 1.0 - progress))  # warm-up, linear decay
        for name in params:
            adamw_update(params[name], m[name], v[name], grads[name], step, lr=lr, weight_decay=0.01)
        if step % 50 == 0:
            log.append((step, round(loss, 4)))
    val = data[split:]
    vi = np.arange(0, len(val) - t - k_extra - 1, (len(val) - t - k_extra - 1) // 16)[:16]
    vseq = np.stack([val[i : i + t + k_extra + 1] for i in vi])
    val_loss = forward_loss(cfg, params, vseq[:, :t], vseq[:, 1:])
    return cfg, params, {"steps": step, "train_loss_log": log, "val_mtp_loss": val_loss}


def timed_generation(cfg, params, prompt, n, speculative: bool, tree: tuple[int, ...] | None = None) -> tuple:
    stats = GenerationStats()
    start = time.perf_counter()
    out = list(
        generate(
            cfg,
            params,
            prompt,
            n,
            temperature=0.0,
            speculative=speculative,
            stats=stats,
            draft_tree=tree,
        )
    )
    return out, time.perf_counter() - start, stats


VARIANTS = {
    "plain": False,
    "speculative": True,
    "speculative_all_drafts": True,
}  # the last: every head drafts


def bench_generation(cfg, params, data: np.ndarray, reps: int, n_new: int) -> dict:
    """Plain vs speculative greedy decoding (the default draft tree, and a chain of every drafting head),
    interleaved prompt by prompt; the outputs must be identical."""
    rng = np.random.default_rng(1)
    rates = {name: [] for name in VARIANTS}
    counts = {
        name: np.zeros(4) for name in VARIANTS
    }  # drafted, accepted, generated, forwards after the prompt
    for r in range(reps):
        start = int(rng.integers(0, len(data) - 64))
        prompt = [int(x) for x in data[start : start + 16]]
        outs = {}
        for name, spec in VARIANTS.items():
            tree = tuple(range(cfg.n_mtp_heads - 1)) if name == "speculative_all_drafts" else None
            outs[name], seconds, st = timed_generation(cfg, params, prompt, n_new, spec, tree)
            rates[name].append(len(outs[name]) / seconds)
            counts[name] += [st.drafted, st.accepted, st.generated, st.forwards - 1]
        assert all(o == outs["plain"] for o in outs.values()), f"speculative output differs on prompt {r}"
    result = {"new_tokens_per_prompt": n_new, "prompts": reps}
    for name in VARIANTS:
        drafted, accepted, generated, forwards = counts[name]
        result[name] = {
            "tokens_per_s": statistics.median(rates[name]),
            "speedup": statistics.median(rates[name]) / statistics.median(rates["plain"]),
            "accepted_draft_rate": accepted / max(drafted, 1),
            "tokens_per_forward": generated / max(forwards, 1),
        }
    plain = outs["plain"]
    result["sample"] = bytes(plain[:80]).decode("utf-8", "replace") if max(plain) < 256 else None
    return result


def cupy_or_none():
    """CuPy when a CUDA device is usable, else None (the GPU figures are then skipped)."""
    try:
        import cupy

        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:
        return None


def bench_gpu_generation(cp, n_new: int = 200, reps: int = 3) -> dict:
    """Plain greedy tokens/s with the KV cache for the `gpu` preset (random weights) on one GPU."""
    cfg = preset("gpu")
    params = init_params(cfg, seed=0, xp=cp)
    prompt = list(range(1, 17))
    list(generate(cfg, params, prompt, 8, temperature=0.0))  # warm-up: kernel compilation
    rates = []
    for _ in range(reps):
        out, seconds, _ = timed_generation(cfg, params, prompt, n_new, speculative=False)
        rates.append(len(out) / seconds)
    return {
        "preset": "gpu",
        "params": count_params(cfg),
        "new_tokens": n_new,
        "tokens_per_s": statistics.median(rates),
    }


def bench_all_generation(args: argparse.Namespace, results: dict) -> None:
    """Generation figures: random and trained `small` on CPU, the cyclic ceiling, the GPU when present."""
    data = shakespeare_bytes()
    cfg_rand, p_rand = preset("small"), init_params(preset("small"), seed=0)
    results["generation_random_small"] = bench_generation(cfg_rand, p_rand, data, 2 if args.quick else 5, 100)
    print(json.dumps(results["generation_random_small"], indent=1), flush=True)
    if args.trained and args.trained.is_file():
        cfg, params, train_log = load_checkpoint(args.trained)
    else:
        cfg, params, train_log = train_small(data, 20.0 if args.quick else args.train_seconds)
        if args.trained:
            save_checkpoint(args.trained, cfg, params, train_log)
    results["trained_small"] = train_log
    print(json.dumps(train_log), flush=True)
    results["generation_trained_small"] = bench_generation(cfg, params, data, 3 if args.quick else 10, 100)
    print(json.dumps(results["generation_trained_small"], indent=1), flush=True)
    # the ceiling of the mechanism on this machine: a model whose drafts are (almost) always right
    cyc = cyclic_text()
    cfg_c, params_c, log_c = train_small(cyc, 10.0 if args.quick else 30.0)
    results["generation_cyclic_small"] = bench_generation(cfg_c, params_c, cyc, 3 if args.quick else 5, 100)
    results["generation_cyclic_small"] |= {"trained_steps": log_c["steps"], "sample": None}
    print(json.dumps(results["generation_cyclic_small"], indent=1), flush=True)
    cp = cupy_or_none()
    if cp is not None:
        results["generation_gpu_preset"] = bench_gpu_generation(cp)
        gpu_params = {k: cp.asarray(x) for k, x in params.items()}
        results["generation_trained_small_on_gpu"] = bench_generation(cfg, gpu_params, data, 5, 100)
        print(json.dumps({k: results[k] for k in results if "gpu" in k}, indent=1), flush=True)
    else:
        print("no CUDA device: the GPU generation figures are skipped", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few repetitions, short training (smoke test)")
    parser.add_argument("--train-seconds", type=float, default=240.0)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--threads", type=int, default=1, help="BLAS / torch threads for both sides")
    parser.add_argument("--skip-generation", action="store_true", help="only the training-step comparison")
    parser.add_argument("--trained", type=Path, default=None, help="reuse (or save) the trained model here")
    parser.add_argument("--reps", type=int, default=None, help="training-step repetitions (default 15)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as euler-train does for its CPU runs: a step reuses the last one's freed pages
    reps = args.reps or (3 if args.quick else 15)
    results = {"machine": environment(args.threads)}
    print(json.dumps(results["machine"], indent=1), flush=True)
    results["train_step"] = bench_train_step(reps)
    print(json.dumps(results["train_step"], indent=1), flush=True)
    if not args.skip_generation:
        bench_all_generation(args, results)
    results["machine"]["load_avg_end"] = os.getloadavg()
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
