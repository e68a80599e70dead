"""Run config: presets, TOML files, --set overrides, validation that names the key, TOML round trip."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from euler_train.config import (
    DEFAULTS,
    PRESETS,
    ConfigError,
    dumps,
    parse_override,
    parse_value,
    resolve_config,
    save_config,
)

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


@pytest.mark.parametrize("name", sorted(PRESETS), ids=lambda n: f"preset-{n}")
def test_every_preset_resolves_and_names_its_model_preset(name) -> None:
    cfg = resolve_config(name)
    assert cfg.model["preset"] == name
    sections = cfg.to_dict()
    assert set(sections) == set(DEFAULTS)
    for section, keys in DEFAULTS.items():
        assert set(keys) <= set(sections[section])


def test_presets_differ_where_they_should() -> None:
    tiny, small, gpu = resolve_config("tiny"), resolve_config("small"), resolve_config("gpu")
    assert small.train.steps > tiny.train.steps
    assert gpu.run.device == "gpu" and tiny.run.device == "cpu"


def test_parse_value_reads_toml_literals_and_falls_back_to_strings() -> None:
    assert parse_value("3e-4") == 3e-4
    assert parse_value("12") == 12 and isinstance(parse_value("12"), int)
    assert parse_value("false") is False
    assert parse_value('"x y"') == "x y"
    assert parse_value("runs/a b") == "runs/a b"


def test_override_order_preset_then_file_then_set_then_flags() -> None:
    base = {"train": {"lr": 1e-3, "steps": 7}}
    cfg = resolve_config(
        "tiny", base, ["train.lr=2e-3", "train.seed=5"], {"train.seed": 9, "train.steps": None}
    )
    assert cfg.train.lr == 2e-3  # --set beats the file
    assert cfg.train.steps == 7  # the file beats the preset; a None flag changes nothing
    assert cfg.train.seed == 9  # a plain flag beats --set


def test_int_where_float_expected_is_accepted() -> None:
    cfg = resolve_config("tiny", overrides=["train.lr=1"])
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)


@pytest.mark.parametrize(
    "overrides, flags, key",
    [
        (["train.lrr=1"], {}, "train.lrr"),
        (["trian.lr=1"], {}, "trian"),
        (["train.lr=fast"], {}, "train.lr"),
        (["train.steps=1.5"], {}, "train.steps"),
        (["log.progress=1"], {}, "log.progress"),
        (["train.steps=0"], {}, "train.steps"),
        (["train.lr=-1"], {}, "train.lr"),
        (["train.min_lr=1.0"], {}, "train.min_lr"),
        (["train.beta2=1.0"], {}, "train.beta2"),
        (["train.on_nonfinite=ignore"], {}, "train.on_nonfinite"),
        (["train.fp8_scaling=late"], {}, "train.fp8_scaling"),
        (["train.fp8_scaling=delayed"], {}, "train.fp8_scaling"),  # FP8 scales need run.precision=fp8
        (["train.bf16_grads=true"], {}, "train.bf16_grads needs bf16 or fp8"),  # fp32 products
        ([], {"run.device": "tpu"}, "run.device"),
        ([], {"run.precision": "tf32"}, "run.precision"),  # the CPU is fp32 only
        ([], {"run.gpus": 2}, "run.gpus"),  # several GPUs need the GPU device
        (["train.lr"], {}, "section.key=value"),
        (["lr=1"], {}, "section.key"),
    ],
)
def test_bad_values_raise_config_error_naming_the_key(overrides, flags, key) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_config("tiny", overrides=overrides, flags=flags)
    assert key in str(err.value)


def test_unknown_key_in_a_file_names_the_key_and_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown key eval\.everyy .*known in \[eval\]: every, batches"):
        resolve_config("tiny", {"eval": {"everyy": 3}})


def test_unknown_preset() -> None:
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        resolve_config("huge")


def test_parse_override_splits_on_the_first_equals() -> None:
    assert parse_override("data.dir=a=b") == ("data", "dir", "a=b")


@pytest.mark.parametrize("name", sorted(PRESETS), ids=lambda n: f"preset-{n}")
def test_saved_config_reads_back_identically(tmp_path, name) -> None:
    cfg = resolve_config(name, overrides=['data.dir="/tmp/with \\"quotes\\""', "model.n_layers=3"])
    save_config(cfg, tmp_path / "config.toml")
    back = tomllib.loads((tmp_path / "config.toml").read_text())
    assert back == cfg.to_dict()
    assert resolve_config(name, back) == cfg


@given(
    lr=st.floats(1e-6, 1.0, allow_nan=False),
    steps=st.integers(1, 10**6),
    path=st.text(st.characters(blacklist_categories=["Cs", "Cc"]), max_size=20),
    flag=st.booleans(),
)
def test_dumps_round_trips_any_valid_values(lr, steps, path, flag) -> None:
    cfg = resolve_config(
        "tiny",
        {
            "train": {"lr": lr, "min_lr": 0.0, "steps": steps},
            "data": {"dir": path},
            "log": {"tensorboard": flag},
        },
    )
    assert tomllib.loads(dumps(cfg)) == cfg.to_dict()


@pytest.mark.parametrize(
    "override, key",
    [
        ("train.optimizer=muon", "train.optimizer='adamw'"),
        ("train.zero=1", "train.zero=0"),
        ("run.gpus=2", "run.gpus=1"),
    ],
)
def test_bf16_grads_are_refused_where_nothing_reads_them(override, key) -> None:
    """Muon, ZeRO's shards and the all-reduce read float32 gradients: bf16 ones are refused up front."""
    base = ["run.device=gpu", "run.precision=bf16", "train.bf16_grads=true"]
    assert resolve_config("tiny", overrides=base).train.bf16_grads is True
    with pytest.raises(ConfigError, match=f"needs {key}"):
        resolve_config("tiny", overrides=[*base, override])
