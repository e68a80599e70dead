"""Devices and precision: `--device cpu|gpu|auto`, `--precision fp32|tf32|bf16|fp8`, and MFU.

>>> resolve_device("cpu").xp.__name__
'numpy'
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from types import ModuleType

import numpy as np

import euler_kernels as ek
from euler_kernels.heap import keep_freed_memory
from euler_train.config import DeviceConfig, note

# Dense peak FLOP/s of one GPU by precision, for MFU; matched against the device name.
PEAK_FLOPS = {
    "H200": {"fp32": 67e12, "tf32": 495e12, "bf16": 989e12},
    "H100": {"fp32": 67e12, "tf32": 495e12, "bf16": 989e12},
    "A100": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12},
}


@dataclass(frozen=True)
class Device:
    """Where the arrays live: `kind` is "cpu" or "gpu", `xp` numpy or cupy, `index` the GPU ordinal; and
    `precision`, how the run's products and attention are computed there (made once by setup_device)."""

    kind: str
    xp: ModuleType
    index: int = 0
    name: str = "cpu"
    precision: ek.Precision = ek.EXACT


def _cupy_or_none() -> ModuleType | None:
    try:
        import cupy

        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:
        return None


def resolve_device(device: str, local_rank: int = 0) -> Device:
    """cpu -> NumPy; gpu -> CuPy on GPU `local_rank` (clear error when absent); auto -> gpu if usable."""
    if device not in ("cpu", "gpu", "auto"):
        raise ValueError(f"resolve_device: device must be cpu, gpu or auto, got {device!r}")
    cupy = None if device == "cpu" else _cupy_or_none()
    if device == "gpu" and cupy is None:
        raise RuntimeError(
            "--device gpu needs CuPy and a CUDA device (pip install 'euler-train[gpu]'); "
            "none is usable here: use --device cpu or auto"
        )
    if cupy is None:
        return Device("cpu", np)
    cupy.cuda.Device(local_rank).use()
    props = cupy.cuda.runtime.getDeviceProperties(local_rank)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return Device("gpu", cupy, local_rank, name)


def setup_device(run: DeviceConfig, local_rank: int = 0) -> Device:
    """The device of a run's [run] section, with the precision it computes in (`Device.precision`).

    fp32: exact float32 everywhere. tf32: float32 matmuls and FlashAttention on the TF32 tensor cores.
    bf16: matmuls and FlashAttention on the bf16 tensor cores, accumulating in float32; norms,
    projections, RoPE, SwiGLU and attention store their outputs as bf16 (euler_kernels.Precision.bf16),
    while the residual stream, weights, gradients of weights, moments, softmax statistics and the loss
    stay float32. fp8: bf16, except that the MLP's and the heads' products run on the FP8 tensor cores
    (e4m3 activations and weights, e5m2 gradients, one scale per tensor; sm_89 or later).
    run.attention_kernel and run.gemm_tuning complete the precision (euler_kernels/precision.py).
    """
    if run.precision not in ("fp32", "tf32", "bf16", "fp8"):
        raise ValueError(f"setup_device: precision must be fp32, tf32, bf16 or fp8, got {run.precision!r}")
    precision = ek.Precision(run.precision, run.attention_kernel, run.gemm_tuning)
    dev = resolve_device(run.device, local_rank)
    if dev.kind == "cpu" and run.precision != "fp32":
        raise ValueError(f"--precision {run.precision} needs a GPU; the CPU path is fp32")
    if dev.kind == "cpu":  # a NumPy step then reuses the last one's freed pages (euler_kernels/heap.py)
        keep_freed_memory()
    if run.precision == "fp8" and int(dev.xp.cuda.Device(local_rank).compute_capability) < 89:
        raise ValueError(
            f"--precision fp8 needs FP8 tensor cores (sm_89 or later: Ada, Hopper); {dev.name} has none: "
            "use --precision bf16"
        )
    return replace(dev, precision=precision)


OLD_SWITCHES = {
    "EULER_MATMUL_PRECISION": "--precision",
    "EULER_FLASH_KERNEL": "--set run.attention_kernel=auto|sm90|mma",
    "EULER_GEMM_TUNE": "--set run.gemm_tuning=true|false",
}


def note_old_switches() -> None:
    """One note on stderr for each environment variable that used to choose kernels and no longer does,
    naming the setting that does (the run's precision is chosen once, from its config); a command makes
    it once, as it starts (commands.dispatch)."""
    for name, setting in OLD_SWITCHES.items():
        if name in os.environ:
            note(f"{name} is no longer read; {setting} chooses it")


def peak_flops(device: Device, precision: str) -> float | None:
    """Dense peak FLOP/s of the device at this precision, or None when unknown (CPU, other GPUs); fp8's
    MFU is counted against the bf16 peak, so that the two modes compare."""
    for key, table in PEAK_FLOPS.items():
        if device.kind == "gpu" and key in device.name:
            return table["bf16" if precision == "fp8" else precision]
    return None


def flops_per_token(n_params: int, n_layers: int, dim: int, context: int) -> float:
    """Training FLOPs per token: 6 N for the matmuls plus 12 L T C for attention scores (PaLM's count)."""
    return 6.0 * n_params + 12.0 * n_layers * context * dim
