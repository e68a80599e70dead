"""A run folder holds one run: a new start needs --resume or --overwrite, and --overwrite removes exactly
the old run's files before the new run writes its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from euler_train.checkpoint import CheckpointManager, read_state
from euler_train.cli import main
from euler_train.metrics import read_metrics


def pretrain(dataset, run, *extra: str) -> int:
    argv = ["pretrain", "--data", str(dataset), "--out", str(run), "--no-progress", "--ckpt-every", "2"]
    return main([*argv, "--set", "model.context=32", *extra])


def test_a_second_start_is_refused_then_overwrite_replaces_the_old_run(tmp_path, dataset, capsys) -> None:
    run = tmp_path / "run"
    assert pretrain(dataset, run, "--steps", "4") == 0
    (run / "notes.txt").write_text("mine")  # not a run file: --overwrite leaves it
    old = (run / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert pretrain(dataset, run, "--steps", "3") == 2
    err = capsys.readouterr().err
    assert "already holds a run (checkpoints of steps 2, 4; metrics.jsonl (4 rows, up to step 4)" in err
    assert (run / "metrics.jsonl").read_text() == old
    assert pretrain(dataset, run, "--steps", "3", "--overwrite", "--seed", "7") == 0
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_2", "step_3"]
    assert (run / "notes.txt").read_text() == "mine" and "seed = 7" in (run / "config.toml").read_text()


def test_no_eval_runs_a_dataset_whose_val_split_is_too_short(tmp_path, dataset, capsys) -> None:
    run = tmp_path / "run"
    val_tokens = (dataset / "val.bin").stat().st_size // 2
    context = ["--set", f"model.context={val_tokens}"]  # a window of context + K > the val split
    assert pretrain(dataset, run, "--steps", "1", *context) == 2
    assert f"the val split holds {val_tokens} tokens" in capsys.readouterr().err
    assert not run.exists()
    assert pretrain(dataset, run, "--steps", "1", "--no-eval", *context, "--batch-size", "1") == 0
    assert not any("val_loss" in r for r in read_metrics(run / "metrics.jsonl"))


@pytest.mark.slow
def test_a_second_signal_ends_the_run_at_once_and_keeps_the_last_checkpoint(tmp_path, dataset) -> None:
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "euler_train.cli", "pretrain", "--data", str(dataset), "--out", str(run)]
    cmd += ["--steps", "100000", "--ckpt-every", "5", "--no-eval", "--no-progress"]
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1")
    )
    deadline = time.monotonic() + 60
    while not (run / "checkpoints" / "step_5").is_dir() and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    while "SIGTERM received" not in proc.stderr.readline():  # the first one is handled: send another
        pass
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM and "Traceback" not in err  # killed, not a clean stop
    newest = CheckpointManager(run / "checkpoints").latest_valid()
    assert newest is not None and read_state(newest)["step"] >= 5
