"""SwiGLU gate: out = silu(gate) * up, silu(g) = g * sigmoid(g)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from euler_kernels import cuda
from euler_kernels.backend import (
    bf16_bits,
    check_activations,
    check_float,
    get_array_module,
    is_bf16,
    shape_error,
)
from euler_kernels.cuda import cast
from euler_kernels.swiglu import swiglu_cuda


class SwiGLUCache(NamedTuple):
    """swiglu_forward's cache on the array operations (NumPy, or CuPy float64)."""

    up: Any
    sig: Any  # sigmoid(gate)
    silu: Any  # gate * sigmoid(gate)


class SwiGLUKernelCache(NamedTuple):
    """swiglu_forward's (and swiglu_forward_fp8's) cache on the GPU kernels: the inputs, float32 or bf16."""

    gate: Any
    up: Any


def _sigmoid(xp: Any, g: Any) -> Any:
    # 1 / (1 + exp(-g)) is accurate in both tails; exp overflowing to inf just gives 0
    s = xp.negative(g)
    with np.errstate(over="ignore"):
        xp.exp(s, out=s)
    s += 1.0
    return xp.reciprocal(s, out=s)


def swiglu_forward(gate: Any, up: Any, amax: Any = None) -> tuple[Any, SwiGLUCache | SwiGLUKernelCache]:
    """out = silu(gate) * up, elementwise, shapes equal.

    gate and up may be bf16 activations (GPU): out is then bf16 too, and so are the gradients.
    amax (GPU kernels only): a uint32 scalar (`fp8_amax()`) raised to the largest |out| in the same pass,
    which the FP8 path's cast of out then takes (linear_forward's x_amax) instead of measuring it.

    >>> import numpy as np
    >>> out, _ = swiglu_forward(np.array([0.0, 1.0]), np.array([5.0, 2.0]))
    >>> np.round(out, 4).tolist()
    [0.0, 1.4621]
    """
    host = type(gate) is np.ndarray  # NumPy: the array operations below, nothing else to choose
    if not host:  # a CuPy bfloat16 array as its bit patterns
        gate, up = bf16_bits(gate), bf16_bits(up)
    if host:
        kind = check_float("swiglu_forward", gate=gate, up=up).name
    else:
        kind = check_activations("swiglu_forward", gate=gate, up=up)
    if gate.shape != up.shape:
        raise shape_error("swiglu_forward", "gate and up must have the same shape", gate=gate, up=up)
    if not host and (kind == "bf16" or cuda.float32_on_gpu(gate, up)):
        return swiglu_cuda.swiglu_forward(gate, up, amax), SwiGLUKernelCache(gate, up)
    if amax is not None:
        raise ValueError("swiglu_forward: amax needs the GPU kernels (float32 or bf16 CuPy arrays)")
    out, sig, silu = swiglu_parts(np if host else get_array_module(gate), gate, up)
    return out, SwiGLUCache(up, sig, silu)


def swiglu_parts(xp: Any, gate: Any, up: Any) -> tuple[Any, Any, Any]:
    """(out, sig, silu) of the array-operation SwiGLU, gate and up already checked: the one formula of the
    NumPy-style path, shared by swiglu_forward and the decode step's lean products."""
    sig = _sigmoid(xp, gate)
    silu = gate * sig
    return silu * up, sig, silu


def swiglu_backward(
    dout: Any,
    cache: SwiGLUCache | SwiGLUKernelCache,
    amax: tuple[Any, Any] | None = None,
    product: bool = False,
) -> tuple[Any, ...]:
    """(dgate, dup): dup = dout * silu(g); dgate = dout * up * sig * (1 + g * (1 - sig)).
    amax (GPU kernels only): two uint32 scalars raised to the largest |dgate| and |dup| (see forward).
    product: also the forward's output silu(g) * up, the same values again -> (dgate, dup, product) (the
    GPU makes it in the backward's pass, for a forward that did not keep it)."""
    if type(cache) is SwiGLUKernelCache:
        dout = bf16_bits(dout)  # a CuPy bfloat16 array as its bit patterns
        gate, up = cache.gate, cache.up
        if dout.shape != up.shape:
            raise shape_error("swiglu_backward", "dout must match gate", dout=dout, gate=up)
        if is_bf16(gate):  # the bf16 kernel reads a bf16 gradient (a float32 one is rounded once)
            dout = cast.as_bf16(dout)
        return swiglu_cuda.swiglu_backward(dout, gate, up, amax, product)
    if amax is not None:
        raise ValueError("swiglu_backward: amax needs the GPU kernels (float32 or bf16 CuPy arrays)")
    up, sig, silu = cache.up, cache.sig, cache.silu
    if dout.shape != up.shape:
        raise shape_error("swiglu_backward", "dout must match gate", dout=dout, gate=up)
    if product:
        return (*swiglu_backward(dout, cache), silu * up)
    dup = dout * silu
    # d silu / dg = sig + g * sig * (1 - sig) = sig + silu * (1 - sig)
    dgate = 1.0 - sig
    dgate *= silu
    dgate += sig
    dgate *= up
    dgate *= dout
    return dgate, dup


def swiglu_forward_fp8(gate: Any, up: Any, scales: Any, slot: int) -> tuple[Any, SwiGLUKernelCache]:
    """silu(gate) * up of bf16 activations (GPU), cast straight to e4m3 with the delayed scale of `slot`
    in `scales` (matmul/fp8_scales.py): an Fp8Tensor, row-major and transposed, rows padded to 16, for the
    FP8 products (linear_forward takes it as x); raises the slot's maximum and counts saturated values.
    The cache is swiglu_forward's, for swiglu_backward or swiglu_backward_fp8."""
    check_activations("swiglu_forward_fp8", gate=gate, up=up)
    if not (is_bf16(gate) and is_bf16(up)) or gate.shape != up.shape:
        raise shape_error("swiglu_forward_fp8", "gate and up must be bf16 of one shape", gate=gate, up=up)
    return swiglu_cuda.swiglu_forward_fp8(gate, up, scales, slot), SwiGLUKernelCache(gate, up)


def swiglu_backward_fp8(
    dout: Any, cache: SwiGLUKernelCache, scales: Any, slots: tuple[int, int]
) -> tuple[Any, Any]:
    """(dgate, dup) of a bf16 forward as e5m2 Fp8Tensors cast with the delayed scales of `slots` (dgate's,
    dup's), for the FP8 products (linear_backward takes them as dout)."""
    if type(cache) is not SwiGLUKernelCache or not is_bf16(cache.gate):
        raise ValueError("swiglu_backward_fp8: needs the cache of a bf16 swiglu forward on the GPU")
    gate, up = cache.gate, cache.up
    if dout.shape != up.shape:
        raise shape_error("swiglu_backward_fp8", "dout must match gate", dout=dout, gate=up)
    return swiglu_cuda.swiglu_backward_fp8(cast.as_bf16(dout), gate, up, scales, slots)
