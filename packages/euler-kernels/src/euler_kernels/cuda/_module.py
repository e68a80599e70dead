"""Compile and cache the `.cu` files beside this module with `cupy.RawModule`, and the launch sizes that
every launcher shares.

Each file is compiled once per set of `-D` defines; a `#line` directive makes compiler errors
name the real file and line.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from euler_kernels.backend import require_cuda

CUDA_DIR = Path(__file__).resolve().parent
THREADS = 256  # threads per block of the elementwise and row kernels
GRID_CAP = 132 * 32  # enough blocks to fill an H200's 132 SMs for grid-stride loops


@functools.cache
def load_module(filename: str, defines: tuple[tuple[str, int], ...] = ()):
    """The compiled RawModule for `filename` (in this folder) with the given `-D` defines."""
    cupy = require_cuda()
    path = CUDA_DIR / filename
    source = f'#line 1 "{path}"\n' + path.read_text()
    options = ("-std=c++17", f"-I{CUDA_DIR}", *(f"-D{name}={value}" for name, value in defines))
    return cupy.RawModule(code=source, options=options)


def get_kernel(filename: str, name: str, **defines: int):
    """One kernel function of a compiled `.cu` file."""
    return load_module(filename, tuple(sorted(defines.items()))).get_function(name)


def blocks(n: int, threads: int) -> int:
    """Number of blocks of `threads` threads that cover `n` items."""
    return max(1, (n + threads - 1) // threads)


def grid(n: int) -> tuple[int]:
    """The grid of a grid-stride kernel over n items: blocks of THREADS, at most GRID_CAP of them."""
    return (min(blocks(n, THREADS), GRID_CAP),)


def contiguous(*arrays: Any) -> list[Any]:
    """The arrays in C order (themselves when they already are), as the kernels index them."""
    import cupy

    return [cupy.ascontiguousarray(a) for a in arrays]
