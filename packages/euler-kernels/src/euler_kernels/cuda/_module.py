"""Compile and cache the `.cu` files of euler_kernels' op folders with `cupy.RawModule`, and the launch sizes
that every launcher shares, with the device's own facts they depend on (its SM count: `sm_count`).

A `.cu` file is named by its file name alone: each lies in its op's folder beside its launcher
(euler_kernels/<op>/<name>.cu, names unique across the folders), and includes headers of that folder or
the shared ones of this folder (common.cuh, fp8.cuh). Each file is compiled once per set of `-D` defines;
a `#line` directive makes compiler errors name the real file and line.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Any

from euler_kernels.backend import require_cuda

CUDA_DIR = Path(__file__).resolve().parent  # the shared headers
KERNELS_DIR = CUDA_DIR.parent  # euler_kernels: a folder per op
THREADS = 256  # threads per block of the elementwise and row kernels
GRID_BLOCKS_PER_SM = 32  # a grid-stride kernel's blocks an SM at most: enough to keep every SM full


@functools.cache
def source_path(filename: str) -> Path:
    """The one `.cu` file named `filename` in the folders of euler_kernels (FileNotFoundError if not one)."""
    found = sorted(KERNELS_DIR.glob(f"*/{filename}"))
    if len(found) != 1:
        raise FileNotFoundError(f"{filename}: {len(found)} files of that name under {KERNELS_DIR}, not one")
    return found[0]


def include_dirs(filename: str) -> tuple[Path, ...]:
    """Where the headers of `filename` are found: its own folder, then the shared headers of this folder."""
    return tuple(dict.fromkeys((source_path(filename).parent, CUDA_DIR)))


def _source_and_options(filename: str, defines: tuple[tuple[str, int], ...]) -> tuple[str, tuple[str, ...]]:
    """The text of `filename`, its errors naming the real file, and the compiler options every build takes:
    C++17, the folders of its headers, the `-D` defines."""
    path = source_path(filename)
    source = f'#line 1 "{path}"\n' + path.read_text()
    includes = (f"-I{folder}" for folder in include_dirs(filename))
    return source, ("-std=c++17", *includes, *(f"-D{name}={value}" for name, value in defines))


@functools.cache
def load_module(filename: str, defines: tuple[tuple[str, int], ...] = ()):
    """The compiled RawModule for `filename` (found by source_path) with the given `-D` defines."""
    cupy = require_cuda()
    source, options = _source_and_options(filename, defines)
    return cupy.RawModule(code=source, options=options)


def get_kernel(filename: str, name: str, **defines: int):
    """One kernel function of a compiled `.cu` file."""
    return load_module(filename, tuple(sorted(defines.items()))).get_function(name)


def cubin_cache_dir() -> Path:
    """Where sm_90a cubins are kept between runs: $EULER_CACHE_DIR/cubin, default ~/.cache/euler/cubin."""
    root = os.environ.get("EULER_CACHE_DIR") or Path.home() / ".cache" / "euler"
    return Path(root) / "cubin"


@functools.cache
def load_module_sm90a(filename: str, defines: tuple[tuple[str, int], ...] = ()):
    """`filename` compiled by NVRTC for sm_90a (Hopper's wgmma needs the `a` target, which CuPy's own
    `-arch=sm_90` would replace), loaded from its cubin; cubins are cached by the hash of the source, its
    headers, the options and the NVRTC version."""
    cupy = require_cuda()
    nvrtc = cupy.cuda.nvrtc
    source, options = _source_and_options(filename, defines)
    options += ("--gpu-architecture=sm_90a",)
    key = hashlib.sha256(repr((source, options, nvrtc.getVersion())).encode())
    for folder in include_dirs(filename):
        for header in sorted(folder.glob("*.cuh")):
            key.update(header.read_bytes())
    cached = cubin_cache_dir() / f"{Path(filename).stem}-{key.hexdigest()[:24]}.cubin"
    if not cached.exists():
        program = nvrtc.createProgram(source, filename, (), ())
        try:
            nvrtc.compileProgram(program, options)
            cubin = nvrtc.getCUBIN(program)
        except nvrtc.NVRTCError as error:
            raise RuntimeError(f"{filename}: NVRTC failed:\n{nvrtc.getProgramLog(program)}") from error
        finally:
            nvrtc.destroyProgram(program)
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.part")  # written whole, then renamed into place
        partial.write_bytes(cubin)
        partial.replace(cached)
    return cupy.RawModule(path=str(cached))


@functools.cache
def get_kernel_sm90a(filename: str, name: str, **defines: int):
    """One kernel function of a `.cu` file compiled for sm_90a (the same object on every call)."""
    return load_module_sm90a(filename, tuple(sorted(defines.items()))).get_function(name)


def device_attribute(name: str, device: int | None = None) -> int:
    """One of CuPy's `Device.attributes` (e.g. "MaxSharedMemoryPerBlockOptin") of GPU `device` (default: the
    current one), asked of the device once per process."""
    if device is None:
        import cupy

        device = cupy.cuda.runtime.getDevice()
    return _device_attributes(device)[name]


@functools.cache
def _device_attributes(device: int) -> dict[str, int]:
    return require_cuda().cuda.Device(device).attributes


def sm_count(device: int | None = None) -> int:
    """The streaming multiprocessors of GPU `device` (default: the current one): what every launcher that
    sizes its grid by the SMs reads."""
    return device_attribute("MultiProcessorCount", device)


def grid_cap() -> int:
    """The most blocks a grid-stride kernel launches on the current GPU: GRID_BLOCKS_PER_SM an SM."""
    return GRID_BLOCKS_PER_SM * sm_count()


def blocks(n: int, threads: int) -> int:
    """Number of blocks of `threads` threads that cover `n` items."""
    return max(1, (n + threads - 1) // threads)


def grid(n: int) -> tuple[int]:
    """The grid of a grid-stride kernel over n items: blocks of THREADS, at most grid_cap() of them."""
    return (min(blocks(n, THREADS), grid_cap()),)


def check_in_place(what: str, *arrays: Any) -> None:
    """ValueError "`what` must be C-contiguous" unless every one of the arrays a kernel writes in place is
    (it indexes them with C strides, and a copy would not be the caller's array)."""
    if not all(a.flags.c_contiguous for a in arrays):
        raise ValueError(f"{what} must be C-contiguous")


def token_stride(a: Any) -> int | None:
    """Elements from one token's values to the next's in a (B, T, H, D) array whose (H, D) values of a token
    are packed in C order and whose B and T dimensions merge into one run of tokens: H * D for a C-contiguous
    array, more for head columns of a wider row (q, k or v taken from the joint q/k/v product's (N, W)
    rows). None for any other layout (the kernels that take a stride copy those arrays instead).

    >>> import numpy as np
    >>> rows = np.zeros((2 * 3, 40), np.float32)
    >>> token_stride(rows[:, 8:24].reshape(2, 3, 2, 8)), token_stride(rows[:, 8:24:2].reshape(2, 3, 1, 8))
    (40, None)
    """
    if a.ndim != 4:
        return None
    B, T, H, D = a.shape
    s = [stride // a.itemsize for stride in a.strides]
    if any(stride * a.itemsize != full for stride, full in zip(s, a.strides)):
        return None
    packed = (D == 1 or s[3] == 1) and (H == 1 or s[2] == D)
    if not packed:
        return None
    if T == 1:  # the tokens are the batch's
        stride = s[0] if B > 1 else H * D
    elif B > 1 and s[0] != T * s[1]:
        return None
    else:
        stride = s[1]
    return stride if stride >= H * D else None  # tokens that overlap, or run backwards: not a run


def contiguous(*arrays: Any) -> list[Any]:
    """The arrays in C order (themselves when they already are), as the kernels index them."""
    import cupy

    return [cupy.ascontiguousarray(a) for a in arrays]
