"""Model checkpoints: weights in safetensors, with the config, a checksum and a format version as metadata.

The safetensors header's string metadata holds:
    format          "euler-model"
    format_version  FORMAT_VERSION
    config          the ModelConfig as JSON
    checksum        sha256 over the config JSON and every tensor's name, dtype, shape and bytes (by name)
    metadata        the caller's JSON metadata (step, tokenizer fingerprint, ...)
Optimizer moments are not stored here (euler-train owns them).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from euler_model.config import ModelConfig
from euler_model.params import check_params

FORMAT = "euler-model"
FORMAT_VERSION = "1"


def to_host(x: Any) -> np.ndarray:
    """A contiguous NumPy array from a NumPy or CuPy array."""
    return np.ascontiguousarray(x.get() if hasattr(x, "get") else np.asarray(x))


def tensors_checksum(tensors: dict[str, np.ndarray], config_json: str = "") -> str:
    """sha256 hex digest over the config JSON, then (name, dtype, shape, bytes) of every tensor by name."""
    digest = hashlib.sha256(config_json.encode())
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        digest.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


def save_checkpoint(
    path: str | Path, config: ModelConfig, params: dict[str, Any], metadata: dict[str, Any] | None = None
) -> Path:
    """Write params (NumPy or CuPy) to a .safetensors file at path; returns the path.

    >>> import tempfile, os
    >>> from euler_model import preset, init_params
    >>> cfg = preset("tiny"); f = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    >>> _ = save_checkpoint(f, cfg, init_params(cfg), {"step": 3})
    >>> load_checkpoint(f)[2]
    {'step': 3}
    """
    check_params(config, params, "save_checkpoint")
    tensors = {name: to_host(value) for name, value in params.items()}
    config_json = json.dumps(config.to_dict())
    header = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "config": config_json,
        "checksum": tensors_checksum(tensors, config_json),
        "metadata": json.dumps(metadata or {}),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=header)
    tmp.replace(path)  # atomic: a crash never leaves a half-written checkpoint under the real name
    return path


def _read(path: Path) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """The header metadata and the tensors of a safetensors file, with a clear error if unreadable."""
    if not path.is_file():
        raise FileNotFoundError(f"load_checkpoint: no checkpoint file at {path}")
    try:
        with safe_open(str(path), framework="numpy") as f:
            header = dict(f.metadata() or {})
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as err:  # safetensors raises its own error types for corrupt or truncated files
        raise ValueError(
            f"load_checkpoint: {path} is not a readable safetensors file (corrupt or truncated?): {err}"
        ) from err
    return header, tensors


def _check_header(path: Path, header: dict[str, str]) -> tuple[ModelConfig, dict[str, Any]]:
    """The config and user metadata from a checkpoint header, after checking format and version."""
    if header.get("format") != FORMAT:
        raise ValueError(
            f"load_checkpoint: {path} is not an {FORMAT} checkpoint (format={header.get('format')!r})"
        )
    if header.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"load_checkpoint: {path} has format version {header.get('format_version')!r}; "
            f"this euler-model reads version {FORMAT_VERSION!r}"
        )
    try:
        config = ModelConfig.from_dict(json.loads(header["config"]))
        metadata = json.loads(header.get("metadata", "{}"))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"load_checkpoint: {path} has an invalid config or metadata: {err}") from err
    return config, metadata


def load_checkpoint(path: str | Path, xp: Any = np) -> tuple[ModelConfig, dict[str, Any], dict[str, Any]]:
    """Read a checkpoint written by save_checkpoint: (config, params as xp arrays, metadata).

    Checks the format and version, the config, that every tensor is present with the right shape,
    and the checksum; any mismatch is a ValueError that says what is wrong.
    """
    path = Path(path)
    header, tensors = _read(path)
    config, metadata = _check_header(path, header)
    check_params(config, tensors, f"load_checkpoint({path})")
    if tensors_checksum(tensors, header["config"]) != header.get("checksum"):
        raise ValueError(
            f"load_checkpoint: {path} fails its checksum: tensors or config modified or corrupted"
        )
    return config, {name: xp.asarray(tensors[name]) for name in tensors}, metadata
