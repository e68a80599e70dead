"""Refuse, before the first step, a run whose step will not fit in memory (host RAM on the CPU, device
memory on the GPU), saying how much it needs and what to lower. `run.memory_check = false` skips it.

>>> gib(3 << 30)
'3.0 GiB'
"""

from __future__ import annotations

import os
import resource
from dataclasses import replace
from pathlib import Path
from typing import Any

import euler_model
from euler_train.config import ConfigError, RunConfig, TrainConfig, bf16_grads_allowed


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def available_bytes(device: Any) -> tuple[int, str]:
    """(bytes free for this process, what they are): the GPU's free memory plus what CuPy's pool holds
    unused, or the host's MemAvailable (Linux) / free physical pages, and no more than the address space
    that this process's RLIMIT_AS (`ulimit -v`) leaves it."""
    if device.kind == "gpu":
        free, _ = device.xp.cuda.runtime.memGetInfo()
        pool = device.xp.get_default_memory_pool()
        return int(free + pool.free_bytes()), f"GPU {device.index} memory ({device.name})"
    have, where = _host_bytes()
    left = _address_space_left()
    if left is not None and left < have:
        return left, "address space under this process's limit (ulimit -v)"
    return have, where


def _host_bytes() -> tuple[int, str]:
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "available host memory"
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free host memory"


def _address_space_left() -> int | None:
    """RLIMIT_AS minus the address space already in use (Linux's /proc/self/statm), or None without a
    limit."""
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    statm = Path("/proc/self/statm")
    if limit == resource.RLIM_INFINITY or not statm.is_file():
        return None
    used = int(statm.read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    return max(0, limit - used)


def check_memory(cfg: RunConfig, mcfg: Any, device: Any, processes: int = 1) -> dict[str, int]:
    """ConfigError when the estimated step (times `processes` sharing this host's RAM) exceeds what is
    available; returns the estimate otherwise."""
    train = cfg.train
    precision = cfg.run.precision
    need = _estimate(mcfg, train.batch_size, train, precision)
    if not cfg.run.memory_check:
        return need
    have, where = available_bytes(device)
    share = processes if device.kind == "cpu" else 1
    if need["total"] * share <= have:
        return need
    smaller = range(train.batch_size - 1, 0, -1)
    fits = [b for b in smaller if _total(mcfg, b, train, precision) * share <= have]
    lower = (
        f"lower train.batch_size to {fits[0]} (raise train.grad_accum to keep the tokens per step)"
        if fits
        else "lower model.context or the model's size (batch size 1 does not fit either)"
    )
    rerun = replace(train, recompute=True)
    if not train.recompute and _total(mcfg, train.batch_size, rerun, precision) * share <= have:
        lower = f"set train.recompute=true (--recompute: it fits then) or {lower}"
    halved = replace(train, bf16_grads=True)
    if (
        not cfg.train.bf16_grads
        and bf16_grads_allowed(cfg)
        and _total(mcfg, train.batch_size, halved, precision) * share <= have
    ):
        lower = f"set train.bf16_grads=true (it fits then) or {lower}"
    remade = replace(train, keep_activations=False)
    if train.keep_activations and _total(mcfg, train.batch_size, remade, precision) * share <= have:
        lower = f"set train.keep_activations=false (it fits then) or {lower}"
    state = need["weights"] + need["gradients"] + need["optimizer"]
    raise ConfigError(
        f"the step needs about {gib(need['total'] * share)} of {where} but {gib(have)} is available "
        f"(weights + gradients + AdamW {gib(state)}, activations {gib(need['activations'])} at batch "
        f"{train.batch_size} x context {mcfg.context}"
        + (" with train.recompute" if train.recompute else "")
        + f", evaluation {gib(need['evaluation'])}"
        + (f", x {share} processes" if share > 1 else "")
        + f"): {lower}, or set run.memory_check=false to try anyway"
    )


def _estimate(mcfg: Any, batch: int, train: TrainConfig, precision: str) -> dict[str, int]:
    act = 2 if precision in ("bf16", "fp8") else 4  # bytes of an activation
    fp8 = precision == "fp8"
    kept = (train.keep_activations, train.bf16_grads)
    return euler_model.step_memory(mcfg, batch, train.grad_accum, act, train.recompute, fp8, *kept)


def _total(mcfg: Any, batch: int, train: TrainConfig, precision: str) -> int:
    return _estimate(mcfg, batch, train, precision)["total"]
