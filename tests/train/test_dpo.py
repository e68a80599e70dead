"""`euler-train dpo`: preference tuning from an SFT (or pretrain) checkpoint on a preference set, through the
command line: the reference scored once and kept in the checkpoints, the reward statistics in the metrics,
exact resume, and bad input as one line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file

from euler_data.cli import main as euler_data
from tests.train.conftest import docstrings


@pytest.fixture(scope="module")
def prefs_data(tmp_path_factory, dataset):
    """The tiny run's dataset with a preference set: short questions, the chosen reply a phrase of the
    docstring, the rejected one a fixed refusal (a pattern a few steps can learn)."""
    root = tmp_path_factory.mktemp("prefs")
    data = shutil.copytree(dataset, root / "docs")
    records = [
        {"prompt": f"What does {name}?", "chosen": " ".join(doc.split()[:3]), "rejected": "No idea at all."}
        for name, doc in docstrings()
    ]
    (root / "pairs.json").write_text(json.dumps(records), encoding="utf-8")
    argv = ["prefs", "--source", str(root / "pairs.json"), "--out", str(data), "--context", "64"]
    assert euler_data([*argv, "--val-fraction", "0.2"]) == 0
    return data


def dpo(cli, data, init, out, *extra):
    return cli("dpo", "--data", str(data), "--init", str(init), "--out", str(out), "--no-progress", *extra)


def test_dpo_learns_the_preference_and_reports_it(cli, tmp_path, prefs_data, tiny_run):
    run = tmp_path / "dpo"
    done = dpo(cli, prefs_data, tiny_run, run, "--steps", "40", "--eval-every", "20", "--lr", "3e-3",
               "--set", "eval.batches=4", "--beta", "0.5")  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "val_reward_accuracy" in r]
    assert [r["step"] for r in evals] == [20, 40]
    last = evals[-1]
    assert last["train_reward_accuracy"] >= 0.9 and last["val_reward_accuracy"] >= 0.75
    assert (
        last["val_dpo_loss"] < np.log(2)
        and last["val_margin"] > 0
        and last["val_loss"] == last["val_dpo_loss"]
    )
    saved = load_file(str(run / "checkpoints" / "step_40" / "reference_logps.safetensors"))
    meta = json.loads((prefs_data / "prefs_meta.json").read_text())
    assert saved["train"].shape == (2 * meta["train"]["pairs"],) and saved["val"].shape == (
        2 * meta["val"]["pairs"],
    )
    state = json.loads((run / "checkpoints" / "step_40" / "trainer_state.json").read_text())
    assert state["mode"] == "dpo"
    report = (run / "report.md").read_text()
    assert "## Preferences" in report and "held-out reward accuracy" in report and "Preference set" in report
    assert "euler-train: done: 40 steps" in done.stdout


def test_dpo_resumes_exactly(cli, tmp_path, prefs_data, tiny_run):
    common = ("--lr", "3e-3", "--eval-every", "4", "--ckpt-every", "4")
    whole = dpo(cli, prefs_data, tiny_run, tmp_path / "whole", "--steps", "8", *common)
    assert whole.returncode == 0, whole.stderr
    half = dpo(cli, prefs_data, tiny_run, tmp_path / "half", "--steps", "4", *common)
    assert half.returncode == 0, half.stderr
    rest = dpo(cli, prefs_data, tiny_run, tmp_path / "half", "--steps", "8", "--resume", *common)
    assert rest.returncode == 0, rest.stderr
    a, b = (
        load_file(str(tmp_path / r / "checkpoints" / "step_8" / "model.safetensors"))
        for r in ("whole", "half")
    )
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_bad_dpo_input_is_one_line(cli, tmp_path, dataset, prefs_data, tiny_run):
    no_pairs = dpo(cli, dataset, tiny_run, tmp_path / "a", "--steps", "2")
    lines = no_pairs.stderr.strip().splitlines()
    assert no_pairs.returncode == 2 and len(lines) == 1 and "prefs_meta.json" in lines[0], no_pairs.stderr
    assert "euler-data prefs" in lines[0]
    no_init = cli("dpo", "--data", str(prefs_data), "--out", str(tmp_path / "b"), "--no-progress")
    assert no_init.returncode == 2 and "dpo needs --init" in no_init.stderr
    beta = dpo(cli, prefs_data, tiny_run, tmp_path / "c", "--beta", "0")
    assert beta.returncode == 2 and "train.dpo_beta must be > 0" in beta.stderr
