"""AdamW with bias correction and decoupled weight decay, updating param, m and v in place."""

from __future__ import annotations

from typing import Any

from euler_kernels import cuda
from euler_kernels.backend import get_array_module
from euler_kernels.cuda import multi_tensor


def _check(param: Any, m: Any, v: Any, grad: Any, step: int) -> None:
    arrays = {"param": param, "m": m, "v": v, "grad": grad}
    if any(a.shape != param.shape for a in arrays.values()):
        shapes = ", ".join(f"{n}{tuple(a.shape)}" for n, a in arrays.items())
        raise ValueError(f"adamw_update: param, m, v and grad must share one shape; got {shapes}")
    if any(a.dtype != param.dtype for a in arrays.values()) or param.dtype.kind != "f":
        dtypes = ", ".join(f"{n}: {a.dtype}" for n, a in arrays.items())
        raise ValueError(f"adamw_update: param, m, v and grad must share one float dtype; got {dtypes}")
    if step < 1:
        raise ValueError(f"adamw_update: step counts from 1, got {step}")


def adamw_update(
    param: Any,
    m: Any,
    v: Any,
    grad: Any,
    step: int,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.95,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> None:
    """One AdamW step, in place on param, m, v:

    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g**2;  m_hat = m / (1 - b1**step);  v_hat = v / (1 - b2**step)
    param = param - lr * wd * param - lr * m_hat / (sqrt(v_hat) + eps)

    >>> import numpy as np
    >>> p, m, v = np.ones(1), np.zeros(1), np.zeros(1)
    >>> adamw_update(p, m, v, np.full(1, 0.5), step=1, lr=0.1)
    >>> round(float(p[0]), 6)  # first step moves by lr * sign(g)
    0.9
    """
    _check(param, m, v, grad, step)
    xp = get_array_module(param)
    m *= beta1
    m += (1.0 - beta1) * grad
    v *= beta2
    v += (1.0 - beta2) * (grad * grad)
    bc1 = 1.0 - beta1**step
    bc2 = 1.0 - beta2**step
    denom = xp.sqrt(v)
    denom *= 1.0 / bc2**0.5  # sqrt(v_hat)
    denom += eps
    if weight_decay:
        param *= 1.0 - lr * weight_decay  # decoupled decay, uses param before the Adam step
    upd = xp.divide(m, denom, out=denom)
    upd *= lr / bc1
    param -= upd


def adamw_update_many(
    params: list[Any],
    ms: list[Any],
    vs: list[Any],
    grads: list[Any],
    step: int,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.95,
    eps: float = 1e-8,
    weight_decays: list[float] | None = None,
) -> None:
    """`adamw_update` over many tensors at once, each with its own weight decay (default 0).

    Float32 CuPy tensors are updated by one fused multi-tensor kernel launch; anything else runs
    `adamw_update` tensor by tensor, with the same arithmetic.

    >>> import numpy as np
    >>> ps, ms, vs = [np.ones(2), np.ones(1)], [np.zeros(2), np.zeros(1)], [np.zeros(2), np.zeros(1)]
    >>> adamw_update_many(ps, ms, vs, [np.ones(2), -np.ones(1)], step=1, lr=0.1, weight_decays=[0.0, 0.5])
    >>> [round(float(p[0]), 6) for p in ps]
    [0.9, 1.05]
    """
    decays = [0.0] * len(params) if weight_decays is None else list(weight_decays)
    if not len(params) == len(ms) == len(vs) == len(grads) == len(decays):
        raise ValueError(
            f"adamw_update_many: params, ms, vs, grads and weight_decays must have equal lengths, got "
            f"{len(params)}, {len(ms)}, {len(vs)}, {len(grads)}, {len(decays)}"
        )
    tensors = [*params, *ms, *vs, *grads]
    if params and cuda.fused(*tensors) and all(t.flags.c_contiguous for t in tensors):
        for p, m, v, g in zip(params, ms, vs, grads):
            _check(p, m, v, g, step)
        multi_tensor.adamw_multi(params, ms, vs, grads, decays, step, lr, beta1, beta2, eps)
        return
    for p, m, v, g, wd in zip(params, ms, vs, grads, decays):
        adamw_update(p, m, v, g, step, lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=wd)
