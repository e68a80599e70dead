"""--optimizer muon in the trainer: Muon state in checkpoints, exact resume after kill -9 on the CPU, and
a clear refusal to resume a run under the other optimizer."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
from safetensors.numpy import load_file

from euler_train.checkpoint import CheckpointManager, read_state
from euler_train.cli import main
from euler_train.metrics import read_metrics

FLAGS = ["--optimizer", "muon", "--steps", "40", "--ckpt-every", "4", "--eval-every", "20", "--no-progress"]
FLAGS += ["--set", "checkpoint.keep_last=20"]


def test_muon_trains_checkpoints_its_state_and_resumes_bit_identically(tmp_path, dataset, capsys) -> None:
    ref, run = tmp_path / "ref", tmp_path / "run"
    assert main(["pretrain", "--data", str(dataset), "--out", str(ref), *FLAGS]) == 0
    rows = read_metrics(ref / "metrics.jsonl")
    assert np.mean([r["loss"] for r in rows[-5:]]) < np.mean([r["loss"] for r in rows[:5]]) - 0.3
    opt = load_file(str(ref / "checkpoints" / "step_40" / "optimizer.safetensors"))
    assert any(k.startswith("muon.layers.") for k in opt) and "m.embed" in opt and "m.layers.0.wq" not in opt
    assert read_state(ref / "checkpoints" / "step_40")["optimizer"] == "muon"
    cmd = [sys.executable, "-m", "euler_train.cli", "pretrain", "--data", str(dataset), "--out", str(run)]
    proc = subprocess.Popen([*cmd, *FLAGS], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (run / "checkpoints" / "step_12").is_dir() and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    assert read_state(CheckpointManager(run / "checkpoints").latest_valid())["step"] < 40
    assert main(["pretrain", "--data", str(dataset), "--out", str(run), "--resume", *FLAGS]) == 0
    for name in ("model.safetensors", "optimizer.safetensors"):
        a, b = (load_file(str(r / "checkpoints" / "step_40" / name)) for r in (ref, run))
        assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a), name
    assert [r["loss"] for r in read_metrics(run / "metrics.jsonl")] == [r["loss"] for r in rows]
    capsys.readouterr()
    adamw = [f if f != "muon" else "adamw" for f in FLAGS]
    assert main(["pretrain", "--data", str(dataset), "--out", str(ref), "--resume", *adamw]) == 2
    assert "train.optimizer='muon'" in capsys.readouterr().err
