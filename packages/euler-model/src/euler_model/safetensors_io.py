"""Reading a safetensors file into NumPy arrays, bfloat16 included, with clear errors."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
from safetensors import safe_open


def _bf16_tensor(path: Path, name: str) -> np.ndarray:
    """A bfloat16 tensor as float32 (NumPy has no bfloat16): read its bytes from the file's header offsets."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))  # the header's length, little-endian u64
        info = json.loads(f.read(n))[name]
        start, end = info["data_offsets"]
        f.seek(8 + n + start)
        raw = np.frombuffer(f.read(end - start), dtype="<u2")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])  # bf16 = top half of f32


def read_safetensors(path: str | Path, where: str = "read_safetensors") -> dict[str, np.ndarray]:
    """Every tensor of a .safetensors file; a ValueError naming the file if it is corrupt or truncated."""
    path = Path(path)
    try:
        tensors = {}
        with safe_open(str(path), framework="numpy") as f:
            for name in f.keys():
                if f.get_slice(name).get_dtype() == "BF16":
                    tensors[name] = _bf16_tensor(path, name)
                else:
                    tensors[name] = f.get_tensor(name)
        return tensors
    except Exception as err:  # safetensors raises its own error types for damaged files
        raise ValueError(
            f"{where}: {path} is not a readable safetensors file (corrupt or truncated?): {err}"
        ) from err
