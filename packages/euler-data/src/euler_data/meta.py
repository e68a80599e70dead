"""A dataset folder's files: ``meta.json`` (written and read) and memory-mapped token files.

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


def open_bin(path: str | Path, dtype) -> np.ndarray:
    """A read-only memmap of a token file (an empty file gives an empty array; NumPy cannot map it)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(str(path), "missing: is this a folder written by euler-data?")
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")
