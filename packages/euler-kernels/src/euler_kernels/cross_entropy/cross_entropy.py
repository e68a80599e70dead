"""Cross-entropy fused with log-softmax, with an ignore index and a per-token loss mask.

loss = sum(w * nll) / max(sum(w), 1), w = loss_mask * (targets != ignore_index),
nll = logsumexp(logits) - logits[target]. Stable for logits of any magnitude (max is subtracted).
On the GPU the logits may be bf16 (a bf16 head's product, as autocast's): the kernels widen each to float32,
and the loss and the statistics are float32.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from euler_kernels import cuda
from euler_kernels.backend import bf16_bits, check_float, get_array_module, is_bf16, is_capturing, shape_error
from euler_kernels.cross_entropy import cross_entropy_cuda


class CrossEntropyCache(NamedTuple):
    """cross_entropy_forward's cache on the array operations (NumPy, or CuPy float64)."""

    exps: Any  # (N, V) exp(logits - row max): the softmax before its normalisation
    total: Any  # (N,) each row's sum of exps
    targets: Any  # (N,) the targets, ignored rows at 0
    weights: Any  # (N,) cross_entropy_weights
    denom: float  # max(sum(weights), 1)
    shape: tuple  # the logits' shape


class CrossEntropyKernelCache(NamedTuple):
    """cross_entropy_forward's cache on the GPU kernels."""

    logits: Any  # (N, V) float32 or bf16 (a bf16 backward in_place writes dlogits over them)
    lse: Any  # (N,) float32 log-sum-exp of each row
    targets: Any  # (N,) int64, ignored rows at 0
    weights: Any  # (N,) float32 cross_entropy_weights
    denom: Any  # device scalar max(sum(weights), 1)
    shape: tuple  # the logits' shape


def cross_entropy_weights(
    targets: Any, loss_mask: Any = None, ignore_index: int = -100, dtype: Any = None
) -> Any:
    """The per-token weights w (N,) = loss_mask * (targets != ignore_index), flattened, of `dtype` (float32
    by default): cross_entropy_forward's loss is sum(w * nll) / max(sum(w), 1) with these w, so the losses
    of parts of a batch combine exactly as sum(part_loss * max(part_w_sum, 1)) / max(w_sum, 1).

    >>> import numpy as np
    >>> cross_entropy_weights(np.array([[3, -100, 1]]), np.array([[1.0, 1.0, 0.5]])).tolist()
    [1.0, 0.0, 0.5]
    """
    keep = (targets != ignore_index).reshape(-1)  # (N,)
    w = keep.astype("float32" if dtype is None else dtype)
    if loss_mask is not None:
        w *= loss_mask.reshape(-1).astype(w.dtype, copy=False)
    return w


def _validate(logits: Any, targets: Any, loss_mask: Any, ignore_index: int, bf16: bool) -> None:
    fn = "cross_entropy_forward"
    if not bf16:
        check_float(fn, logits=logits)
    if logits.ndim < 1 or targets.shape != logits.shape[:-1]:
        raise shape_error(fn, "targets must be logits.shape[:-1]", logits=logits, targets=targets)
    if targets.dtype.kind not in "iu":
        raise ValueError(f"{fn}: targets must be integers, got dtype {targets.dtype}")
    if loss_mask is not None and loss_mask.shape != targets.shape:
        raise shape_error(fn, "loss_mask must match targets", targets=targets, loss_mask=loss_mask)
    v = logits.shape[-1]
    if type(targets) is not np.ndarray and is_capturing(targets):  # a CUDA graph reads nothing back:
        return  # the caller checked the ids
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= v))
    if bool(bad.any()):
        raise ValueError(f"{fn}: targets must lie in [0, {v}) or equal ignore_index={ignore_index}")


