"""RMSNorm's vectorised kernels (rmsnorm.cu, -D ROW_TEAM) with one, two and four warps per row, timed in one
run: the residual-add forward with a bf16 output and the backward that adds the residual's gradient (the
two the training step runs), at the widths of the presets.

    python benchmarks/tune_rmsnorm_gpu.py [--blocks]

Each line prints the device time per call (CUDA-event median of queued calls), the bytes moved per second,
and the largest difference from one warp per row (the outputs' bf16 bit patterns, rstd, dx, dweight: only
the order of the row's sums changes). The launcher's rule (rmsnorm/rmsnorm_cuda.py `_rmsnorm_vec`) is what
these figures chose.

--blocks times instead the backward the bf16 step runs (bf16 dout, the residual's gradient added, a bf16
copy of dx) with grids of 1, 2, 4 and 8 blocks an SM (rmsnorm.BACKWARD_BLOCKS_PER_SM: few blocks, as each adds
its dweight sums with atomics once; more blocks, more rows in flight).
"""

from __future__ import annotations

import argparse
import functools

import cupy as cp
from bench_kernels_gpu import queued_ms

from euler_kernels.rmsnorm import rmsnorm_cuda as rmsnorm

WIDTHS = [(768, 16384), (1024, 16384), (1152, 8192), (2048, 8192)]  # (C, rows): gpu, 350m, -, 1b


def run_team(team: int, x, branch, dout, add, weight) -> tuple[float, float, list]:
    """(forward ms, backward ms, outputs as float32) with `team` warps per row."""
    chosen = rmsnorm._rmsnorm_vec
    rmsnorm._rmsnorm_vec = lambda c: {"ROW_F4": c // 128, "ROW_TEAM": team}
    try:
        forward = functools.partial(rmsnorm.residual_rmsnorm_forward, x, branch, weight, 1e-5, bf16_out=True)
        total, out, rstd = forward()
        backward = functools.partial(rmsnorm.rmsnorm_backward, dout, total, weight, rstd, add)
        dx, dweight, _ = backward()
        outs = [a.astype(cp.float32) for a in (out, rstd, dx, dweight)]
        return queued_ms(forward), queued_ms(backward), outs
    finally:
        rmsnorm._rmsnorm_vec = chosen


def run_blocks() -> None:
    """The step's backward (bf16 dout, add, bf16 copy) with grids of 1, 2, 4, 8 blocks an SM."""
    chosen = rmsnorm.BACKWARD_BLOCKS_PER_SM
    for width, n in WIDTHS:
        rng = cp.random.default_rng(0)
        x, add = (rng.standard_normal((n, width), dtype=cp.float32) for _ in range(2))
        dout16 = (rng.standard_normal((n, width), dtype=cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)
        weight = rng.standard_normal(width, dtype=cp.float32)
        rstd = rng.random(n, dtype=cp.float32) + 0.5
        backward = functools.partial(rmsnorm.rmsnorm_backward, dout16, x, weight, rstd, add, bf16_copy=True)
        line = []
        try:
            for per_sm in (1, 2, 4, 8):
                rmsnorm.BACKWARD_BLOCKS_PER_SM = per_sm
                ms = queued_ms(backward)
                moved = n * width * (2 + 4 + 4 + 4 + 2)  # dout, x, add in; dx, dx16 out
                line.append(f"{per_sm} a SM {1000 * ms:6.1f} us ({moved / ms / 1e6:5.0f} GB/s)")
        finally:
            rmsnorm.BACKWARD_BLOCKS_PER_SM = chosen
        print(f"C {width:5} x {n:5} rows, the step's backward: " + "; ".join(line))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", action="store_true", help="the bf16 step's backward over grid sizes")
    if parser.parse_args().blocks:
        run_blocks()
        return
    rule = ", ".join(f"C {c} -> {rmsnorm._rmsnorm_vec(c)['ROW_TEAM']} warps" for c, _ in WIDTHS)
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; the launcher's rule: {rule}")
    for width, n in WIDTHS:
        rng = cp.random.default_rng(0)
        arrays = [rng.standard_normal((n, width), dtype=cp.float32) for _ in range(4)]  # x, branch, dout, add
        weight = rng.standard_normal(width, dtype=cp.float32)
        first = None
        for team in (1, 2, 4):
            fwd, bwd, outs = run_team(team, *arrays, weight)
            first = first or outs
            diff = ", ".join(f"{float(cp.abs(a - b).max()):.1e}" for a, b in zip(outs, first))
            fwd_bytes, bwd_bytes = n * width * (4 + 4 + 4 + 2), n * width * 16  # reads and writes of each
            print(
                f"C {width:5} x {n:5} rows, {team} warp(s) a row: forward {1000 * fwd:6.1f} us "
                f"({fwd_bytes / fwd / 1e6:5.0f} GB/s), backward {1000 * bwd:6.1f} us "
                f"({bwd_bytes / bwd / 1e6:5.0f} GB/s); max difference from one warp "
                f"(out bits, rstd, dx, dweight): {diff}"
            )


if __name__ == "__main__":
    main()
