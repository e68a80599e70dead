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

_TYPES = {"uint16": 1, "float32": 7}  # cuda.h CUtensorMapDataType of the arrays mapped here (bf16 as uint16)
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


def head_rows_map(array: Any, rows: int) -> TensorMap:
    """A map of the contiguous (B, N, H, D) uint16 (bf16) or float32 CuPy array whose box is `rows`
    consecutive positions n of one (b, h) by the 128 bytes of D that make one 128-byte-swizzled panel
    (64 bf16 columns: wgmma.cuh's layout; 32 float32). Coordinates are (column, h, n, b), innermost first;
    rows past N read as zeros, and reductions into them are dropped."""
    B, N, H, D = array.shape
    size = array.dtype.itemsize
    if array.data.ptr % 16:
        raise ValueError(f"a tensor map needs a 16-byte aligned array, not one at {array.data.ptr:#x}")
    dims = (ctypes.c_uint64 * 4)(D, H, N, B)
    strides = (ctypes.c_uint64 * 3)(size * D, size * D * H, size * D * H * N)  # bytes, of dims 1..3
    box = (ctypes.c_uint32 * 4)(128 // size, 1, rows, 1)
    unit = (ctypes.c_uint32 * 4)(1, 1, 1, 1)
    tensor_map = TensorMap()
    error = _driver().cuTensorMapEncodeTiled(
        tensor_map.address, _TYPES[array.dtype.name], 4, array.data.ptr, dims, strides, box, unit,
        _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_128B, _OOB_ZERO,
    )  # fmt: skip
    if error:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {error} for shape {array.shape}")
    return tensor_map


def _parameter(value: Any) -> tuple[int, Any]:
    """(address of the parameter's bytes, the object that keeps them alive)."""
    if isinstance(value, TensorMap):
        return value.address, value
    if isinstance(value, np.generic):
        held = np.array(value)
        return held.ctypes.data, held
    held = ctypes.c_void_p(value.data.ptr)  # a CuPy array: its device pointer
    return ctypes.addressof(held), held


def launch(kernel: Any, grid: tuple, block: tuple, args: tuple, shared_mem: int) -> None:
    """kernel (a CuPy RawKernel) on grid x block with args: CuPy arrays (their pointers), TensorMaps and
    NumPy scalars (by value); on CuPy's current stream."""
    import cupy

    held = [_parameter(a) for a in args]
    params = (ctypes.c_void_p * len(held))(*(address for address, _ in held))
    stream = cupy.cuda.get_current_stream().ptr
    function = kernel.kernel.ptr  # the RawKernel's loaded CUfunction
    error = _driver().cuLaunchKernel(function, *grid, *block, shared_mem, stream, params, None)
    if error:
        raise RuntimeError(f"cuLaunchKernel failed with CUresult {error}")