def cross_entropy_forward(
    logits: Any, targets: Any, loss_mask: Any = None, ignore_index: int = -100
) -> tuple[Any, CrossEntropyCache | CrossEntropyKernelCache]:
    """Mean masked negative log-likelihood as a 0-d array of logits' dtype.

    >>> import numpy as np
    >>> loss, _ = cross_entropy_forward(np.zeros((1, 4)), np.array([2]))
    >>> round(float(loss), 4)  # log(4)
    1.3863
    """
    host = type(logits) is np.ndarray  # NumPy: the array operations below, nothing else to choose
    xp = np if host else get_array_module(logits)
    logits = logits if host else bf16_bits(logits)  # a CuPy bfloat16 array as its bit patterns
    bf16 = not host and is_bf16(logits)
    _validate(logits, targets, loss_mask, ignore_index, bf16)
    v = logits.shape[-1]
    z = logits.reshape(-1, v)  # (N, V)
    t = targets.reshape(-1)  # (N,)
    # (N,) weights, of the logits' dtype (float32 for bf16 logits): the loss's, and the scale's
    w = cross_entropy_weights(t, loss_mask, ignore_index, "float32" if bf16 else logits.dtype)
    t_safe = xp.where(t == ignore_index, 0, t)  # ignored rows read column 0, weighted by 0
    # one kernel per pass; only the log-sum-exp per row is kept, no host sync
    if not host and (bf16 or cuda.float32_on_gpu(z)):
        t_safe = t_safe.astype(xp.int64, copy=False)
        nll, lse = cross_entropy_cuda.cross_entropy_forward(z, t_safe, w)  # (N,) weighted nll, (N,)
        denom = xp.maximum(w.sum(), 1.0)  # device scalar
        cache = CrossEntropyKernelCache(z, lse, t_safe, w, denom, logits.shape)
        return (nll.sum() / denom).astype(w.dtype), cache
    rows = xp.arange(z.shape[0])
    exps = z - z.max(axis=-1, keepdims=True)  # (N, V) shifted logits, max 0: exp cannot overflow
    picked = exps[rows, t_safe]  # (N,) shifted logit of the target
    xp.exp(exps, out=exps)
    total = exps.sum(axis=-1)  # (N,) softmax = exps / total, normalised only in backward
    nll = xp.log(total) - picked  # (N,)
    denom = max(float(w.sum()), 1.0)
    loss = xp.asarray((w * nll).sum() / denom, dtype=logits.dtype)
    return loss, CrossEntropyCache(exps, total, t_safe, w, denom, logits.shape)


def cross_entropy_backward(
    dloss: Any,
    cache: CrossEntropyCache | CrossEntropyKernelCache,
    bf16_out: bool = False,
    in_place: bool = False,
) -> Any:
    """dlogits = dloss * w / denom * (softmax(logits) - onehot(target)), shaped like logits.

    bf16_out (GPU only): dlogits is a bf16 activation, for a head whose products run in bf16; bf16 logits
    always give bf16 dlogits. in_place (bf16 logits only): dlogits is written over the logits, which the
    cache then no longer holds (a second backward from it is wrong), so no second (N, V) array exists.
    """
    fused = type(cache) is CrossEntropyKernelCache
    if bf16_out and not fused:
        raise ValueError("cross_entropy_backward: bf16_out needs float32 CuPy logits (the GPU path)")
    if in_place and not (fused and is_bf16(cache.logits)):
        raise ValueError("cross_entropy_backward: in_place needs bf16 logits")
    if fused:
        z, w, denom = cache.logits, cache.weights, cache.denom
        if isinstance(dloss, int | float):  # a host number: no host-to-device copy (graph capture)
            scale = (float(dloss) / denom).reshape(1).astype(w.dtype)
        else:
            scale = (get_array_module(z).asarray(dloss, dtype=w.dtype) / denom).reshape(1).astype(w.dtype)
        out = z if in_place else None
        dlogits = cross_entropy_cuda.cross_entropy_backward(
            z, cache.lse, cache.targets, w, scale, out, bf16_out=bf16_out
        )
        return dlogits.reshape(cache.shape)
    exps, total, t_safe, w, denom = cache.exps, cache.total, cache.targets, cache.weights, cache.denom
    xp = np if type(exps) is np.ndarray else get_array_module(exps)
    coef = w * (float(dloss) / denom)  # (N,)
    dlogits = exps * (coef / total)[:, None]  # (N, V) coef * softmax
    dlogits[xp.arange(exps.shape[0]), t_safe] -= coef
    return dlogits.reshape(cache.shape)
