"""bf16 causal GQA FlashAttention: ours (each kernel family) against every PyTorch SDPA backend, one run.

    python benchmarks/bench_attention_gpu.py [--rows 0,2] [--reps 20]

Rows: six of 16K tokens a call (T 512, 2048, 8192; D 64 and 128), then lengths that are no tile's multiple
(1000, 3000, 5000), T 16384 and GQA groups 1 to 8. For each: forward and forward+backward milliseconds of our
Hopper wgmma kernels (flash_attention_sm90.cu), our mma.sync kernels (flash_attention_bf16.cu) and
`scaled_dot_product_attention` under each `torch.nn.attention.sdpa_kernel` backend that runs the shape
(cuDNN, flash, memory-efficient; K/V expanded to the query heads beforehand, untimed), the ratio of ours
to the fastest backend, and TFLOP/s counting the causal work (half the square: 4 B Hq T^2 D / 2 forward,
2.5x that backward). Times are device time per call, 10 calls queued between two CUDA events (queued_ms:
the host's launch latency overlaps the device's work as long as the host is faster than the device). The
column "graph fwd" replays 10 forward calls captured in a CUDA graph (each side's own: CuPy's for ours,
PyTorch's for SDPA), as a captured training step runs them: no host work at all, which matters where a
call takes less device time than its Python takes (T 512). The last column, "one call", is a single
synchronised call (time_ms), which adds each side's host latency. Errors are
‖ours − ref‖ / ‖ref‖ against a float32 reference (SDPA memory-efficient backend on the bf16 inputs upcast
to float32); gradients are compared in float32.
"""

from __future__ import annotations

import argparse

import cupy as cp
import numpy as np
import torch
import torch.nn.functional as F
from bench_kernels_gpu import graph_ms, queued_ms, time_ms  # the CUDA-event medians of the GPU benchmarks
from torch.nn.attention import SDPBackend, sdpa_kernel

import euler_kernels as ek
from euler_kernels.attention.flash_attention import (
    flash_attention_backward_bf16,
    flash_attention_forward_bf16,
)
from euler_kernels.cuda import cast

ROWS = [  # (head_dim, Hq, Hkv, B, T)
    (64, 12, 4, 32, 512),
    (64, 12, 4, 8, 2048),
    (64, 12, 4, 2, 8192),
    (128, 16, 4, 32, 512),
    (128, 16, 4, 8, 2048),
    (128, 16, 4, 2, 8192),
    # lengths that are no tile's multiple, T to 16384, GQA groups 1 to 8
    (64, 12, 4, 16, 1000),
    (128, 12, 2, 4, 3000),
    (128, 8, 8, 2, 5000),
    (128, 16, 2, 2, 5000),
    (64, 8, 1, 4, 3000),
    (128, 32, 8, 1, 16384),
]
BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}
FAMILIES = ("sm90", "mma")  # our kernel families: a Precision's attention_kernel


def rel(a, b) -> float:
    a, b = torch.as_tensor(a, device="cuda").float(), b.float()
    return float((a - b).norm() / b.norm())


