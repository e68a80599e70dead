"""Checkpoints are independent of the number of processes: a run saved with 2 ranks resumes on 1 (and the
reverse) and computes what the uninterrupted run computes, given the same global batch (batch_size x
processes); a resume whose global batch differs is refused with one line, exit 2, nothing written.

The worlds are CPU processes over the socket stand-in for NCCL (EULER_COMM=socket), started by `--gpus N`.
A stopped run is the uninterrupted run's folder cut back to its step-4 checkpoint (what a stop at step 4
leaves: a signal saves the step it stops at, see test_distributed), so the stop step is exact.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from euler_train.metrics import read_metrics

STEPS, STOP = 12, 4


def train(argv: list[str]) -> subprocess.CompletedProcess:
    """`euler-train ARGV` in a subprocess whose worlds all-reduce over local sockets."""
    env = dict(os.environ, EULER_COMM="socket")
    cmd = [sys.executable, "-m", "euler_train.cli", *argv]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def common(dataset: Path, out: Path) -> list[str]:
    return [
        "pretrain",
        "--data",
        str(dataset),
        "--out",
        str(out),
        "--steps",
        str(STEPS),
        "--ckpt-every",
        str(STOP),
        "--eval-every",
        "0",
        "--no-progress",
        "--set",
        "model.context=32",
    ]


def stopped_copy(ref: Path, run: Path) -> Path:
    """`run`: the reference run as it stood after step STOP (its config and its step-STOP checkpoint)."""
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(ref / "checkpoints" / f"step_{STOP}", run / "checkpoints" / f"step_{STOP}")
    shutil.copyfile(ref / "config.toml", run / "config.toml")
    return run


def assert_same_run(resumed: Path, ref: Path) -> None:
    """The resumed run's losses after STOP and its final weights equal the reference's, up to the float32
    rounding that summing over 1 or 2 ranks changes."""
    got = read_metrics(resumed / "metrics.jsonl")
    want = [r for r in read_metrics(ref / "metrics.jsonl") if r["step"] > STOP]
    assert [r["step"] for r in got] == list(range(STOP + 1, STEPS + 1))
    np.testing.assert_allclose([r["loss"] for r in got], [r["loss"] for r in want], rtol=1e-5)
    a = load_file(str(ref / "checkpoints" / f"step_{STEPS}" / "model.safetensors"))
    b = load_file(str(resumed / "checkpoints" / f"step_{STEPS}" / "model.safetensors"))
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, dataset) -> dict[int, Path]:
    """Uninterrupted runs of one global batch of 4: {1: one process x 4, 2: two processes x 2}."""
    root = tmp_path_factory.mktemp("worlds")
    out = {}
    for world, batch in ((1, 4), (2, 2)):
        out[world] = root / f"ref{world}"
        proc = train([*common(dataset, out[world]), "--gpus", str(world), "--batch-size", str(batch)])
        assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.slow
def test_two_rank_checkpoint_resumes_on_one_process(tmp_path, dataset, runs) -> None:
    run = stopped_copy(runs[2], tmp_path / "run")
    proc = train([*common(dataset, run), "--resume", "--gpus", "1", "--batch-size", "4"])
    assert proc.returncode == 0, proc.stderr
    assert f"resuming at step {STOP}" in proc.stderr and "x 1 processes" in proc.stderr
    assert_same_run(run, runs[2])


@pytest.mark.slow
def test_one_process_checkpoint_resumes_on_two_ranks(tmp_path, dataset, runs) -> None:
    run = stopped_copy(runs[1], tmp_path / "run")
    proc = train([*common(dataset, run), "--resume", "--gpus", "2", "--batch-size", "2"])
    assert proc.returncode == 0, proc.stderr
    assert f"resuming at step {STOP}" in proc.stderr and "x 2 processes" in proc.stderr
    assert_same_run(run, runs[1])


@pytest.mark.slow
def test_a_resume_with_another_global_batch_is_refused_in_one_line(tmp_path, dataset, runs) -> None:
    run = stopped_copy(runs[2], tmp_path / "run")
    before = sorted((p.relative_to(run), p.stat().st_mtime_ns) for p in run.rglob("*"))
    # the saved config's batch_size 2 on one process would read 2 of the checkpoint's 4 rows per step
    proc = train([*common(dataset, run), "--resume", "--gpus", "1"])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "global batch of 4" in lines[0] and "pass --batch-size 4 --grad-accum 1" in lines[0]
    # three processes cannot split 4 rows evenly
    proc = train([*common(dataset, run), "--resume", "--gpus", "3", "--batch-size", "1"])
    assert proc.returncode == 2 and "a number of processes that divides 4" in proc.stderr, proc.stderr
    # another grad_accum draws other rows too
    proc = train([*common(dataset, run), "--resume", "--gpus", "1", "--batch-size", "4", "--grad-accum", "2"])
    assert proc.returncode == 2 and "grad_accum 1, this run has 4 (4 x 1) and 2" in proc.stderr, proc.stderr
    assert sorted((p.relative_to(run), p.stat().st_mtime_ns) for p in run.rglob("*")) == before
