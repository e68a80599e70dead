"""Array-module plumbing: one code path for NumPy (CPU) and CuPy (GPU) arrays.

CuPy is never imported at module import time; it is looked up only when an array that is not a
NumPy array arrives, or when `require_cuda()` / `to_device()` asks for it.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_NUMPY_TYPES = (np.ndarray, np.generic)  # a tuple: isinstance with `a | b` builds the union at every call


def get_array_module(x: Any) -> ModuleType:
    """The array module (`numpy` or `cupy`) that owns `x`.

    >>> get_array_module(np.zeros(2)).__name__
    'numpy'
    """
    if type(x) is np.ndarray or isinstance(x, _NUMPY_TYPES):  # the first test alone for an ndarray
        return np
    cupy = sys.modules.get("cupy")  # only consult CuPy if someone already imported it
    if cupy is not None and isinstance(x, cupy.ndarray):
        return cupy
    return np


def require_cuda() -> ModuleType:
    """Return the `cupy` module, or raise a RuntimeError saying how to get a working CUDA setup."""
    try:
        import cupy
    except ImportError as err:
        raise RuntimeError(
            "euler_kernels: the GPU path needs CuPy; install it with `pip install euler-kernels[gpu]`"
        ) from err
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:  # CuPy present but no driver / runtime
        raise RuntimeError(f"euler_kernels: CuPy is installed but CUDA is unusable: {err}") from err
    if count < 1:
        raise RuntimeError("euler_kernels: CuPy is installed but no CUDA device is visible")
    return cupy


def to_numpy(x: Any) -> np.ndarray:
    """A NumPy copy (or view) of a NumPy or CuPy array."""
    if get_array_module(x) is np:
        return np.asarray(x)
    return x.get()


def to_device(x: Any, xp: ModuleType | str = "cuda") -> Any:
    """Move `x` to the module `xp` (numpy, cupy, or the strings "cpu" / "cuda")."""
    if xp == "cpu" or xp is np:
        return to_numpy(x)
    cupy = require_cuda()
    return cupy.asarray(x)


def synchronize(xp: ModuleType | None = None) -> None:
    """Wait for queued GPU work (a no-op for NumPy)."""
    if xp is not None and xp is not np:
        xp.cuda.get_current_stream().synchronize()


def is_capturing(x: Any) -> bool:
    """Whether `x` is a CuPy array and the current stream is being captured into a CUDA graph: ops then
    skip the checks that would read values back to the host (the caller validates its inputs first).

    >>> is_capturing(np.zeros(2))
    False
    """
    if get_array_module(x) is np:
        return False
    return bool(sys.modules["cupy"].cuda.get_current_stream().is_capturing())


def check_float(fn: str, **arrays: Any) -> np.dtype:
    """Check that all named arrays share one float dtype (float32/float64); return it."""
    first = None
    for name in arrays:  # by identity first: NumPy's builtin dtypes are singletons (no call per array)
        dtype = arrays[name].dtype
        first = dtype if first is None else first
        if dtype is not first or not (dtype is FLOAT_DTYPES[0] or dtype is FLOAT_DTYPES[1]):
            return _check_float_slowly(fn, arrays)
    return first


def _check_float_slowly(fn: str, arrays: dict[str, Any]) -> np.dtype:
    """check_float by dtype equality (CuPy's dtypes, dtypes that are not the builtin instances)."""
    dtypes = [np.dtype(a.dtype) for a in arrays.values()]
    if dtypes[0] not in FLOAT_DTYPES or any(d != dtypes[0] for d in dtypes):
        desc = ", ".join(f"{n}: {d}" for n, d in zip(arrays, dtypes))
        raise ValueError(f"{fn}: expected all float32 or all float64 arrays, got {desc}")
    return dtypes[0]


def is_bf16(x: Any) -> bool:
    """Whether `x` is a bfloat16 activation: a uint16 CuPy array of bf16 bit patterns (the GPU bf16 path
    makes them), or a CuPy array of CuPy's own bfloat16 dtype (see bf16_bits); NumPy arrays never are.

    >>> is_bf16(np.zeros(2, dtype=np.uint16))
    False
    """
    if type(x) is np.ndarray or isinstance(x, _NUMPY_TYPES):  # the first test alone for an ndarray
        return False
    return get_array_module(x) is not np and (x.dtype == np.uint16 or x.dtype.name == "bfloat16")


def bf16_bits(x: Any) -> Any:
    """x, or, for a CuPy array of CuPy's bfloat16 dtype (ml_dtypes.bfloat16), the same memory viewed as the
    uint16 bit patterns the kernels read (no copy): the ops take either, and give bf16 results as uint16.

    >>> bf16_bits(np.ones(2)).dtype.name
    'float64'
    """
    if type(x) is np.ndarray or x is None or not hasattr(x, "dtype") or x.dtype.name != "bfloat16":
        return x
    return x.view(np.uint16) if get_array_module(x) is not np else x


def check_activations(fn: str, **arrays: Any) -> str:
    """Like check_float, but all-bf16 activations (see is_bf16) pass too; returns "bf16" or the float dtype's
    name, so an op can pick its path."""
    if all(is_bf16(a) for a in arrays.values()):
        return "bf16"
    if any(is_bf16(a) for a in arrays.values()):
        desc = ", ".join(f"{n}: {'bf16' if is_bf16(a) else np.dtype(a.dtype)}" for n, a in arrays.items())
        raise ValueError(f"{fn}: bf16 activations cannot be mixed with float arrays, got {desc}")
    return check_float(fn, **arrays).name


def shape_error(fn: str, message: str, **arrays: Any) -> ValueError:
    """A ValueError naming the op, what is wrong, and the shapes of the given arrays."""
    shapes = ", ".join(f"{n}{tuple(a.shape)}" for n, a in arrays.items())
    return ValueError(f"{fn}: {message}; got {shapes}")
