"""Launchers of muon.cu: Muon's momentum and its update, reading the control vector and hyper on the
device (capturable); the orthogonalisation between them is newton_schulz_cuda.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels.cuda._module import THREADS, get_kernel, grid


def muon_momentum(update: Any, buf: Any, grad: Any, control: Any, momentum: float, nesterov: bool) -> None:
    args = (update, buf, grad, control, np.float32(momentum), np.int32(nesterov), np.int64(grad.size))
    get_kernel("muon.cu", "muon_momentum")(grid(grad.size), (THREADS,), args)


def muon_apply(param: Any, ortho16: Any, control: Any, hyper: Any, lr_slot: int, shape_scale: float,
               weight_decay: float) -> None:  # fmt: skip
    args = (param, ortho16, control, hyper, np.int32(lr_slot), np.float32(shape_scale),
            np.float32(weight_decay), np.int64(param.size))  # fmt: skip
    get_kernel("muon.cu", "muon_apply")(grid(param.size), (THREADS,), args)
