"""Model tensors on disk: one checkpoint folder holds `model.safetensors` (+ config) and the tokenizer.

Thin wrappers over euler-model's `save_checkpoint` / `load_checkpoint`, plus the optimizer moments in
`optimizer.safetensors`; CuPy arrays are copied to the host before writing.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

import euler_model
from euler_train.checkpoint import CheckpointError, CheckpointManager, verify

TOKENIZER = "tokenizer.json"
MODEL = "model.safetensors"


def to_host(arrays: dict[str, Any]) -> dict[str, np.ndarray]:
    """NumPy copies of a dict of NumPy or CuPy arrays (contiguous, as safetensors needs)."""
    return {k: np.ascontiguousarray(v.get() if hasattr(v, "get") else v) for k, v in arrays.items()}


def write_model(
    folder: Path, mcfg: Any, params: dict[str, Any], metadata: dict[str, Any], tokenizer: Path | None
):
    """model.safetensors (+ whatever euler-model writes beside it) and a copy of tokenizer.json."""
    euler_model.save_checkpoint(folder / MODEL, mcfg, to_host(params), metadata=metadata)
    if tokenizer is not None:
        shutil.copyfile(tokenizer, folder / TOKENIZER)


def write_optimizer(folder: Path, tensors: dict[str, Any]) -> None:
    save_file(to_host(tensors), str(folder / "optimizer.safetensors"))


def read_optimizer(folder: Path) -> dict[str, np.ndarray]:
    return load_file(str(folder / "optimizer.safetensors"))


FP8_SCALES = "fp8_scales.safetensors"  # the delayed FP8 scales of an fp8 run (train.fp8_scaling = "delayed")


def write_fp8_scales(folder: Path, arrays: dict[str, Any]) -> None:
    save_file(to_host(arrays), str(folder / FP8_SCALES))


def read_fp8_scales(folder: Path) -> dict[str, np.ndarray] | None:
    """The saved delayed FP8 scales, or None for a checkpoint without them."""
    path = Path(folder) / FP8_SCALES
    return load_file(str(path)) if path.is_file() else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder from a checkpoint folder, a run folder (its newest valid one) or checkpoints/."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if (path / "checksums.sha256").is_file():
        reason = verify(path)
        if reason:
            raise CheckpointError(f"checkpoint {path} is unusable: {reason}")
        return path
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    found = CheckpointManager(root).latest_valid()
    if found is None:
        raise CheckpointError(f"no checkpoint in {path} (expected RUN/checkpoints/step_N/)")
    return found


def load_model(path: str | Path, xp: Any = np) -> tuple[Any, dict[str, Any], dict[str, Any], Path]:
    """(model config, params on xp, metadata, checkpoint folder) from a checkpoint or run folder."""
    folder = resolve_checkpoint(path)
    try:
        mcfg, params, metadata = euler_model.load_checkpoint(folder / MODEL, xp=xp)
    except (OSError, ValueError) as err:
        raise CheckpointError(str(err)) from None
    return mcfg, params, metadata or {}, folder
