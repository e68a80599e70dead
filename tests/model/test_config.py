"""ModelConfig validation, presets and the parameter count."""

from __future__ import annotations

import json

import numpy as np
import pytest

from euler_model import PRESETS, ModelConfig, count_params, describe_params, init_params, param_shapes, preset


def llama_mtp_count(dim, n_heads, n_kv, layers, ffn, vocab, k) -> int:
    """Independent count: embedding + layers (q, k, v, o, 3 ffn matrices, 2 norms) + final norm + K heads."""
    kv = dim // n_heads * n_kv
    per_layer = dim * dim * 2 + 2 * kv * dim + 3 * dim * ffn + 2 * dim
    return vocab * dim + layers * per_layer + dim + k * vocab * dim


def test_preset_sizes_are_the_documented_ones() -> None:
    assert count_params(preset("small")) == 1_115_264 == llama_mtp_count(128, 4, 2, 4, 384, 512, 4)
    assert count_params(preset("gpu")) == 116_417_280 == llama_mtp_count(768, 12, 4, 16, 2048, 4096, 4)
    t = preset("tiny")
    assert count_params(t) == llama_mtp_count(t.dim, t.n_heads, t.n_kv_heads, t.n_layers, t.ffn_dim, 64, 3)
    assert "1.1M" in describe_params(preset("small")) and "116.4M" in describe_params(preset("gpu"))


def test_count_matches_initialised_arrays() -> None:
    cfg = preset("tiny")
    params = init_params(cfg, seed=0)
    assert sum(a.size for a in params.values()) == count_params(cfg)
    assert {k: a.shape for k, a in params.items()} == param_shapes(cfg)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"dim": 18}, "not divisible by n_heads"),
        ({"n_kv_heads": 3}, "not divisible by n_kv_heads"),
        ({"dim": 12, "n_heads": 4}, "must be even"),
        ({"vocab_size": 0}, "vocab_size must be a positive int"),
        ({"n_layers": -1}, "n_layers must be a positive int"),
        ({"context": 2.5}, "context must be a positive int"),
        ({"n_mtp_heads": 0}, "n_mtp_heads"),
        ({"rope_theta": 0.0}, "rope_theta"),
    ],
)
def test_invalid_configs_raise_clear_errors(overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        preset("tiny", **overrides)


def test_config_is_frozen_and_round_trips_through_json() -> None:
    cfg = preset("small", vocab_size=1000)
    with pytest.raises(AttributeError):
        cfg.dim = 3  # type: ignore[misc]
    again = ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg and again.vocab_size == 1000 and PRESETS["small"].vocab_size == 512
    with pytest.raises(ValueError, match="unknown keys"):
        ModelConfig.from_dict(cfg.to_dict() | {"dimm": 4})
    with pytest.raises(ValueError, match="unknown preset"):
        preset("huge")


def test_init_scheme() -> None:
    cfg = preset("small")
    p = init_params(cfg, seed=1)
    assert all(a.dtype == np.float32 for a in p.values())
    np.testing.assert_array_equal(p["layers.2.ffn_norm"], 1.0)
    assert abs(p["embed"].std() - 0.02) < 1e-3 and abs(p["layers.0.w_gate"].std() - 0.02) < 1e-3
    residual_std = 0.02 / np.sqrt(2 * cfg.n_layers)  # depth-scaled residual projections
    assert abs(p["layers.0.wo"].std() - residual_std) < 1e-3 * residual_std / 0.01
    assert abs(p["layers.3.w_down"].std() - residual_std) < 1e-3
    q = init_params(cfg, seed=1, dtype=np.float64)
    np.testing.assert_allclose(q["heads.3"], p["heads.3"], rtol=1e-6)  # the same draw in either dtype
    assert not np.array_equal(init_params(cfg, seed=2)["heads.0"], p["heads.0"])
