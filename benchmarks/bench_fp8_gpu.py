"""FP8 (e4m3 activations and weights, e5m2 gradients, cuBLASLt) against bf16 (cuBLAS) for one SwiGLU MLP
block's matrix products and for the output head, forward and backward, at a preset's shapes, on one GPU.

    python benchmarks/bench_fp8_gpu.py [--preset 1b --context 1024 --batch 8] [--pieces]

Each path is captured once as a CUDA graph and replayed, so the figures are device time. The FP8 path
includes every cast it needs (each activation and gradient: its absolute maximum, then its FP8 copy,
row-major and transposed for the weight gradients; the weights' FP8 copies are counted apart, once a
step). Variants: "amax given" leaves the absolute-maximum passes out (what fusing them into the kernels
that make the tensors would save), and "fwd+dgrad" keeps the weight gradients in bf16. Prints ms per
block, the step's total over the blocks and the head, and how far the FP8 outputs are from bf16's.
--pieces also times each piece of the FP8 path alone (each tensor's absolute maximum, its cast, each
product) against the bytes it moves, to see which of them is below the memory's or the tensor cores' rate.
"""

from __future__ import annotations

import argparse

import cupy as cp
import numpy as np
from bench_kernels_gpu import graph_ms  # the CUDA-graph median of the other GPU benchmarks

from euler_kernels.cuda import cast
from euler_kernels.matmul import fp8
from euler_kernels.matmul.gemm import gemm_bf16
from euler_kernels.matmul.gemm_fp8 import gemm_fp8, transposed
from euler_model.config import preset


def bf16(rng, *shape, scale=1.0):
    return cast.to_bf16(cp.asarray((rng.standard_normal(shape) * scale).astype(np.float32)))


def mlp_paths(n: int, c: int, f: int, rng) -> dict:
    """The products of one MLP block (h (n, c) -> gate, up (n, f) -> s -> out (n, c)) and their gradients,
    as bf16 and as FP8 variants: name -> (function, its outputs for comparison)."""
    h, s = bf16(rng, n, c), bf16(rng, n, f)
    d, g, u = bf16(rng, n, c, scale=1e-3), bf16(rng, n, f, scale=1e-3), bf16(rng, n, f, scale=1e-3)
    shapes = ((f, c), (f, c), (c, f))  # gate, up, down
    w = [cp.asarray((rng.standard_normal(sh) * sh[1] ** -0.5).astype(np.float32)) for sh in shapes]
    w16 = [cast.to_bf16(x) for x in w]
    w8 = [fp8.to_fp8(x, "e4m3", rows=True, cols=True) for x in w]
    wg16, wu16, wd16 = w16
    wg8, wu8, wd8 = w8
    out: dict = {}

    def run_bf16():
        out["bf16"] = [
            gemm_bf16(h, wg16, trans_b=True, bf16_out=True), gemm_bf16(h, wu16, trans_b=True, bf16_out=True),
            gemm_bf16(s, wd16, trans_b=True),  # forward
            gemm_bf16(d, wd16, bf16_out=True), gemm_bf16(d, s, trans_a=True),  # down's dx, dW
            gemm_bf16(g, wg16), gemm_bf16(g, h, trans_a=True), gemm_bf16(u, h, trans_a=True),  # gate/up dW
        ]  # fmt: skip
        gemm_bf16(u, wu16, out=out["bf16"][5])  # dh = g Wg + u Wu

    measured = {id(x): fp8.amax_bits(x) for x in (h, s, d, g, u)}  # for "amax given": made outside the graph

    def run_fp8(amax_given: bool, fp8_wgrad: bool):
        def cast_(x, fmt):
            return fp8.to_fp8(x, fmt, rows=True, cols=fp8_wgrad, amax=measured[id(x)] if amax_given else None)

        h8, s8 = cast_(h, "e4m3"), cast_(s, "e4m3")
        d8, g8, u8 = cast_(d, "e5m2"), cast_(g, "e5m2"), cast_(u, "e5m2")
        fwd = [gemm_fp8(h8, wg8), gemm_fp8(h8, wu8), gemm_fp8(s8, wd8, bf16_out=False)]
        dx = gemm_fp8(d8, transposed(wd8))
        dh = gemm_fp8(g8, transposed(wg8), bf16_out=False)
        gemm_fp8(u8, transposed(wu8), out=dh)
        if fp8_wgrad:
            dws = [gemm_fp8(transposed(d8), transposed(s8), bf16_out=False),
                   gemm_fp8(transposed(g8), transposed(h8), bf16_out=False),
                   gemm_fp8(transposed(u8), transposed(h8), bf16_out=False)]  # fmt: skip
        else:
            dws = [gemm_bf16(a, b, trans_a=True) for a, b in ((d, s), (g, h), (u, h))]
        out["fp8"] = [*fwd, dx, dws[0], dh, dws[1], dws[2]]

    def weights_fp8():
        return [fp8.to_fp8(x, "e4m3", rows=True, cols=True) for x in w]

    def weights_bf16():
        return [cast.to_bf16(x) for x in w]

    return {
        "bf16": run_bf16,
        "fp8": lambda: run_fp8(False, True),
        "fp8, amax given": lambda: run_fp8(True, True),
        "fp8 fwd+dgrad": lambda: run_fp8(False, False),
        "weights -> bf16": weights_bf16,
        "weights -> fp8": weights_fp8,
        "outputs": out,
    }


