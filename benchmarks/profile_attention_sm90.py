"""One bf16 causal attention call of ours and one of cuDNN's on the same inputs, for Nsight Compute.

    ncu --clock-control none --set full -k regex:"flash_attention_|cudnn" \
        python benchmarks/profile_attention_sm90.py D HQ HKV B T [--backward] [--kernel auto|sm90|mma]

Our forward (and with --backward our backward) through euler-kernels (--kernel: which family of ours, a
Precision's attention_kernel; auto is Hopper's wgmma kernels on 9.x), then PyTorch's SDPA under the cuDNN
backend (K and V expanded to the query heads, as bench_attention_gpu.py gives them). Each runs once after
nothing else, so every kernel ncu matches is one call. Per-instruction stall samples: add
`--import-source yes -o REPORT`, then `ncu --import REPORT.ncu-rep --page source --print-source sass --csv`.
"""

from __future__ import annotations

import argparse

import cupy as cp
import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from euler_kernels.attention.flash_attention import (
    flash_attention_backward_bf16,
    flash_attention_forward_bf16,
)
from euler_kernels.cuda import cast


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("D", "HQ", "HKV", "B", "T"):
        parser.add_argument(name, type=int)
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--kernel", default="auto", choices=["auto", "sm90", "mma"], help="our kernel family")
    args = parser.parse_args()
    D, Hq, Hkv, B, T = args.D, args.HQ, args.HKV, args.B, args.T
    rng = np.random.default_rng(0)
    shapes = [(B, T, Hq, D), (B, T, Hkv, D), (B, T, Hkv, D), (B, T, Hq, D)]
    q, k, v, g = (cast.to_bf16(cp.asarray(rng.standard_normal(s, dtype=np.float32))) for s in shapes)
    out, lse = flash_attention_forward_bf16(q, k, v, True, args.kernel)
    if args.backward:
        flash_attention_backward_bf16(g, q, k, v, out, lse, True, args.kernel)
    cp.cuda.Device().synchronize()

    def to_torch(a, expand: bool):  # (B, H, T, D) bf16
        t = torch.as_tensor(cast.from_bf16(a), device="cuda").to(torch.bfloat16).transpose(1, 2)
        return (t.repeat_interleave(Hq // Hkv, 1) if expand else t).contiguous()

    tq, tk, tv = (to_torch(a, e).requires_grad_(args.backward) for a, e in ((q, False), (k, True), (v, True)))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        if args.backward:
            F.scaled_dot_product_attention(tq, tk, tv, is_causal=True).backward(to_torch(g, False))
        else:
            with torch.no_grad():
                F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
