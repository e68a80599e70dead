"""GPU kernels vs PyTorch on the same H200, same shapes, fp32 (no TF32 in these kernels).

    python benchmarks/bench_kernels_gpu.py [--quick] [--attention-kernel auto|sm90|mma]

Prints FlashAttention forward+backward time and TFLOP/s against torch's scaled_dot_product_attention
(fp32 selects its memory-efficient kernel; bf16 its FlashAttention kernel), and the fused rmsnorm /
swiglu / cross-entropy / AdamW kernels' GB/s against the measured device-to-device copy bandwidth and
against torch eager.
"""

from __future__ import annotations

import argparse

import cupy as cp
import numpy as np
import torch
import torch.nn.functional as F

from euler_kernels.attention import flash_attention
from euler_kernels.attention.flash_attention import (
    flash_attention_backward_bf16,
    flash_attention_forward_bf16,
)
from euler_kernels.cross_entropy import cross_entropy_cuda as cross_entropy
from euler_kernels.cuda import cast
from euler_kernels.optim import multi_tensor
from euler_kernels.rmsnorm import rmsnorm_cuda as rmsnorm
from euler_kernels.swiglu import swiglu_cuda as swiglu


def time_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of one synchronised call of fn(), measured with CUDA events on the default
    stream (the host's launch latency inside the call counts)."""
    return queued_ms(fn, reps, calls=1, warmup=warmup)


def queued_ms(fn, reps: int = 20, calls: int = 10, warmup: int = 3) -> float:
    """Median milliseconds of device time per call of fn(): `calls` calls queued back to back between two
    CUDA events, so that the host's launch latency (Python, argument checks) overlaps the device's work
    instead of being counted, as it is in a training step replayed from a CUDA graph."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / calls)
    return float(np.median(times))


def graph_ms(fn, reps: int = 20, calls: int = 10) -> float:
    """Median milliseconds of device time per call of fn() (CuPy work) replayed from a CUDA graph of `calls`
    calls, captured after a warm-up call, with a memory pool of its own (allocations inside the capture
    reuse the warm-up's blocks): no host work at all, as in a captured training step."""
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    with cp.cuda.using_allocator(pool.malloc), stream:
        fn()
        stream.synchronize()
        stream.begin_capture()
        for _ in range(calls):
            fn()
        graph = stream.end_capture()
    graph.launch(stream)
    times = []
    for _ in range(reps):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        graph.launch(stream)
        end.record(stream)
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / calls)
    return float(np.median(times))


def copy_bandwidth() -> float:
    """Device-to-device copy GB/s counting bytes read plus written."""
    a = cp.random.standard_normal(256 * 2**20, dtype=cp.float32)  # 1 GiB
    b = cp.empty_like(a)
    ms = time_ms(lambda: b.__setitem__(slice(None), a))
    return 2 * a.nbytes / ms / 1e6


def attention_inputs(B: int, T: int, Hq: int, Hkv: int, D: int) -> tuple:
    """q, dout (B, T, Hq, D) and k, v (B, T, Hkv, D): float32 normals on the GPU, seed 0."""
    rng = np.random.default_rng(0)
    return tuple(
        cp.asarray(rng.standard_normal(s, dtype=np.float32))
        for s in [(B, T, Hq, D), (B, T, Hkv, D), (B, T, Hkv, D), (B, T, Hq, D)]
    )


def attention_timings(ours, reference, err: float, B: int, T: int, Hq: int, D: int, **more_timers) -> dict:
    """Times ours and the reference (fwd+bwd), then each extra timer; TFLOP/s of the fwd+bwd pair."""
    flops = 3.5 * 4 * B * Hq * T * T * D / 2  # causal forward 2 matmuls, backward 2.5x forward
    ms_ours, ms_ref = time_ms(ours), time_ms(reference)
    result = {"ours_ms": ms_ours, "torch_ms": ms_ref}
    result.update({name: time_ms(fn) for name, fn in more_timers.items()})
    result.update(ours_tflops=flops / ms_ours / 1e9, torch_tflops=flops / ms_ref / 1e9, rel_err=err)
    return result


def bench_attention(B: int, T: int, tf32: bool, Hq=12, Hkv=4, D=64) -> dict:
    q, k, v, g = attention_inputs(B, T, Hq, Hkv, D)

    def ours():
        out, lse = flash_attention.flash_attention_forward(q, k, v, True, tf32)
        flash_attention.flash_attention_backward(g, q, k, v, out, lse, True, tf32)

    # torch reference: (B, H, T, D) layout, K/V expanded to the query heads beforehand (not timed)
    tq = torch.as_tensor(q, device="cuda").transpose(1, 2).contiguous().requires_grad_()
    tk = torch.as_tensor(k, device="cuda").transpose(1, 2).repeat_interleave(Hq // Hkv, 1).contiguous()
    tv = torch.as_tensor(v, device="cuda").transpose(1, 2).repeat_interleave(Hq // Hkv, 1).contiguous()
    tk.requires_grad_()
    tv.requires_grad_()
    tg = torch.as_tensor(g, device="cuda").transpose(1, 2).contiguous()

    def reference():
        out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
        out.backward(tg)

    # check agreement once before timing
    out, _ = flash_attention.flash_attention_forward(q, k, v, True, tf32)
    with torch.no_grad():
        ref = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True).transpose(1, 2)
    err = float((torch.as_tensor(out, device="cuda") - ref).norm() / ref.norm())
    return attention_timings(ours, reference, err, B, T, Hq, D)


def bench_attention_bf16(B: int, T: int, kernel: str = "auto", Hq=12, Hkv=4, D=64) -> dict:
    """Our bf16 kernel (bf16 bit patterns in, fp32 gradients out) against torch's SDPA on bf16 tensors;
    kernel: which family of ours runs (auto, sm90, mma: a Precision's attention_kernel)."""
    q, k, v, g = attention_inputs(B, T, Hq, Hkv, D)
    q16, k16, v16, g16 = (cast.to_bf16(a) for a in (q, k, v, g))

    def ours_forward():
        return flash_attention_forward_bf16(q16, k16, v16, True, kernel)

    def ours():
        out16, lse = ours_forward()
        flash_attention_backward_bf16(g16, q16, k16, v16, out16, lse, True, kernel)

    def to_torch(a, expand: bool):  # (B, H, T, D) bf16 (the same rounding as to_bf16), K/V expanded untimed
        t = torch.as_tensor(a, device="cuda").to(torch.bfloat16).transpose(1, 2)
        return (t.repeat_interleave(Hq // Hkv, 1) if expand else t).contiguous()

    tq, tk, tv = to_torch(q, False), to_torch(k, True), to_torch(v, True)
    for t in (tq, tk, tv):
        t.requires_grad_()
    tg = to_torch(g, False)

    def reference_forward():
        with torch.no_grad():
            return F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)

    def reference():
        F.scaled_dot_product_attention(tq, tk, tv, is_causal=True).backward(tg)

    out16, _ = ours_forward()  # check agreement once before timing
    ref = reference_forward().transpose(1, 2).float()
    err = float((torch.as_tensor(cast.from_bf16(out16), device="cuda") - ref).norm() / ref.norm())
    return attention_timings(
        ours, reference, err, B, T, Hq, D, ours_fwd_ms=ours_forward, torch_fwd_ms=reference_forward
    )


def bench_fused(bandwidth: float, N=16384, C=768, F_=2048, V=4096, n_params=116_417_280) -> list[tuple]:
    rng = np.random.default_rng(1)
    rows = []
    x, w, g = (cp.asarray(rng.standard_normal(s, dtype=np.float32)) for s in [(N, C), (C,), (N, C)])
    tx, tw, tg = (torch.as_tensor(a, device="cuda").clone().requires_grad_(a is not g) for a in (x, w, g))

    def rms_ours():
        _, rstd = rmsnorm.rmsnorm_forward(x, w, 1e-5)
        rmsnorm.rmsnorm_backward(g, x, w, rstd)

    def rms_torch():
        F.rms_norm(tx, (C,), tw, 1e-5).backward(tg)

    rows.append(("rmsnorm fwd+bwd", 5 * N * C * 4, time_ms(rms_ours), time_ms(rms_torch)))

    gate, up, dy = (cp.asarray(rng.standard_normal((N, F_), dtype=np.float32)) for _ in range(3))
    tgate, tup = (torch.as_tensor(a, device="cuda").clone().requires_grad_() for a in (gate, up))
    tdy = torch.as_tensor(dy, device="cuda")

    def swiglu_ours():
        swiglu.swiglu_forward(gate, up)
        swiglu.swiglu_backward(dy, gate, up)

    def swiglu_torch():
        (F.silu(tgate) * tup).backward(tdy)

    rows.append(("swiglu fwd+bwd", 8 * N * F_ * 4, time_ms(swiglu_ours), time_ms(swiglu_torch)))

    logits = cp.asarray(rng.standard_normal((N, V), dtype=np.float32))
    targets = cp.asarray(rng.integers(0, V, N))
    weight = cp.ones(N, dtype=cp.float32)
    scale = cp.asarray([1.0 / N], dtype=cp.float32)
    tlogits = torch.as_tensor(logits, device="cuda").clone().requires_grad_()
    ttargets = torch.as_tensor(targets, device="cuda")

    def ce_ours():
        _, lse = cross_entropy.cross_entropy_forward(logits, targets, weight)
        cross_entropy.cross_entropy_backward(logits, lse, targets, weight, scale)

    def ce_torch():
        F.cross_entropy(tlogits, ttargets).backward()

    rows.append(("cross-entropy fwd+bwd", 3 * N * V * 4, time_ms(ce_ours), time_ms(ce_torch)))

    sizes = [n_params // 100] * 100
    params, ms, vs, grads = (
        [cp.asarray(rng.standard_normal(s, dtype=np.float32)) for s in sizes] for _ in range(4)
    )
    tparams = [torch.nn.Parameter(torch.as_tensor(p, device="cuda").clone()) for p in params]
    for tp, gr in zip(tparams, grads):
        tp.grad = torch.as_tensor(gr, device="cuda").clone()
    opt = torch.optim.AdamW(tparams, lr=1e-4, weight_decay=0.1, fused=True)
    rows.append(
        (
            "AdamW (116M params)",
            7 * n_params * 4,
            time_ms(
                lambda: multi_tensor.adamw_multi(
                    params, ms, vs, grads, [0.1] * 100, (1 - 0.9**10, 1 - 0.95**10), 1e-4, 0.9, 0.95, 1e-8
                )
            ),
            time_ms(opt.step),
        )
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--attention-kernel",
        default="auto",
        choices=["auto", "sm90", "mma"],
        help="our bf16 FlashAttention kernels: auto (Hopper's wgmma on 9.x, else mma.sync), sm90 or mma",
    )
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, cupy {cp.__version__}")
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth (read+write): {bandwidth:.0f} GB/s")
    shapes = [(32, 512)] if args.quick else [(32, 512), (8, 2048), (2, 8192)]
    for tf32 in (False, True):
        kind = "TF32 tensor cores (mma.sync)" if tf32 else "fp32 FMA units"
        print(f"\nFlashAttention fwd+bwd, ours on {kind}; causal, 12 q / 4 kv heads, head_dim 64")
        print(
            f"{'B x T':>10} {'ours ms':>9} {'torch ms':>9} {'ours TF/s':>10} {'torch TF/s':>11}"
            f" {'speed':>7} {'rel err':>9}"
        )
        for B, T in shapes:
            r = bench_attention(B, T, tf32)
            print(
                f"{B:>4} x {T:<5} {r['ours_ms']:9.3f} {r['torch_ms']:9.3f} {r['ours_tflops']:10.1f} "
                f"{r['torch_tflops']:11.1f} {r['torch_ms'] / r['ours_ms']:6.2f}x {r['rel_err']:9.1e}"
            )
    print("\nFlashAttention fwd+bwd in bf16, ours (mma.sync m16n8k16) vs torch SDPA; causal, 12 q / 4 kv")
    print(
        f"{'B x T':>10} {'ours ms':>9} {'torch ms':>9} {'ours TF/s':>10} {'torch TF/s':>11}"
        f" {'speed':>7} {'fwd ours':>9} {'fwd torch':>10} {'rel err':>9}"
    )
    for B, T in shapes:
        r = bench_attention_bf16(B, T, args.attention_kernel)
        print(
            f"{B:>4} x {T:<5} {r['ours_ms']:9.3f} {r['torch_ms']:9.3f} {r['ours_tflops']:10.1f} "
            f"{r['torch_tflops']:11.1f} {r['torch_ms'] / r['ours_ms']:6.2f}x {r['ours_fwd_ms']:9.3f} "
            f"{r['torch_fwd_ms']:10.3f} {r['rel_err']:9.1e}"
        )
    print("\nFused kernels (minimal bytes moved; GB/s as a share of the copy bandwidth)")
    print(f"{'op':>24} {'ours ms':>9} {'torch ms':>9} {'ours GB/s':>10} {'% copy':>7} {'speed':>7}")
    for name, nbytes, ours, ref in bench_fused(bandwidth):
        gbs = nbytes / ours / 1e6
        print(
            f"{name:>24} {ours:9.3f} {ref:9.3f} {gbs:10.0f} {100 * gbs / bandwidth:6.0f}% {ref / ours:6.2f}x"
        )


if __name__ == "__main__":
    main()
