"""Model tensors on disk: one checkpoint folder holds `model.safetensors` (+ config) and the tokenizer.

Thin wrappers over euler-model's `save_checkpoint` / `load_checkpoint`, plus the optimizer moments in
`optimizer.safetensors`; CuPy arrays are copied to the host before writing. And the folder `export-hf`
writes: new, empty or an earlier export (replaced only with --overwrite), never a folder of euler's own.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

import euler_model
from euler_data import LOCK_FILE, folder_kind, replace_files, unwritable
from euler_train.checkpoint import STATE, CheckpointError, CheckpointManager, os_errors_as, verify
from euler_train.config import ConfigError
from euler_train.runfolder import describe_run

TOKENIZER = "tokenizer.json"
MODEL = "model.safetensors"
# what euler-model's save_hf writes (mtp_heads.safetensors when K > 1, the tokenizer files when there is one)
EXPORT_FILES = (
    "config.json",
    "generation_config.json",
    MODEL,
    "mtp_heads.safetensors",
    TOKENIZER,
    "tokenizer_config.json",
)
EXPORT_TMP = ".tmp-export-"  # + pid: the export being written, inside its folder


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
REFERENCE = "reference_logps.safetensors"  # dpo: the reference model's log-probabilities of every row


def write_fp8_scales(folder: Path, arrays: dict[str, Any]) -> None:
    save_file(to_host(arrays), str(folder / FP8_SCALES))


def write_reference(folder: Path, refs: dict[str, np.ndarray]) -> None:
    """A dpo run's reference log-probabilities (split -> one per row of the preference set)."""
    save_file(
        {split: np.ascontiguousarray(r, dtype=np.float64) for split, r in refs.items()},
        str(folder / REFERENCE),
    )


def read_reference(folder: Path) -> dict[str, np.ndarray]:
    """The reference log-probabilities a dpo checkpoint saved; CheckpointError when it has none."""
    path = Path(folder) / REFERENCE
    if not path.is_file():
        raise CheckpointError(f"{folder} has no {REFERENCE}: not a checkpoint of a dpo run")
    return load_file(str(path))


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


def check_export_folder(out: Path, overwrite: bool) -> None:
    """ConfigError unless `out` is new or empty, or holds an earlier export (or other files of the
    user's) and `overwrite`; a dataset, run or checkpoint folder is refused even then (an export would
    replace or mix with its files). Leftovers of a killed export are removed (the caller holds the lock)."""
    for tmp in out.glob(f"{EXPORT_TMP}*"):
        shutil.rmtree(tmp, ignore_errors=True)
    present = sorted(p.name for p in out.iterdir() if p.name != LOCK_FILE)
    if not present:
        return
    what = euler_folder(out)
    if what is not None:
        raise ConfigError(f"{out} is {what}: an export must not mix with it; choose another --out")
    if overwrite:
        return
    others = [name for name in present if name not in EXPORT_FILES]
    if not others:
        raise ConfigError(
            f"{out} already holds an export ({', '.join(present)}); pass --overwrite to replace it"
        )
    raise ConfigError(
        f"{out} already holds files that are not an export ({', '.join(others[:4])}); choose a new or empty "
        "folder, or pass --overwrite to write the export beside them"
    )


def euler_folder(folder: Path) -> str | None:
    """Which folder of euler's own `folder` is, in a few words (a dataset, run or checkpoint folder)."""
    if folder_kind(folder) in ("dataset", "sft", "unfinished"):
        return f"a dataset folder (euler-data: its {TOKENIZER} would be replaced)"
    if (folder / STATE).is_file():
        return "a checkpoint folder"
    run = describe_run(folder)
    return None if run is None else f"a run folder ({run})"


def write_export(out: Path, write: Callable[[Path], Any]) -> None:
    """`write(folder)` into a temporary folder inside `out`, then moved in whole (euler-data's
    replace_files: config.json last, a Ctrl-C held off until the moves are done) and an earlier export's
    files that this one lacks removed; a failure before the move (the disk full, Ctrl-C) leaves `out` as it
    was, an OSError as one line (FolderUnwritable)."""
    tmp = out / f"{EXPORT_TMP}{os.getpid()}"
    try:
        with os_errors_as(lambda err: unwritable(out, err)):
            write(tmp)
            stale = [out / n for n in EXPORT_FILES if (out / n).is_file() and not (tmp / n).is_file()]
            replace_files(out, tmp, "config.json", stale)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
