"""Delayed FP8 scales: the state that lets a kernel cast its output to FP8 as it makes it (fp8_scales.cu).

A tensor cast with the current scaling of fp8.py needs its absolute maximum first, so whatever makes it
writes it in bf16 and a cast pass reads it again. With a delayed scale the kernel that makes the tensor
casts it with a scale known before it starts: the one its largest |value| over the last `history` steps
gives (fp8_format.delayed_exponent), and it raises this step's maximum for the next ones. Values beyond the
scale's range saturate to the format's largest value; the kernels count them (`saturated`), so a caller can
report them. The state is a handful of small device arrays, updated on the device once a step
(`update_scales`, which a captured CUDA graph can hold), and saved with a checkpoint (`scale_arrays`,
`scales_from_arrays`) so a resumed run casts as the uninterrupted one.

A new state has empty histories (scale 1): its first step must measure the maxima some other way (the
current-scaling path, raising `amax_now`) before the kernels cast with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from euler_kernels.cuda._module import get_kernel
from euler_kernels.matmul.fp8_format import FORMATS

HISTORY = 16  # steps of maxima a scale looks back on
MARGIN = 1  # binades a scale leaves above its history's maximum: tensors that grow fast saturate less
SCALE_INV_STRIDE = 4  # floats between slots' scale_inv: cuBLASLt refuses a scale pointer not 16-byte aligned
_ARRAYS = ("history", "amax_now", "exponent", "saturated", "step")  # scale_inv is 2^-exponent: not saved


@dataclass
class Fp8Scales:
    """One delayed scale per tracked tensor ("slot"), all on the device.

    formats: each slot's format ("e4m3" or "e5m2"); history (slots, H) uint32: the maxima of the last H
    steps as float bit patterns; amax_now (slots,) uint32: this step's, raised by the kernels that make the
    tensors; exponent (slots,) int32: the k they cast with (x stored as fp8(x 2^k)); scale_inv (slots,
    SCALE_INV_STRIDE) float32: 2^-k in column 0, for the products; saturated (slots,) uint64: values
    saturated so far; step (1,) int32: updates so far (the ring's position); max_exponent (slots,) int32:
    the formats' (9 e4m3, 16 e5m2); margin: binades of headroom (fp8_format.delayed_exponent's)."""

    formats: tuple[str, ...]
    history: Any
    amax_now: Any
    exponent: Any
    scale_inv: Any
    saturated: Any
    step: Any
    max_exponent: Any
    margin: int = MARGIN
    calibrated: bool = False  # host flag: the histories hold a step's maxima (the kernels may cast with them)

    def slot(self, i: int) -> tuple[Any, Any, Any, Any]:
        """Slot i's device scalars as a kernel takes them: (exponent, scale_inv, amax_now, saturated)."""
        return self.exponent[i], self.scale_inv[i, 0], self.amax_now[i], self.saturated[i]


def new_scales(formats: list[str], history: int = HISTORY, margin: int = MARGIN) -> Fp8Scales:
    """A state for len(formats) tensors with empty histories: scale 1 (k 0) until `update_scales`."""
    import cupy

    for fmt in formats:
        if fmt not in FORMATS:
            raise ValueError(f"new_scales: format must be one of {sorted(FORMATS)}, got {fmt!r}")
    if history < 1:
        raise ValueError(f"new_scales: history must be at least 1 step, got {history}")
    n = len(formats)
    return Fp8Scales(
        formats=tuple(formats),
        history=cupy.zeros((n, history), dtype=cupy.uint32),
        amax_now=cupy.zeros(n, dtype=cupy.uint32),
        exponent=cupy.zeros(n, dtype=cupy.int32),
        scale_inv=cupy.ones((n, SCALE_INV_STRIDE), dtype=cupy.float32),
        saturated=cupy.zeros(n, dtype=cupy.uint64),
        step=cupy.zeros(1, dtype=cupy.int32),  # (1,), not (): a checkpoint's arrays are at least 1-D
        max_exponent=cupy.asarray([FORMATS[f][3] for f in formats], dtype=cupy.int32),
        margin=margin,
    )


def update_scales(scales: Fp8Scales) -> None:
    """End of a step (on the device, no synchronisation): this step's maxima into the histories, the next
    step's exponents and scale_inv from them, amax_now back to 0."""
    slots, h = scales.history.shape
    if slots == 0:
        return
    stride, margin = np.int32(SCALE_INV_STRIDE), np.int32(scales.margin)
    args = (scales.history, scales.amax_now, scales.exponent, scales.scale_inv, stride, scales.max_exponent,
            margin, scales.step, np.int32(slots), np.int32(h))  # fmt: skip
    get_kernel("fp8_scales.cu", "fp8_scales_update")((1,), (256,), args)


def scale_arrays(scales: Fp8Scales) -> dict[str, np.ndarray]:
    """The state as host arrays, for a checkpoint (amax_now included: a state saved mid-step resumes
    mid-step)."""
    return {name: getattr(scales, name).get() for name in _ARRAYS}


def scales_from_arrays(formats: list[str], arrays: dict[str, np.ndarray]) -> Fp8Scales:
    """The state `scale_arrays` saved, checked against the tensors it is for: one line naming what does not
    match (ValueError) rather than scales for the wrong tensors."""
    missing = [name for name in _ARRAYS if name not in arrays]
    if missing:
        raise ValueError(f"fp8 scales: the saved state lacks {', '.join(missing)}")
    n = len(formats)
    history = np.asarray(arrays["history"])
    if history.ndim != 2 or history.shape[0] != n:
        saved = history.shape[0] if history.ndim else "?"
        raise ValueError(f"fp8 scales: saved for {saved} tensors, need {n}")
    scales = new_scales(formats, history.shape[1])
    restore_scales(scales, arrays)
    return scales


def restore_scales(scales: Fp8Scales, arrays: dict[str, np.ndarray]) -> None:
    """Put a state `scale_arrays` took back into `scales`, in place (the arrays a captured step reads stay
    where they are), scale_inv from its exponents; calibrated when it holds at least one update."""
    import cupy

    for name in _ARRAYS:
        target = getattr(scales, name)
        value = np.asarray(arrays[name])
        if value.shape != target.shape:
            raise ValueError(f"fp8 scales: {name} has shape {value.shape}, need {target.shape}")
        target[...] = cupy.asarray(value.astype(target.dtype, copy=False))
    scales.scale_inv[:, 0] = cupy.ldexp(cupy.ones(len(scales.formats), cupy.float32), -scales.exponent)
    scales.calibrated = int(np.asarray(arrays["step"]).reshape(-1)[0]) > 0
