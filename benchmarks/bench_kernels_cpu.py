"""euler-kernels CPU path vs PyTorch CPU autograd: forward+backward time per op and for a whole
pre-norm transformer block, at the `small` preset's shapes (B=16, T=128, dim 128, 4 q / 2 kv heads,
ffn 384, vocab 512), float32.

Ours and PyTorch's run interleaved in the same process, several repetitions; medians are reported,
both of wall-clock time and of the process's CPU time (less disturbed when other work shares the cores).
PyTorch appears only here, never in the package.

    python benchmarks/bench_kernels_cpu.py [--reps 7] [--inner 5] [--threads 1]

`--threads N` sets both OpenBLAS's (NumPy's BLAS, through OPENBLAS_NUM_THREADS before NumPy loads) and
PyTorch's intra-op thread counts, so both sides use the same number of cores.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable


def _threads_from_argv(default: int = 1) -> int:
    # read --threads before NumPy is imported: OpenBLAS fixes its thread count when it loads
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        if arg == "--threads" and i + 1 < len(argv):
            return int(argv[i + 1])
        if arg.startswith("--threads="):
            return int(arg.split("=", 1)[1])
    return default


THREADS = _threads_from_argv()
os.environ["OPENBLAS_NUM_THREADS"] = str(THREADS)
os.environ["OMP_NUM_THREADS"] = str(THREADS)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import euler_kernels as ek  # noqa: E402
from euler_kernels.residual.residual import residual_backward, residual_forward  # noqa: E402

B, T, C, HQ, HKV, FFN, V = 16, 128, 128, 4, 2, 384, 512
D = C // HQ
DT = np.float32


def _rng_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def r(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(DT)

    return {
        "x": r(B, T, C),
        "n1": 1 + r(C, scale=0.1),
        "n2": 1 + r(C, scale=0.1),
        "wq": r(C, C, scale=C**-0.5),
        "wk": r(HKV * D, C, scale=C**-0.5),
        "wv": r(HKV * D, C, scale=C**-0.5),
        "wo": r(C, C, scale=C**-0.5),
        "wg": r(FFN, C, scale=C**-0.5),
        "wu": r(FFN, C, scale=C**-0.5),
        "wd": r(C, FFN, scale=FFN**-0.5),
        "q": r(B, T, HQ, D),
        "k": r(B, T, HKV, D),
        "v": r(B, T, HKV, D),
        "gate": r(B, T, FFN),
        "up": r(B, T, FFN),
        "emb": r(V, C),
        "logits": r(B, T, V, scale=3.0),
        "tokens": rng.integers(0, V, size=(B, T)),
        "dout_c": r(B, T, C),
        "dout_f": r(B, T, FFN),
        "dout_q": r(B, T, HQ, D),
    }


# --- ours ------------------------------------------------------------------------------------------


def block_ours(a: dict, cos: np.ndarray, sin: np.ndarray) -> None:
    """One pre-norm Llama block forward and backward: attention then SwiGLU MLP, both residual."""
    x = a["x"]
    h1, c_n1 = ek.rmsnorm_forward(x, a["n1"])
    q, c_q = ek.linear_forward(h1, a["wq"])
    k, c_k = ek.linear_forward(h1, a["wk"])
    v, c_v = ek.linear_forward(h1, a["wv"])
    qr, c_rq = ek.rope_forward(q.reshape(B, T, HQ, D), cos, sin)
    kr, c_rk = ek.rope_forward(k.reshape(B, T, HKV, D), cos, sin)
    att, c_att = ek.attention_forward(qr, kr, v.reshape(B, T, HKV, D))
    o, c_o = ek.linear_forward(att.reshape(B, T, C), a["wo"])
    x1, c_r1 = residual_forward(x, o)
    h2, c_n2 = ek.rmsnorm_forward(x1, a["n2"])
    g, c_g = ek.linear_forward(h2, a["wg"])
    u, c_u = ek.linear_forward(h2, a["wu"])
    s, c_s = ek.swiglu_forward(g, u)
    d, c_d = ek.linear_forward(s, a["wd"])
    _, c_r2 = residual_forward(x1, d)
    # backward, in reverse order
    dx1, dd = residual_backward(a["dout_c"], c_r2)
    ds, _ = ek.linear_backward(dd, c_d)
    dg, du = ek.swiglu_backward(ds, c_s)
    dh2 = ek.linear_backward(dg, c_g)[0] + ek.linear_backward(du, c_u)[0]
    dx1 += ek.rmsnorm_backward(dh2, c_n2)[0]
    _, do = residual_backward(dx1, c_r1)
    datt, _ = ek.linear_backward(do, c_o)
    dq, dk, dv = ek.attention_backward(datt.reshape(B, T, HQ, D), c_att)
    dq = ek.rope_backward(dq, c_rq).reshape(B, T, C)
    dk = ek.rope_backward(dk, c_rk).reshape(B, T, HKV * D)
    dh1 = ek.linear_backward(dq, c_q)[0] + ek.linear_backward(dk, c_k)[0]
    dh1 += ek.linear_backward(dv.reshape(B, T, HKV * D), c_v)[0]
    ek.rmsnorm_backward(dh1, c_n1)


def ours_cases(a: dict) -> dict[str, Callable[[], object]]:
    cos, sin = ek.rope_tables(D, T, dtype=DT)

    def pair(fwd, bwd, dout, *args, **kw) -> Callable[[], object]:
        return lambda: bwd(dout, fwd(*args, **kw)[1])

    return {
        "embedding": pair(ek.embedding_forward, ek.embedding_backward, a["dout_c"], a["emb"], a["tokens"]),
        "rmsnorm": pair(ek.rmsnorm_forward, ek.rmsnorm_backward, a["dout_c"], a["x"], a["n1"]),
        "linear 128->384": pair(ek.linear_forward, ek.linear_backward, a["dout_f"], a["x"], a["wg"]),
        "rope (q)": pair(ek.rope_forward, ek.rope_backward, a["dout_q"], a["q"], cos, sin),
        "attention": pair(ek.attention_forward, ek.attention_backward, a["dout_q"], a["q"], a["k"], a["v"]),
        "attention (torch naive)": pair(
            ek.attention_forward, ek.attention_backward, a["dout_q"], a["q"], a["k"], a["v"]
        ),
        "swiglu": pair(ek.swiglu_forward, ek.swiglu_backward, a["dout_f"], a["gate"], a["up"]),
        "residual": pair(residual_forward, residual_backward, a["dout_c"], a["x"], a["x"]),
        "cross_entropy": pair(
            ek.cross_entropy_forward, ek.cross_entropy_backward, 1.0, a["logits"], a["tokens"]
        ),
        "block (norm>attn>mlp)": lambda: block_ours(a, cos, sin),
    }


# --- PyTorch ---------------------------------------------------------------------------------------


def _rope_torch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    c, s = cos[:, None, :], sin[:, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def _attn_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # (B, T, H, D) -> (B, H, T, D) for SDPA, grouped-query via enable_gqa
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
    )
    return o.transpose(1, 2)


def _attn_torch_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # plain softmax(q k^T / sqrt(D)) v with K/V heads repeated, as a from-ops reference
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    k, v = k.repeat_interleave(HQ // HKV, dim=1), v.repeat_interleave(HQ // HKV, dim=1)
    scores = (q @ k.transpose(-1, -2)) / D**0.5
    mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).triu(1)
    return (scores.masked_fill(mask, float("-inf")).softmax(-1) @ v).transpose(1, 2)


def block_torch(t: dict, cos: torch.Tensor, sin: torch.Tensor) -> None:
    x = t["x"]
    h1 = F.rms_norm(x, (C,), t["n1"], eps=1e-5)
    q = _rope_torch(F.linear(h1, t["wq"]).view(B, T, HQ, D), cos, sin)
    k = _rope_torch(F.linear(h1, t["wk"]).view(B, T, HKV, D), cos, sin)
    v = F.linear(h1, t["wv"]).view(B, T, HKV, D)
    x1 = x + F.linear(_attn_torch(q, k, v).reshape(B, T, C), t["wo"])
    h2 = F.rms_norm(x1, (C,), t["n2"], eps=1e-5)
    y = x1 + F.linear(F.silu(F.linear(h2, t["wg"])) * F.linear(h2, t["wu"]), t["wd"])
    names = ["x", "n1", "n2", "wq", "wk", "wv", "wo", "wg", "wu", "wd"]
    torch.autograd.grad(y, [t[n] for n in names], t["dout_c"])


def torch_cases(a: dict) -> dict[str, Callable[[], object]]:
    t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in a.items()}
    for k, val in t.items():
        if val.is_floating_point() and not k.startswith("dout"):
            val.requires_grad_(True)
    cos_np, sin_np = ek.rope_tables(D, T, dtype=DT)
    cos, sin = torch.from_numpy(cos_np), torch.from_numpy(sin_np)

    def grad(fn, dout, *inputs) -> Callable[[], object]:
        return lambda: torch.autograd.grad(fn(), list(inputs), dout)

    return {
        "embedding": grad(lambda: F.embedding(t["tokens"], t["emb"]), t["dout_c"], t["emb"]),
        "rmsnorm": grad(lambda: F.rms_norm(t["x"], (C,), t["n1"], eps=1e-5), t["dout_c"], t["x"], t["n1"]),
        "linear 128->384": grad(lambda: F.linear(t["x"], t["wg"]), t["dout_f"], t["x"], t["wg"]),
        "rope (q)": grad(lambda: _rope_torch(t["q"], cos, sin), t["dout_q"], t["q"]),
        "attention": grad(lambda: _attn_torch(t["q"], t["k"], t["v"]), t["dout_q"], t["q"], t["k"], t["v"]),
        "attention (torch naive)": grad(
            lambda: _attn_torch_naive(t["q"], t["k"], t["v"]), t["dout_q"], t["q"], t["k"], t["v"]
        ),
        "swiglu": grad(lambda: F.silu(t["gate"]) * t["up"], t["dout_f"], t["gate"], t["up"]),
        "residual": grad(lambda: t["x"] + t["dout_c"] * 1.0, t["dout_c"], t["x"]),
        "cross_entropy": grad(
            lambda: F.cross_entropy(t["logits"].view(-1, V), t["tokens"].view(-1)),
            torch.tensor(1.0),
            t["logits"],
        ),
        "block (norm>attn>mlp)": lambda: block_torch(t, cos, sin),
    }


# --- timing ----------------------------------------------------------------------------------------


def _time(fn: Callable[[], object], inner: int) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) per call, averaged over `inner` calls."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - wall) / inner, (time.process_time() - cpu) / inner


def run(reps: int, inner: int) -> list[tuple[str, tuple[float, float], tuple[float, float]]]:
    """Per case: median (wall, cpu) for ours and for PyTorch."""
    a = _rng_arrays()
    ours, ref = ours_cases(a), torch_cases(a)
    rows = []
    for name in ours:
        ours[name](), ref[name]()  # warm-up
        t_ours, t_ref = [], []
        for _ in range(reps):  # interleaved, so load changes hit both sides alike
            t_ours.append(_time(ours[name], inner))
            t_ref.append(_time(ref[name], inner))
        med = [tuple(statistics.median(x[i] for x in ts) for i in (0, 1)) for ts in (t_ours, t_ref)]
        rows.append((name, med[0], med[1]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7, help="interleaved repetitions (median reported)")
    ap.add_argument("--inner", type=int, default=5, help="calls per timed repetition")
    ap.add_argument("--threads", type=int, default=1, help="threads for OpenBLAS (NumPy) and for PyTorch")
    args = ap.parse_args()
    torch.set_num_threads(THREADS)
    cpu = platform.processor() or platform.machine()
    print(
        f"# numpy {np.__version__} (OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}), "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), {cpu}, {os.cpu_count()} cpus, "
        f"load average before {os.getloadavg()[0]:.2f}"
    )
    print(
        f"# B={B} T={T} C={C} heads {HQ}/{HKV} D={D} ffn={FFN} vocab={V} float32, "
        f"median of {args.reps} x {args.inner} calls, forward+backward"
    )
    print(
        "| op | ours wall (ms) | torch wall (ms) | ratio wall | ours CPU (ms) | torch CPU (ms) | ratio CPU |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (w_o, c_o), (w_r, c_r) in run(args.reps, args.inner):
        print(
            f"| {name} | {w_o * 1e3:.3f} | {w_r * 1e3:.3f} | {w_o / w_r:.2f}x "
            f"| {c_o * 1e3:.3f} | {c_r * 1e3:.3f} | {c_o / c_r:.2f}x |"
        )
    print(f"# load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
