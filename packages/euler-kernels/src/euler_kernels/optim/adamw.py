"""AdamW with bias correction and decoupled weight decay, updating param, m and v in place.

Two entry points with one arithmetic: `adamw_update_many` (the step's scalars from the host) and
`adamw_update_ctl` (every per-step scalar read from a control vector made by `step_control`, so a CUDA
graph can replay it); `bias_corrections` is the one place 1 - beta**t is computed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels import cuda
from euler_kernels.backend import get_array_module, is_bf16
from euler_kernels.cuda.cast import as_float32
from euler_kernels.optim import multi_tensor


def _check(param: Any, m: Any, v: Any, grad: Any) -> None:
    """One shape; one float dtype, except a bf16 gradient of a float32 CuPy weight (train.bf16_grads)."""
    arrays = {"param": param, "m": m, "v": v, "grad": grad}
    if any(a.shape != param.shape for a in arrays.values()):
        shapes = ", ".join(f"{n}{tuple(a.shape)}" for n, a in arrays.items())
        raise ValueError(f"adamw_update: param, m, v and grad must share one shape; got {shapes}")
    bf16_grad = is_bf16(grad) and param.dtype == np.float32
    same = [a for n, a in arrays.items() if not (n == "grad" and bf16_grad)]
    if any(a.dtype != param.dtype for a in same) or param.dtype.kind != "f":
        dtypes = ", ".join(f"{n}: {a.dtype}" for n, a in arrays.items())
        raise ValueError(f"adamw_update: param, m, v and grad must share one float dtype; got {dtypes}")


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
    adamw_update_many([param], [m], [v], [grad], step, lr, beta1, beta2, eps, [weight_decay])


def bias_corrections(beta1: float, beta2: float, step: int) -> tuple[float, float]:
    """(1 - beta1**step, 1 - beta2**step) of AdamW's update number `step` (counted from 1).

    >>> bias_corrections(0.5, 0.5, 2)
    (0.75, 0.75)
    """
    if step < 1:
        raise ValueError(f"adamw_update: step counts from 1, got {step}")
    return 1.0 - beta1**step, 1.0 - beta2**step


def adamw_hyper(lr: float, step: int, beta1: float, beta2: float, enable: bool = True) -> Any:
    """The host's per-step input to `step_control`: float32 [lr, bc1, bc2, enable] (NumPy).

    >>> adamw_hyper(0.1, 1, 0.5, 0.75).tolist()
    [0.10000000149011612, 0.5, 0.25, 1.0]
    """
    return np.array([lr, *bias_corrections(beta1, beta2, step), float(enable)], dtype=np.float32)


def _update(param: Any, m: Any, v: Any, grad: Any, decay: float, lr, bc1, bc2, beta1, beta2, eps) -> None:
    """One tensor's AdamW update in place (the arithmetic of multi_tensor.cu's adamw_element)."""
    xp = get_array_module(param)
    m *= beta1
    m += (1.0 - beta1) * grad
    v *= beta2
    v += (1.0 - beta2) * (grad * grad)
    denom = xp.sqrt(v / bc2)
    denom += eps
    upd = xp.divide(m / bc1, denom, out=denom)  # m_hat / (sqrt(v_hat) + eps)
    if decay:
        upd += decay * param  # decoupled decay, uses param before the Adam step
    upd *= lr
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
    for p, m, v, g in zip(params, ms, vs, grads):
        _check(p, m, v, g)
    bc = bias_corrections(beta1, beta2, step)
    if _fused(params, ms, vs, grads):
        multi_tensor.adamw_multi(params, ms, vs, grads, decays, bc, lr, beta1, beta2, eps)
        return
    for p, m, v, g, wd in zip(params, ms, vs, grads, decays):
        _update(p, m, v, as_float32(g), wd, lr, *bc, beta1, beta2, eps)


def adamw_update_ctl(
    params: list[Any],
    ms: list[Any],
    vs: list[Any],
    grads: list[Any],
    weight_decays: list[float],
    control: Any,
    beta1: float = 0.9,
    beta2: float = 0.95,
    eps: float = 1e-8,
    copies: list[Any | None] | None = None,
) -> None:
    """AdamW over many tensors with the clip factor, lr, bias corrections and a skip flag read from
    `control` = [grad_scale, apply, lr, bc1, bc2, norm] (see step_control); apply = 0 changes nothing.
    Float32 CuPy tensors: one fused launch that reads control on the device (capturable); otherwise
    tensor by tensor with the same arithmetic. copies (CuPy only): per tensor a bf16 copy (uint16, as
    to_bf16_many makes) that the launch rewrites from the updated weights, or None.

    >>> import numpy as np
    >>> p, m, v = [np.ones(1)], [np.zeros(1)], [np.zeros(1)]
    >>> control = np.array([0.5, 1.0, 0.1, 0.1, 0.05, 4.0], dtype=np.float32)
    >>> adamw_update_ctl(p, m, v, [np.full(1, 2.0)], [0.0], control)
    >>> round(float(p[0][0]), 6)  # the first step moves by lr * sign(g)
    0.9
    """
    for p, m, v, g in zip(params, ms, vs, grads):
        _check(p, m, v, g)
    if _fused(params, ms, vs, grads):
        args = (list(weight_decays), control, beta1, beta2, eps, copies)
        multi_tensor.adamw_multi_ctl(params, ms, vs, grads, *args)
        return
    if copies is not None and any(c is not None for c in copies):
        raise ValueError("adamw_update_ctl: bf16 copies are written only for float32 CuPy tensors")
    scale, apply, lr, bc1, bc2, _ = (float(c) for c in control)
    if apply == 0.0:
        return
    for p, m, v, g, wd in zip(params, ms, vs, grads, weight_decays):
        g = as_float32(g)
        _update(p, m, v, g * scale if scale != 1.0 else g, wd, lr, bc1, bc2, beta1, beta2, eps)


def _fused(params: list[Any], ms: list[Any], vs: list[Any], grads: list[Any]) -> bool:
    """Whether one multi-tensor launch takes them: float32 CuPy state, float32 or bf16 gradients."""
    tensors = [*params, *ms, *vs]
    state = bool(tensors) and cuda.float32_on_gpu(*tensors) and all(t.flags.c_contiguous for t in tensors)
    return state and cuda.fused_grads(*grads)
