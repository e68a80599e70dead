"""SFT defaults that fit: euler-data sft takes its context from the pretraining data's meta.json and says
what it drops; euler-train sft without --preset takes the init run's preset and records it."""

from __future__ import annotations

import json
import subprocess
import sys

from euler_train.cli import main
from euler_train.config import PRESETS, load_toml


def test_euler_data_sft_defaults_to_the_prepared_context_and_reports_drops(tmp_path, dataset) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        (folder / name).write_bytes((dataset / name).read_bytes())
    meta = json.loads((dataset / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, "context_hint": 40}))
    records = [{"instruction": "Say it.", "input": "", "output": "word " * n} for n in (2, 3, 4, 60, 80)]
    (tmp_path / "qa.json").write_text(json.dumps(records))
    cmd = [sys.executable, "-m", "euler_data.cli", "sft", "--source", str(tmp_path / "qa.json")]
    proc = subprocess.run([*cmd, "--out", str(folder)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    sft = json.loads((folder / "sft_meta.json").read_text())
    assert sft["context_hint"] == 40 and sft["dropped"] == {"too_long": 2} and sft["examples_kept"] == 3
    assert "dropped 2 of 5 examples (40%) longer than the context of 40 tokens" in proc.stderr
    assert f"the longest has {sft['longest_tokens']}" in proc.stderr and sft["longest_tokens"] > 80


def test_sft_without_preset_takes_the_init_runs_preset(tmp_path, dataset) -> None:
    init = tmp_path / "small"
    small = ["--preset", "small", "--steps", "2", "--batch-size", "2", "--no-progress", "--no-eval"]
    assert main(["pretrain", "--data", str(dataset), "--out", str(init), *small]) == 0
    run = tmp_path / "sft"
    base = ["sft", "--data", str(dataset), "--init", str(init), "--out", str(run), "--no-progress"]
    assert main([*base, "--steps", "2", "--batch-size", "2"]) == 0
    saved = load_toml(run / "config.toml")
    assert saved["model"]["preset"] == "small" and saved["model"]["dim"] == 128
    assert saved["train"]["lr"] == PRESETS["small"]["train"]["lr"] / 3
    assert saved["train"]["warmup_steps"] == 10 and saved["eval"]["every"] == 50


def test_sft_says_how_many_examples_the_models_window_cuts(tmp_path, dataset, tiny_run, capsys) -> None:
    argv = ["sft", "--data", str(dataset), "--init", str(tiny_run), "--out", str(tmp_path / "sft")]
    assert main([*argv, "--steps", "1", "--no-progress", "--no-eval"]) == 0
    err = capsys.readouterr().err
    assert (
        "train examples" in err and "longer than the model's window (67 tokens: context 64 + 3 heads)" in err
    )
