"""Muon for 2-D weight matrices: momentum, Newton-Schulz orthogonalisation, a shape-scaled step.

For each matrix p (r, c) with gradient g and momentum buffer m, as torch.optim.Muon does it:

    g = grad_scale * g                                   (global-norm clipping, from the control vector)
    m = m + (1 - mu) (g - m);   u = g + mu (m - g)        (Nesterov; plain: u = m)
    p = p (1 - lr wd) - lr * sqrt(max(1, r / c)) * newton_schulz(u)

Every per-step scalar comes from the device: grad_scale and the apply flag from step_control's control
vector, the learning rate from hyper[lr_slot]; apply = 0 changes nothing. Float32 CuPy: muon.cu kernels and
bf16 cuBLAS products, nothing read back (capturable); NumPy: the same arithmetic in the arrays' dtype.
"""

from __future__ import annotations

import math
from typing import Any

from euler_kernels import cuda
from euler_kernels.backend import get_array_module
from euler_kernels.cuda import muon as muon_cuda
from euler_kernels.ops.newton_schulz import newton_schulz


def muon_shape_scale(shape: tuple[int, ...]) -> float:
    """The learning-rate factor of a matrix of this shape: sqrt(max(1, rows / cols)).

    >>> muon_shape_scale((512, 128)), muon_shape_scale((128, 512))
    (2.0, 1.0)
    """
    return math.sqrt(max(1.0, shape[0] / shape[1]))


def muon_update(
    params: list[Any],
    bufs: list[Any],
    grads: list[Any],
    control: Any,
    hyper: Any,
    lr_slot: int,
    momentum: float = 0.95,
    nesterov: bool = True,
    weight_decay: float = 0.0,
    scratch: list[Any] | None = None,
) -> None:
    """One Muon step on every matrix in `params`, in place on params and bufs (see the module docstring).
    `scratch`: one array per matrix for the momentum-corrected update on the GPU, kept by the caller so a
    captured step reuses the same addresses (and the multi-tensor tables built for them); None: fresh ones.

    >>> import numpy as np
    >>> p, m = [np.eye(2)], [np.zeros((2, 2))]
    >>> control, hyper = np.array([1, 1, 0, 0, 0, 0], np.float32), np.array([0.1], np.float32)
    >>> muon_update(p, m, [np.diag([2.0, 1.0])], control, hyper, lr_slot=0)
    >>> bool(np.all(np.abs(np.diag(p[0]) - 0.9) < 0.04))  # both directions move by about lr
    True
    """
    for p, m, g in zip(params, bufs, grads):
        if p.ndim != 2 or p.shape != m.shape or p.shape != g.shape:
            raise ValueError(f"muon_update: needs matrices of one shape, got {p.shape}, {m.shape}, {g.shape}")
    if params and cuda.fused(*params, *bufs, *grads, control, hyper):
        import cupy  # the fused path runs only where CuPy is

        scratch = scratch or [cupy.empty_like(g) for g in grads]
        for p, m, g, u in zip(params, bufs, grads, scratch):
            muon_cuda.muon_momentum(u, m, g, control, momentum, nesterov)
            ortho = newton_schulz(u)
            muon_cuda.muon_apply(p, ortho, control, hyper, lr_slot, muon_shape_scale(p.shape), weight_decay)
        return
    scale, apply = (float(c) for c in control[:2])
    if apply == 0.0:
        return
    lr = float(hyper[lr_slot])
    for p, m, g in zip(params, bufs, grads):
        xp = get_array_module(p)
        g = g * scale if scale != 1.0 else g
        m += (1.0 - momentum) * (g - m)
        u = g + momentum * (m - g) if nesterov else m
        step = newton_schulz(xp.asarray(u))
        p *= 1.0 - lr * weight_decay
        p -= (lr * muon_shape_scale(p.shape)) * step
