"""A dataset folder's files: ``meta.json`` (written and read) and memory-mapped token files (one
``{split}.bin``, or the shards ``meta.json["shards"]`` lists).

What meta.json holds is counted by SQL over the pipeline tables (``counts.build_meta``). Reading a
folder needs no DuckDB, so ``import euler_data`` (the loaders) does not pull it in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from euler_data.errors import DataError

META_NAME = "meta.json"


def write_meta(folder: str | Path, meta: dict[str, Any]) -> Path:
    path = Path(folder) / META_NAME
    path.write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def read_meta(folder: str | Path) -> dict[str, Any]:
    """The ``meta.json`` of a dataset folder, e.g. ``read_meta("data/shakespeare")["tokens"]["val"]``."""
    path = Path(folder) / META_NAME
    if not path.is_file():
        raise DataError(str(path), "no meta.json: is this a folder written by `euler-data prepare`?")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise DataError(str(path), f"not valid JSON: {err}") from err


def split_paths(folder: str | Path, split: str, meta: dict[str, Any] | None = None) -> list[Path]:
    """The token files of a split in order: ``meta.json["shards"][split]``, or ``{split}.bin`` for a folder
    written before shards (or by another tool in nanoGPT's layout)."""
    folder = Path(folder)
    meta = read_meta(folder) if meta is None else meta
    files = meta.get("shards", {}).get(split)
    return [folder / f["file"] for f in files] if files else [folder / f"{split}.bin"]


def open_split(folder: str | Path, split: str, meta: dict[str, Any] | None = None) -> list[np.ndarray]:
    """Read-only memmaps of a split's token files, in order (concatenated, they are the split's stream)."""
    return [open_bin(path, np.uint16) for path in split_paths(folder, split, meta)]


def open_bin(path: str | Path, dtype) -> np.ndarray:
    """A read-only memmap of a token file (an empty file gives an empty array; NumPy cannot map it)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(str(path), "missing: is this a folder written by euler-data?")
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")