def torch_graph_ms(fn, reps: int, calls: int = 10) -> float:
    """bench_kernels_gpu.graph_ms for PyTorch work, through torch.cuda.CUDAGraph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return float(np.median(times))


def bench_row(D, Hq, Hkv, B, T, reps) -> dict:
    rng = np.random.default_rng(T + D)
    shapes = [(B, T, Hq, D), (B, T, Hkv, D), (B, T, Hkv, D), (B, T, Hq, D)]
    q16, k16, v16, g16 = (cast.to_bf16(cp.asarray(rng.standard_normal(s, dtype=np.float32))) for s in shapes)

    def to_torch(a, expand: bool, dtype):  # (B, H, T, D), K/V expanded to the query heads
        t = torch.as_tensor(cast.from_bf16(a), device="cuda").to(dtype).transpose(1, 2)
        return (t.repeat_interleave(Hq // Hkv, 1) if expand else t).contiguous()

    # float32 reference on the same bf16 values
    rq, rk, rv = (to_torch(a, e, torch.float32).requires_grad_() for a, e in ((q16, 0), (k16, 1), (v16, 1)))
    rg = to_torch(g16, False, torch.float32)
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        ref = F.scaled_dot_product_attention(rq, rk, rv, is_causal=True)
        ref.backward(rg)
    ref_out = ref.detach().transpose(1, 2)
    # kv gradients of the expanded heads, summed back onto their kv head: (B, T, Hkv, D)
    ref_dk = rk.grad.view(B, Hkv, Hq // Hkv, T, D).sum(2).transpose(1, 2)
    ref_dv = rv.grad.view(B, Hkv, Hq // Hkv, T, D).sum(2).transpose(1, 2)
    ref_dq = rq.grad.transpose(1, 2)
    del rq, rk, rv, rg, ref

    flops_fwd = 4 * B * Hq * T * T * D / 2
    result = {"row": (D, Hq, Hkv, B, T)}
    for family in FAMILIES:
        if family == "sm90" and not cp.cuda.Device().compute_capability.startswith("9"):
            continue
        out16, lse = flash_attention_forward_bf16(q16, k16, v16, True, family)
        dq, dk, dv = flash_attention_backward_bf16(g16, q16, k16, v16, out16, lse, True, family)
        errors = (rel(cast.from_bf16(out16), ref_out), rel(dq, ref_dq), rel(dk, ref_dk), rel(dv, ref_dv))

        def forward(family=family):
            return flash_attention_forward_bf16(q16, k16, v16, True, family)

        def both(family=family):
            o, s = flash_attention_forward_bf16(q16, k16, v16, True, family)
            flash_attention_backward_bf16(g16, q16, k16, v16, o, s, True, family)

        times = (queued_ms(forward, reps), queued_ms(both, reps))
        result[family] = (*times, errors, time_ms(forward, reps), graph_ms(forward, reps))

    # as a user calls it: the public op and its backward (the default kernel family), one synchronised call
    def op_forward():
        return ek.attention_forward(q16, k16, v16, True, precision=ek.Precision("bf16"))

    def op_both():
        ek.attention_backward(g16, op_forward()[1])

    result["user"] = {"ours (ek.attention_*)": (time_ms(op_forward, reps), time_ms(op_both, reps))}

    tq, tk, tv = (to_torch(a, e, torch.bfloat16).requires_grad_() for a, e in ((q16, 0), (k16, 1), (v16, 1)))
    tg = to_torch(g16, False, torch.bfloat16)
    for name, backend in BACKENDS.items():
        try:
            with sdpa_kernel(backend):

                def forward():
                    with torch.no_grad():
                        return F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)

                def both():
                    F.scaled_dot_product_attention(tq, tk, tv, is_causal=True).backward(tg)

                times = (queued_ms(forward, reps), queued_ms(both, reps))
                result[name] = (*times, None, time_ms(forward, reps), torch_graph_ms(forward, reps))
                result["user"][name] = (result[name][3], time_ms(both, reps))
        except RuntimeError as error:  # the backend does not run this shape
            result[name] = str(error).splitlines()[0][:60]
    result["flops_fwd"] = flops_fwd
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default=",".join(str(i) for i in range(len(ROWS))))
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, cupy {cp.__version__}")
    results = [bench_row(*ROWS[int(i)], args.reps) for i in args.rows.split(",")]
    print("\nms forward / forward+backward (queued); TF/s of the causal work; ratio = fastest SDPA / ours;")
    print("graph fwd = forward replayed from a CUDA graph (ratio against the fastest SDPA's, also replayed);")
    print("one call = a single synchronised forward, host latency included; 'as a user calls it' = the")
    print("public op and its backward against SDPA, one synchronised call each (ratio = fastest SDPA / ours)")
    for r in results:
        D, Hq, Hkv, B, T = r["row"]
        timed = {k: v for k, v in r.items() if isinstance(v, tuple) and k != "row"}
        refs = {k: v for k, v in timed.items() if k in BACKENDS}
        best_f = min(v[0] for v in refs.values())
        best_b = min(v[1] for v in refs.values())
        best_g = min(v[4] for v in refs.values())
        print(f"\nD {D}, {Hq}/{Hkv} heads, {B} x {T}: fastest SDPA fwd {best_f:.3f}, fwd+bwd {best_b:.3f} ms")
        for name, (f, b, errors, one, g) in timed.items():
            line = (
                f"  {name:>10} {f:8.3f} / {b:8.3f} ms  {r['flops_fwd'] / f / 1e9:6.0f} / "
                f"{3.5 * r['flops_fwd'] / b / 1e9:6.0f} TF/s  {best_f / f:5.2f}x / {best_b / b:5.2f}x"
                f"  graph fwd {g:.3f} ms {best_g / g:5.2f}x  one call {one:.3f} ms"
            )
            if errors:
                line += "  err out {:.1e} dq {:.1e} dk {:.1e} dv {:.1e}".format(*errors)
            print(line)
        for name, why in r.items():
            if isinstance(why, str):
                print(f"  {name:>10} did not run: {why}")
        user = r["user"]
        ours = user.pop("ours (ek.attention_*)")
        best = [min(v[i] for v in user.values()) for i in (0, 1)]
        print(
            f"  as a user calls it: ours fwd {ours[0]:.3f} / fwd+bwd {ours[1]:.3f} ms, fastest SDPA "
            f"{best[0]:.3f} / {best[1]:.3f} ms: {best[0] / ours[0]:.2f}x / {best[1] / ours[1]:.2f}x"
        )


if __name__ == "__main__":
    main()
