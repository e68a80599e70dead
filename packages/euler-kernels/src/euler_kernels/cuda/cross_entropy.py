"""Launchers of cross_entropy.cu: one block per row; forward is a single online pass for max and sum that
keeps only the log-sum-exp, backward writes dlogits directly (float32, or bf16 for a bf16 head). Rows
that can be read as float4 take the `_vec` kernels; bf16 logits (a bf16 head's product) take the `_in16`
ones, whose backward may write dlogits over the logits."""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda._module import THREADS, contiguous, get_kernel
from euler_kernels.cuda.cast import from_bf16, to_bf16

# (float4 rows, bf16 dlogits) -> backward kernel; bf16 dlogits exist only for float4 rows
_BACKWARD = {
    (False, False): "cross_entropy_backward",
    (True, False): "cross_entropy_backward_vec",
    (True, True): "cross_entropy_backward_vec_bf16",
}


def _float4_rows(*arrays: Any) -> bool:
    """Whether every (N, V) array can be read as float4: V % 4 == 0 and 16-byte aligned data."""
    return all(a.shape[-1] % 4 == 0 and a.data.ptr % 16 == 0 for a in arrays)


def cross_entropy_forward(logits: Any, targets: Any, weight: Any) -> tuple[Any, Any]:
    """logits (N, V) float32 or bf16, targets (N,) int64, weight (N,) float32 -> per-row weighted nll (N,),
    lse (N,), both float32."""
    import cupy

    logits, targets, weight = contiguous(logits, targets, weight)
    N, V = logits.shape
    bf16 = logits.dtype == cupy.uint16
    if bf16 and not _float4_rows(logits):  # no bf16 kernel for odd V: the float32 values
        return cross_entropy_forward(from_bf16(logits), targets, weight)
    nll = cupy.empty((N,), dtype=cupy.float32)
    lse = cupy.empty((N,), dtype=cupy.float32)
    args = (nll, lse, logits, targets, weight, np.int32(V))
    name = "cross_entropy_forward_vec" if _float4_rows(logits) else "cross_entropy_forward"
    name = "cross_entropy_forward_vec_in16" if bf16 else name
    get_kernel("cross_entropy.cu", name)((N,), (THREADS,), args)
    return nll, lse


def cross_entropy_backward(
    logits: Any, lse: Any, targets: Any, weight: Any, scale: Any, out: Any = None, bf16_out: bool = False
) -> Any:
    """dlogits (N, V) = scale * weight * (softmax - onehot); `out` may be `logits` itself (in place).
    bf16_out: dlogits is bf16 (uint16 bit patterns), for a head whose products run in bf16. bf16 logits
    give bf16 dlogits (bf16_out is implied)."""
    import cupy

    N, V = logits.shape
    if logits.dtype == cupy.uint16:
        if not _float4_rows(logits):
            return to_bf16(cross_entropy_backward(from_bf16(logits), lse, targets, weight, scale))
        dlogits = cupy.empty(logits.shape, dtype=cupy.uint16) if out is None else out
        args = (dlogits, logits, lse, targets, weight, scale, np.int32(V))
        get_kernel("cross_entropy.cu", "cross_entropy_backward_vec_in16")((N,), (THREADS,), args)
        return dlogits
    if bf16_out and not _float4_rows(logits):  # no bf16 kernel for odd V: round the float32 result
        return to_bf16(cross_entropy_backward(logits, lse, targets, weight, scale))
    dtype = cupy.uint16 if bf16_out else cupy.float32
    dlogits = cupy.empty(logits.shape, dtype=dtype) if out is None else out
    args = (dlogits, logits, lse, targets, weight, scale, np.int32(V))
    name = _BACKWARD[_float4_rows(logits, dlogits), bool(bf16_out)]
    get_kernel("cross_entropy.cu", name)((N,), (THREADS,), args)
    return dlogits
