"""Tensor maps for Hopper's bulk tensor copies (TMA), and a kernel launch that passes them by value.

A tensor map (the driver's CUtensorMap, 128 bytes) describes boxes of a global array that one instruction
copies into shared memory (tma.cuh). It is built on the host by the driver's `cuTensorMapEncodeTiled` and
given to the kernel as a `const __grid_constant__` parameter; CuPy's kernel call passes arrays and scalars
only, so kernels that take maps are launched here through the driver's `cuLaunchKernel`, on CuPy's current
stream (a CUDA-graph capture records them like any other launch).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from euler_kernels.cuda._module import token_stride

_TYPES = {2: 1, 4: 7}  # cuda.h CUtensorMapDataType by item size: uint16 (bf16 bit patterns), float32
_INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_128B, _OOB_ZERO = 0, 3, 2, 0  # cuda.h enums


@functools.cache
def _driver() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")
    ptr, enum = ctypes.c_void_p, ctypes.c_int
    u64s, u32s = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    rank = ctypes.c_uint32
    lib.cuTensorMapEncodeTiled.argtypes = [ptr, enum, rank, ptr, u64s, u64s, u32s, u32s] + [enum] * 4
    lib.cuLaunchKernel.argtypes = [ptr] + [ctypes.c_uint] * 7 + [ptr, ctypes.POINTER(ptr), ptr]
    return lib


class TensorMap:
    """One encoded CUtensorMap: 128 bytes at a 64-byte aligned host address."""

    def __init__(self) -> None:
        self._buffer = ctypes.create_string_buffer(128 + 64)
        self.address = (ctypes.addressof(self._buffer) + 63) & ~63


def mappable(array: Any) -> bool:
    """Whether head_rows_map takes the array as it is (else a caller copies it to C order first)."""
    if array.data.ptr % 16:
        return False
    stride = token_stride(array)
    return stride is not None and stride * array.itemsize % 16 == 0


def head_rows_map(array: Any, rows: int) -> TensorMap:
    """A map of the (B, N, H, D) uint16 (bf16) or float32 CuPy array whose box is `rows` consecutive
    positions n of one (b, h) by the 128 bytes of D that make one 128-byte-swizzled panel (64 bf16 columns:
    wgmma.cuh's layout; 32 float32). Coordinates are (column, h, n, b), innermost first; rows past N read as
    zeros, and reductions into them are dropped. The array is contiguous, or its tokens are a stride apart
    (`token_stride`: the heads of a wider row, such as q, k and v as columns of the joint q/k/v product's
    rows), a multiple of 16 bytes. A map depends only on the address, shape, strides, type and box, so the
    last few hundred are kept and handed out again (a training step's buffers come back at the same addresses
    every step)."""
    if array.data.ptr % 16:
        raise ValueError(f"a tensor map needs a 16-byte aligned array, not one at {array.data.ptr:#x}")
    if not mappable(array):
        raise ValueError(
            f"a tensor map needs packed heads, tokens a multiple of 16 bytes apart: strides {array.strides}"
        )
    return _encoded(array.data.ptr, array.shape, array.dtype.itemsize, rows, token_stride(array))


@functools.lru_cache(maxsize=512)
def _encoded(address: int, shape: tuple, size: int, rows: int, token_stride: int) -> TensorMap:
    B, N, H, D = shape
    dims = (ctypes.c_uint64 * 4)(D, H, N, B)
    strides = (ctypes.c_uint64 * 3)(size * D, size * token_stride, size * token_stride * N)  # bytes
    box = (ctypes.c_uint32 * 4)(128 // size, 1, rows, 1)
    unit = (ctypes.c_uint32 * 4)(1, 1, 1, 1)
    tensor_map = TensorMap()
    error = _driver().cuTensorMapEncodeTiled(
        tensor_map.address, _TYPES[size], 4, address, dims, strides, box, unit,
        _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_128B, _OOB_ZERO,
    )  # fmt: skip
    if error:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {error} for shape {shape}")
    return tensor_map


_SCALARS = {np.int32: ctypes.c_int32, np.float32: ctypes.c_float}


def _parameter(value: Any) -> tuple[int, Any]:
    """(address of the parameter's bytes, the object that keeps them alive)."""
    if isinstance(value, TensorMap):
        return value.address, value
    scalar = _SCALARS.get(type(value))
    held = scalar(value) if scalar else ctypes.c_void_p(value.data.ptr)  # a CuPy array: its device pointer
    return ctypes.addressof(held), held


@functools.cache
def loaded_function(kernel: Any, shared_mem: int) -> int:
    """The CUfunction of a CuPy RawKernel, allowed `shared_mem` bytes of dynamic shared memory (set once)."""
    kernel.max_dynamic_shared_size_bytes = shared_mem
    return kernel.kernel.ptr


def launch(function: int, grid: tuple, block: tuple, args: tuple, shared_mem: int) -> None:
    """A loaded function (loaded_function) on grid x block with args: CuPy arrays (their pointers),
    TensorMaps and NumPy int32 / float32 scalars (by value); on CuPy's current stream."""
    import cupy

    held = [_parameter(a) for a in args]
    params = (ctypes.c_void_p * len(held))(*(address for address, _ in held))
    stream = cupy.cuda.get_current_stream().ptr
    error = _driver().cuLaunchKernel(function, *grid, *block, shared_mem, stream, params, None)
    if error:
        raise RuntimeError(f"cuLaunchKernel failed with CUresult {error}")
