"""Launchers of cross_entropy.cu: one block per row; forward is a single online pass for max and sum that
keeps only the log-sum-exp, backward writes dlogits directly (float32, or bf16 for a bf16 head). Rows
that can be read as float4 take the `_vec` kernels; bf16 logits (a bf16 head's product) take the `_in16`
ones, whose backward may write dlogits over the logits."""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.backend import is_bf16
from euler_kernels.cuda._module import THREADS, contiguous, get_kernel
from euler_kernels.cuda.cast import as_float32, to_bf16

# (float4 rows, bf16 dlogits, bf16 logits) -> backward kernel; the bf16 kernels exist only for float4 rows
_BACKWARD = {
    (False, False, False): "cross_entropy_backward",
    (True, False, False): "cross_entropy_backward_vec",
    (True, True, False): "cross_entropy_backward_vec_bf16",
    (True, True, True): "cross_entropy_backward_vec_in16",
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
    if is_bf16(logits) and not _float4_rows(logits):  # no bf16 kernel for odd V: the float32 values
        logits = as_float32(logits)
    name = "cross_entropy_forward_vec" if _float4_rows(logits) else "cross_entropy_forward"
    name = "cross_entropy_forward_vec_in16" if is_bf16(logits) else name
    nll = cupy.empty((N,), dtype=cupy.float32)
    lse = cupy.empty((N,), dtype=cupy.float32)
    args = (nll, lse, logits, targets, weight, np.int32(V))
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
    bf16_out = bool(bf16_out) or is_bf16(logits)
    if bf16_out and not _float4_rows(logits):  # no bf16 kernel for odd V: round the float32 result
        return to_bf16(cross_entropy_backward(as_float32(logits), lse, targets, weight, scale))
    dtype = cupy.uint16 if bf16_out else cupy.float32
    dlogits = cupy.empty(logits.shape, dtype=dtype) if out is None else out
    args = (dlogits, logits, lse, targets, weight, scale, np.int32(V))
    name = _BACKWARD[_float4_rows(logits, dlogits), bf16_out, is_bf16(logits)]
    get_kernel("cross_entropy.cu", name)((N,), (THREADS,), args)
    return dlogits