def head_paths(n: int, c: int, v: int, rng) -> dict:
    """The output head: logits (n, v) = h (n, c) @ W (v, c)^T, dh = dl W, dW = dl^T h."""
    h, dl = bf16(rng, n, c), bf16(rng, n, v, scale=1e-5)
    w = cp.asarray((rng.standard_normal((v, c)) * c**-0.5).astype(np.float32))
    w16, w8 = cast.to_bf16(w), fp8.to_fp8(w, "e4m3", rows=True, cols=True)

    def run_bf16():
        return gemm_bf16(h, w16, trans_b=True), gemm_bf16(dl, w16), gemm_bf16(dl, h, trans_a=True)

    def run_fp8():
        h8, dl8 = fp8.to_fp8(h, "e4m3", cols=True), fp8.to_fp8(dl, "e5m2", cols=True)
        return (gemm_fp8(h8, w8, bf16_out=False), gemm_fp8(dl8, transposed(w8), bf16_out=False),
                gemm_fp8(transposed(dl8), transposed(h8), bf16_out=False))  # fmt: skip

    return {"bf16": run_bf16, "fp8": run_fp8}


def pieces(n: int, c: int, f: int, rng) -> None:
    """Each piece of one MLP block's FP8 path timed alone (a graph per piece): GB/s for the absolute
    maximum and the casts (bytes read and written), TFLOP/s for the products."""
    copy = cp.empty(256 * 2**20, dtype=cp.uint8)
    dest = cp.empty_like(copy)
    copy_gbs = 2 * copy.nbytes / graph_ms(lambda: dest.__setitem__(slice(None), copy)) / 1e6
    print(f"\npieces of one MLP block (device-to-device copy: {copy_gbs:.0f} GB/s, read + written):")
    tensors = {"h": bf16(rng, n, c), "s": bf16(rng, n, f), "g": bf16(rng, n, f, scale=1e-3)}
    for name, x in tensors.items():
        amax = fp8.amax_bits(x)
        rows = {"rows": (True, False), "rows+cols": (True, True)}
        ms = graph_ms(lambda x=x: fp8.amax_bits(x))
        print(f"  amax {name} {x.shape}: {ms * 1e3:7.1f} us, {x.nbytes / ms / 1e6:6.0f} GB/s")
        for label, (r, k) in rows.items():
            ms = graph_ms(lambda x=x, r=r, k=k, a=amax: fp8.to_fp8(x, "e4m3", rows=r, cols=k, amax=a))
            moved = x.nbytes + x.size * (int(r) + int(k))
            print(f"  cast {name} {label:9s}: {ms * 1e3:7.1f} us, {moved / ms / 1e6:6.0f} GB/s")
    h8 = fp8.to_fp8(tensors["h"], "e4m3", cols=True)
    g8 = fp8.to_fp8(tensors["g"], "e5m2", cols=True)
    w8 = fp8.to_fp8(cp.asarray(rng.standard_normal((f, c)).astype(np.float32)), "e4m3", cols=True)
    products = {
        "gate (h W^T)": lambda: gemm_fp8(h8, w8),
        "gate dx (g W)": lambda: gemm_fp8(g8, transposed(w8), bf16_out=False),
        "gate dW (g^T h)": lambda: gemm_fp8(transposed(g8), transposed(h8), bf16_out=False),
    }
    for name, fn in products.items():
        ms = graph_ms(fn)
        print(f"  {name:16s}: {ms * 1e3:7.1f} us, {2 * n * c * f / ms / 1e9:6.0f} TFLOP/s")


