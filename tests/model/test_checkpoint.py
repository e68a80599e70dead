"""Checkpoints: round trip, and clear errors for corrupt, truncated, mismatched or foreign files."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

from euler_model import FORMAT_VERSION, init_params, load_checkpoint, preset, save_checkpoint


@pytest.fixture
def saved(tmp_path):
    cfg = preset("tiny", vocab_size=80)
    params = init_params(cfg, seed=3)
    path = save_checkpoint(tmp_path / "ckpt" / "model.safetensors", cfg, params, {"step": 12, "note": "hi"})
    return cfg, params, path


def header_of(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), n


def test_round_trip(saved) -> None:
    cfg, params, path = saved
    cfg2, params2, meta = load_checkpoint(path)
    assert cfg2 == cfg and meta == {"step": 12, "note": "hi"}
    assert sorted(params2) == sorted(params)
    for k in params:
        np.testing.assert_array_equal(params2[k], params[k])
    header, _ = header_of(path)
    assert header["__metadata__"]["format_version"] == FORMAT_VERSION
    assert not list(path.parent.glob("*.tmp"))  # written atomically


def test_flipped_byte_fails_the_checksum(saved) -> None:
    _, _, path = saved
    raw = bytearray(path.read_bytes())
    raw[-10] ^= 0x40  # a bit of the last tensor's data
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="checksum"):
        load_checkpoint(path)


@pytest.mark.parametrize("keep", [0.5, 0.99, 20])
def test_truncated_file_is_a_clear_error(saved, keep) -> None:
    _, _, path = saved
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep) if keep < 1 else keep])
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_checkpoint(path)


def rewrite(path, tensors=None, **header_changes):
    """Write a checkpoint file again with changed tensors or header metadata (the checksum is kept)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        meta = dict(f.metadata())
        data = {k: f.get_tensor(k) for k in f.keys()}
    meta.update(header_changes)
    save_file(data if tensors is None else tensors(data), str(path), metadata=meta)


def test_missing_tensor_is_named(saved) -> None:
    _, _, path = saved
    rewrite(path, tensors=lambda d: {k: v for k, v in d.items() if k != "layers.1.wv"})
    with pytest.raises(ValueError, match=r"missing \['layers.1.wv'\]"):
        load_checkpoint(path)


def test_wrong_config_is_reported(saved) -> None:
    cfg, _, path = saved
    rewrite(path, config=json.dumps(cfg.to_dict() | {"ffn_dim": 48}))
    with pytest.raises(ValueError, match=r"layers.0.w_gate: \(32, 16\) != \(48, 16\)"):
        load_checkpoint(path)
    rewrite(path, config=json.dumps(cfg.to_dict() | {"dim": 18}))
    with pytest.raises(ValueError, match="not divisible by n_heads"):
        load_checkpoint(path)
    rewrite(path, config=json.dumps(cfg.to_dict() | {"rope_theta": 500.0}))  # same shapes, other model
    with pytest.raises(ValueError, match="fails its checksum"):
        load_checkpoint(path)
    rewrite(path, config="{not json")
    with pytest.raises(ValueError, match="invalid config"):
        load_checkpoint(path)


def test_wrong_format_or_version(saved, tmp_path) -> None:
    _, _, path = saved
    rewrite(path, format_version="999")
    with pytest.raises(ValueError, match="format version '999'"):
        load_checkpoint(path)
    other = tmp_path / "other.safetensors"
    save_file({"w": np.zeros(3, np.float32)}, str(other))
    with pytest.raises(ValueError, match="is not an euler-model checkpoint"):
        load_checkpoint(other)
    with pytest.raises(FileNotFoundError, match="no checkpoint file"):
        load_checkpoint(tmp_path / "absent.safetensors")


def test_save_checks_params(tmp_path) -> None:
    cfg = preset("tiny")
    params = init_params(cfg)
    params["layers.0.wq"] = params["layers.0.wq"][:, :8]
    with pytest.raises(ValueError, match=r"wrong shapes \['layers.0.wq"):
        save_checkpoint(tmp_path / "m.safetensors", cfg, params)
