"""Launchers of swiglu.cu: out = silu(gate) * up and its gradients, elementwise, float32 or bf16; each can
also raise uint32 scalars (fp8.py's amax_bits form) to the largest |value| of its outputs. The *_fp8
launchers write their outputs straight to FP8 with delayed scales (fp8_scales.py), row-major and transposed
from one pass, as the FP8 products take them."""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda._module import THREADS, contiguous, get_kernel, grid
from euler_kernels.matmul.fp8 import FP8_TILE, Fp8Tensor, amax_pointer
from euler_kernels.matmul.fp8_scales import Fp8Scales
from euler_kernels.matmul.gemm_fp8 import FP8_MULTIPLE

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


def swiglu_backward(
    dout: Any, gate: Any, up: Any, amax: tuple[Any, Any] | None = None, product: bool = False
) -> tuple[Any, ...]:
    """(dgate, dup) in the storage type of gate, up and dout (all float32 or all bf16). amax: a pair of
    uint32 scalars raised to the largest |dgate| and |dup| as stored, or None. product: also the forward's
    silu(gate) * up, made again in the same pass (bit for bit the forward's) -> (dgate, dup, product)."""
    import cupy

    dout, gate, up = contiguous(dout, gate, up)
    dgate, dup = cupy.empty_like(gate), cupy.empty_like(up)
    out = cupy.empty_like(gate) if product else None
    kernel, n = _kernel(_BACKWARD, dgate, dup, dout, gate, up, *([out] if product else []))
    pointers = tuple(amax_pointer(a, "swiglu_backward") for a in (amax or (None, None)))
    args = (dgate, dup, dout, gate, up, np.int64(n), *pointers, np.uint64(0) if out is None else out)
    kernel(grid(n), (THREADS,), args)
    return (dgate, dup, out) if product else (dgate, dup)


def _fp8_outputs(rows_padded: int, cols: int, scales: Fp8Scales, slot: int, fmt: str) -> tuple:
    """(row-major, transposed) uint8 outputs and the slot's (exponent, scale_inv, amax, saturated)."""
    import cupy

    if not 0 <= slot < len(scales.formats) or scales.formats[slot] != fmt:
        raise ValueError(f"swiglu fp8: slot {slot} must be an {fmt} slot of the scales")
    outs = (cupy.empty((rows_padded, cols), cupy.uint8), cupy.empty((cols, rows_padded), cupy.uint8))
    return outs, scales.slot(slot)


def _fp8_shape(*arrays: Any) -> tuple[int, int, int]:
    """(rows, cols, rows rounded up to the FP8 products' multiple) of bf16 (..., cols) arrays of one shape."""
    shape = arrays[0].shape
    if any(a.dtype != np.uint16 or a.shape != shape for a in arrays) or len(shape) < 1:
        raise ValueError("swiglu fp8: needs bf16 (uint16) arrays of one shape")
    cols = shape[-1]
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    return rows, cols, -(-rows // FP8_MULTIPLE) * FP8_MULTIPLE


def _launch_fp8(name: str, inputs: tuple, shape: tuple[int, int, int], scalars: tuple, outs: tuple) -> None:
    """swiglu.cu's kernel `name` over fp8.cuh's 64 x 64 tiles of the (rows_padded, cols) outputs, with args
    (*inputs, rows, cols, rows_padded, aligned, *scalars, *outs); aligned: every array starts on 16 bytes."""
    rows, cols, rows_padded = shape
    aligned = np.int32(all(a.data.ptr % 16 == 0 for a in (*inputs, *outs)))
    blocks = (-(-cols // FP8_TILE), -(-rows_padded // FP8_TILE))
    sizes = (np.int64(rows), np.int64(cols), np.int64(rows_padded), aligned)
    get_kernel("swiglu.cu", name)(blocks, (THREADS,), (*inputs, *sizes, *scalars, *outs))


def swiglu_forward_fp8(gate: Any, up: Any, scales: Fp8Scales, slot: int) -> Fp8Tensor:
    """silu(gate) * up of bf16 (..., F) gate and up, as an e4m3 Fp8Tensor of shape (rows padded to 16, F),
    row-major and transposed (padding rows zero), cast with slot's delayed scale; raises the slot's amax_now
    to the largest |output| and adds the values that saturated to its count."""
    gate, up = contiguous(gate, up)
    rows, cols, rows_padded = shape = _fp8_shape(gate, up)
    outs, (exponent, scale_inv, amax, saturated) = _fp8_outputs(rows_padded, cols, scales, slot, "e4m3")
    _launch_fp8("swiglu_forward_fp8", (gate, up), shape, (exponent, amax, saturated), outs)
    return Fp8Tensor("e4m3", (rows_padded, cols), *outs, scale_inv, rows)


def swiglu_backward_fp8(
    dout: Any, gate: Any, up: Any, scales: Fp8Scales, slots: tuple[int, int]
) -> tuple[Fp8Tensor, Fp8Tensor]:
    """(dgate, dup) of bf16 dout, gate, up (..., F) as e5m2 Fp8Tensors (rows padded to 16, F), row-major and
    transposed, cast with the delayed scales of slots (dgate's, dup's), which they raise and count into."""
    dout, gate, up = contiguous(dout, gate, up)
    rows, cols, rows_padded = shape = _fp8_shape(dout, gate, up)
    (dg, dg_t), (exp_g, inv_g, amax_g, sat_g) = _fp8_outputs(rows_padded, cols, scales, slots[0], "e5m2")
    (du, du_t), (exp_u, inv_u, amax_u, sat_u) = _fp8_outputs(rows_padded, cols, scales, slots[1], "e5m2")
    scalars = (exp_g, exp_u, amax_g, amax_u, sat_g, sat_u)
    _launch_fp8("swiglu_backward_fp8", (dout, gate, up), shape, scalars, (dg, dg_t, du, du_t))
    padded = (rows_padded, cols)
    return Fp8Tensor("e5m2", padded, dg, dg_t, inv_g, rows), Fp8Tensor("e5m2", padded, du, du_t, inv_u, rows)