def relative(a, b) -> float:
    a = cast.from_bf16(a) if a.dtype == cp.uint16 else a
    b = cast.from_bf16(b) if b.dtype == cp.uint16 else b
    return float(cp.linalg.norm(a - b) / cp.linalg.norm(b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="1b")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--pieces", action="store_true", help="also time each piece of the FP8 path")
    args = parser.parse_args()
    cfg = preset(args.preset)
    n = args.batch * args.context
    gpu = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"preset {args.preset}: dim {cfg.dim}, ffn {cfg.ffn_dim}, {cfg.n_layers} layers, "
          f"vocab {cfg.vocab_size}, {n} tokens ({args.batch} x {args.context}); {gpu}")  # fmt: skip
    rng = np.random.default_rng(0)
    paths = mlp_paths(n, cfg.dim, cfg.ffn_dim, rng)
    outputs = paths.pop("outputs")
    times = {name: graph_ms(fn) for name, fn in paths.items()}
    names = ["gate", "up", "down", "down dx", "down dW", "gate+up dx", "gate dW", "up dW"]
    paths["bf16"]()
    paths["fp8"]()
    pairs = zip(names, outputs["fp8"], outputs["bf16"])
    errors = ", ".join(f"{name} {relative(a, b):.1e}" for name, a, b in pairs)
    flops = 2 * n * cfg.dim * cfg.ffn_dim * 9
    print(f"\nMLP block ({9 * 2 * n * cfg.dim * cfg.ffn_dim / 1e12:.2f} TFLOP a step per block):")
    for name, ms in times.items():
        rate = f"{flops / ms / 1e9:6.0f} TFLOP/s" if name.startswith(("bf16", "fp8")) else ""
        print(f"  {name:18s} {ms:8.3f} ms a block {ms * cfg.n_layers:8.2f} ms a step  {rate}")
    print(f"  fp8 against bf16, relative: {errors}")
    head = head_paths(n, cfg.dim, cfg.vocab_size, rng)
    head_times = {name: graph_ms(fn) for name, fn in head.items()}
    head_errors = [relative(a, b) for a, b in zip(head["fp8"](), head["bf16"]())]
    print(
        f"\nhead: bf16 {head_times['bf16']:.3f} ms, fp8 {head_times['fp8']:.3f} ms "
        f"(relative difference logits / dh / dW: {', '.join(f'{e:.1e}' for e in head_errors)})"
    )
    for variant in ("fp8", "fp8, amax given", "fp8 fwd+dgrad"):
        saved = (times["bf16"] - times[variant]) * cfg.n_layers
        saved_w = (times["weights -> bf16"] - times["weights -> fp8"]) * cfg.n_layers
        print(
            f"step saving, MLP {variant:16s}: {saved:6.2f} ms (weights' copies {saved_w:+.2f} ms), "
            f"with the fp8 head {saved + saved_w + head_times['bf16'] - head_times['fp8']:6.2f} ms"
        )
    if args.pieces:
        pieces(n, cfg.dim, cfg.ffn_dim, rng)


if __name__ == "__main__":
    main()
