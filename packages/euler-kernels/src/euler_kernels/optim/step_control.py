"""The per-step control vector that carries every scalar of an optimizer step to the update kernels.

    control = [grad_scale, apply, lr, bc1, bc2, norm]
    norm = sqrt(sum_squares); grad_scale = max_norm / (norm + 1e-6) when clipping is on and norm > max_norm,
    else 1; apply = 1 when hyper's enable is set and the loss and norm are finite; lr, bc1, bc2 from hyper

hyper = [lr, 1 - beta1**t, 1 - beta2**t, enable] is written by the host (adamw_hyper). On the GPU the
vector is made on the device and never read back until the step ends, so a CUDA graph can replay the
step with a new hyper; on the CPU it is a NumPy array made with the same float32 arithmetic.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels import cuda
from euler_kernels.backend import get_array_module
from euler_kernels.optim import multi_tensor


def step_control(sum_squares: Any, loss: Any, hyper: Any, max_norm: float, out: Any = None) -> Any:
    """control (6,) float32 from the float64 (1,) sum of squares, the float32 loss and the (4,) hyper.

    >>> hyper = np.array([0.1, 0.5, 0.25, 1.0], dtype=np.float32)
    >>> [round(float(c), 4) for c in step_control(np.array([16.0]), np.float32(2.0), hyper, max_norm=1.0)]
    [0.25, 1.0, 0.1, 0.5, 0.25, 4.0]
    """
    if cuda.float32_on_gpu(hyper):
        return multi_tensor.step_control(sum_squares, loss, hyper, max_norm, out=out)
    xp = get_array_module(hyper)
    ss, lossf, h = (np.asarray(a.get() if hasattr(a, "get") else a) for a in (sum_squares, loss, hyper))
    norm = np.float32(np.sqrt(ss.reshape(-1)[0]))
    finite = bool(np.isfinite(norm) and np.isfinite(lossf))
    clip = max_norm > 0 and norm > max_norm
    scale = np.float32(max_norm) / (norm + np.float32(1e-6)) if clip else np.float32(1.0)
    values = [scale, float(finite and h[3] != 0), h[0], h[1], h[2], norm]
    control = xp.empty((6,), dtype=xp.float32) if out is None else out
    control[...] = xp.asarray(np.array(values, dtype=np.float32))
    return control
