"""Launchers of swiglu.cu: out = silu(gate) * up and its gradients, elementwise, float32 or bf16; each can
also raise uint32 scalars (fp8.py's amax_bits form) to the largest |value| of its outputs."""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda._module import THREADS, contiguous, get_kernel, grid
from euler_kernels.cuda.fp8 import amax_pointer

# storage -> kernel; "bf16x8": bf16 arrays read 8 elements (16 bytes) at a time
_FORWARD = {"float32": "swiglu_forward", "bf16": "swiglu_forward_bf16", "bf16x8": "swiglu_forward_bf16x8"}
_BACKWARD = {"float32": "swiglu_backward", "bf16": "swiglu_backward_bf16", "bf16x8": "swiglu_backward_bf16x8"}


def _kernel(kernels: dict[str, str], *arrays: Any) -> tuple[Any, int]:
    """The kernel for these arrays' storage and its element count per thread step: bf16 arrays of a size
    divisible by 8, 16-byte aligned, take the 8-wide kernel (16-byte loads)."""
    n = arrays[0].size
    if arrays[0].dtype == np.uint16 and n % 8 == 0 and all(a.data.ptr % 16 == 0 for a in arrays):
        return get_kernel("swiglu.cu", kernels["bf16x8"]), n // 8
    return get_kernel("swiglu.cu", kernels["bf16" if arrays[0].dtype == np.uint16 else "float32"]), n


def swiglu_forward(gate: Any, up: Any, amax: Any = None) -> Any:
    """out = silu(gate) * up; all float32, or all bf16 (uint16 bit patterns). amax: a uint32 scalar raised
    to the largest |out| as stored, or None."""
    import cupy

    gate, up = contiguous(gate, up)
    out = cupy.empty_like(gate)
    kernel, n = _kernel(_FORWARD, out, gate, up)
    kernel(grid(n), (THREADS,), (out, gate, up, np.int64(n), amax_pointer(amax, "swiglu_forward")))
    return out


def swiglu_backward(dout: Any, gate: Any, up: Any, amax: tuple[Any, Any] | None = None) -> tuple[Any, Any]:
    """(dgate, dup) in the storage type of gate, up and dout (all float32 or all bf16). amax: a pair of
    uint32 scalars raised to the largest |dgate| and |dup| as stored, or None."""
    import cupy

    dout, gate, up = contiguous(dout, gate, up)
    dgate, dup = cupy.empty_like(gate), cupy.empty_like(up)
    kernel, n = _kernel(_BACKWARD, dgate, dup, dout, gate, up)
    pointers = tuple(amax_pointer(a, "swiglu_backward") for a in (amax or (None, None)))
    kernel(grid(n), (THREADS,), (dgate, dup, dout, gate, up, np.int64(n), *pointers))
    return dgate, dup
