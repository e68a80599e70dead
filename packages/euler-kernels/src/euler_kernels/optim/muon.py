"""Muon for 2-D weight matrices: momentum, Newton-Schulz orthogonalisation, a shape-scaled step.

For each matrix p (r, c) with gradient g and momentum buffer m, as torch.optim.Muon does it:

    g = grad_scale * g                                   (global-norm clipping, from the control vector)
    m = m + (1 - mu) (g - m);   u = g + mu (m - g)        (Nesterov; plain: u = m)
    p = p (1 - lr wd) - lr * sqrt(max(1, r / c)) * newton_schulz(u)

Every per-step scalar comes from the device: grad_scale and the apply flag from step_control's control
vector, the learning rate from hyper[lr_slot]; apply = 0 changes nothing. Float32 CuPy: muon.cu kernels and
bf16 cuBLAS products, nothing read back (capturable), the matrices of one shape orthogonalised together
as one stack (batched products: a few dozen launches per shape instead of per matrix); NumPy: the same
arithmetic in the arrays' dtype, one matrix at a time.
"""

from __future__ import annotations

import math
from typing import Any

from euler_kernels import cuda
from euler_kernels.backend import get_array_module, is_bf16
from euler_kernels.optim import muon_cuda
from euler_kernels.optim.newton_schulz import newton_schulz


def muon_shape_scale(shape: tuple[int, ...]) -> float:
    """The learning-rate factor of a matrix of this shape: sqrt(max(1, rows / cols)).

    >>> muon_shape_scale((512, 128)), muon_shape_scale((128, 512))
    (2.0, 1.0)
    """
    return math.sqrt(max(1.0, shape[0] / shape[1]))


def shape_groups(params: list[Any]) -> dict[tuple[int, ...], list[int]]:
    """The indices of the matrices of each shape, shapes in order of first appearance.

    >>> import numpy as np
    >>> shape_groups([np.zeros((2, 3)), np.zeros((3, 2)), np.zeros((2, 3))])
    {(2, 3): [0, 2], (3, 2): [1]}
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault(tuple(p.shape), []).append(i)
    return groups


def muon_scratch(params: list[Any]) -> dict[tuple[int, ...], Any]:
    """One zeroed (n, r, c) stack per shape of `params` (n matrices of that shape), in their array module."""
    xp = get_array_module(params[0]) if params else None
    groups = shape_groups(params).items()
    return {shape: xp.zeros((len(ix), *shape), dtype=params[ix[0]].dtype) for shape, ix in groups}


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
    `scratch`: on the GPU, the (n, r, c) stacks that hold the momentum-corrected updates of the matrices of
    each shape (`muon_scratch(params)`), kept by the caller so a captured step reuses the same addresses;
    None: fresh ones.

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
        if is_bf16(g):  # the momentum kernel reads float32 (train.bf16_grads is AdamW's)
            raise ValueError("muon_update: needs float32 gradients, got bf16 (set train.bf16_grads=false)")
    if params and cuda.float32_on_gpu(*params, *bufs, *grads, control, hyper):
        scratch = scratch or muon_scratch(params)
        for shape, members in shape_groups(params).items():
            stack = scratch[shape]  # (n, r, c): row i is members[i]'s update
            for u, i in zip(stack, members):
                muon_cuda.muon_momentum(u, bufs[i], grads[i], control, momentum, nesterov)
            ortho = newton_schulz(stack)
            scale = muon_shape_scale(shape)
            for o, i in zip(ortho, members):
                muon_cuda.muon_apply(params[i], o, control, hyper, lr_slot, scale, weight_decay)
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
