"""One writer per run folder, and a resume that never rewrites the run's history: the real CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from euler_train.config import recorded_config
from euler_train.metrics import read_metrics

QUICK = ["--no-progress", "--set", "model.context=32", "--eval-every", "0"]


def start(*argv: str) -> subprocess.Popen:
    """`euler-train ARGV` in the background, stderr piped (text)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "euler_train.cli", *argv]
    return subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)


def wait_for_step(run: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Until the background run has logged a metrics row (it holds the folder and is training)."""
    end = time.monotonic() + timeout
    while not read_metrics(run / "metrics.jsonl"):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < end, "the first run logged no step"
        time.sleep(0.1)


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_second_writer_is_refused_naming_the_first_and_a_killed_writer_leaves_no_lock(
    tmp_path, dataset, cli
) -> None:
    run = tmp_path / "run"
    first = start("pretrain", "--data", str(dataset), "--out", str(run), "--steps", "100000", *QUICK)
    try:
        wait_for_step(run, first)
        for extra in (["--overwrite"], ["--resume"]):
            proc = cli("pretrain", "--data", str(dataset), "--out", str(run), "--steps", "5", *QUICK, *extra)
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 2 and len(lines) == 1, proc.stderr
            assert f"is being written by process {first.pid} (euler-train pretrain)" in lines[0]
        sft = cli("sft", "--data", str(dataset), "--init", str(run), "--out", str(run), *QUICK)
        assert sft.returncode == 2 and str(first.pid) in sft.stderr
        assert first.poll() is None  # the first run goes on, untouched
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
        first.stderr.close()
    # the kernel dropped the killed process's lock: the run resumes (from scratch: no checkpoint yet)
    rows = len(read_metrics(run / "metrics.jsonl"))
    proc = cli("pretrain", "--data", str(dataset), "--out", str(run), "--steps", "3", *QUICK, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert rows >= 1 and [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3]


def test_readers_need_no_lock(tmp_path, dataset, tiny_run, cli) -> None:
    """generate and report read a run while another process holds its folder."""
    from euler_data import hold_folder

    with hold_folder(tiny_run, "a test"):
        proc = cli("generate", "--checkpoint", str(tiny_run), "--prompt", "The", "--max-new-tokens", "3")
        assert proc.returncode == 0, proc.stderr


def test_a_refused_or_bad_command_leaves_no_folder(tmp_path, dataset, cli) -> None:
    out = tmp_path / "a" / "b" / "run"
    proc = cli("pretrain", "--data", str(tmp_path / "missing"), "--out", str(out), *QUICK)
    assert proc.returncode == 2 and not (tmp_path / "a").exists()
    afile = tmp_path / "file.txt"
    afile.write_text("mine")
    for out in (afile, afile / "run"):
        proc = cli("pretrain", "--data", str(dataset), "--out", str(out), "--steps", "2", *QUICK)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert f"cannot write {out}" in lines[0]
    assert afile.read_text() == "mine"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_one_line(tmp_path, dataset, cli) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        proc = cli("pretrain", "--data", str(dataset), "--out", str(parent / "run"), "--steps", "2", *QUICK)
    finally:
        parent.chmod(0o755)
    assert proc.returncode == 2 and "not writable" in proc.stderr and "Traceback" not in proc.stderr


def test_a_resume_records_its_changes_at_their_step(tmp_path, dataset, cli) -> None:
    run = tmp_path / "run"
    common = ["pretrain", "--data", str(dataset), "--out", str(run), *QUICK]
    assert cli(*common, "--steps", "4", "--ckpt-every", "2").returncode == 0
    proc = cli(*common, "--steps", "6", "--lr", "0.01", "--resume")
    assert proc.returncode == 0, proc.stderr
    assert (
        "--resume changes the run's config at step 4: train.steps 4 -> 6, train.lr 0.003 -> 0.01"
        in proc.stderr
    )
    cfg, history = recorded_config(run / "config.toml")
    assert cfg["train"]["steps"] == 6 and cfg["train"]["lr"] == 0.01  # what the run runs with now
    assert history == [
        {"step": 4, "key": "train.steps", "was": 4, "now": 6},
        {"step": 4, "key": "train.lr", "was": 0.003, "now": 0.01},
    ]
    # a plain resume changes nothing and keeps the history; the report shows it
    assert cli(*common, "--steps", "7", "--resume").returncode == 0
    cfg, history = recorded_config(run / "config.toml")
    assert [c["step"] for c in history] == [4, 4, 6] and history[-1]["now"] == 7
    report = (run / "report.md").read_text()
    assert "Changed on --resume" in report and "| 4 | train.lr | 0.003 | 0.01 |" in report
    # the run's config.toml, history and all, starts another run as its --config
    again = ["pretrain", "--data", str(dataset), "--out", str(tmp_path / "again"), "--no-progress"]
    proc = cli(*again, "--config", str(run / "config.toml"))
    assert proc.returncode == 0, proc.stderr
    assert recorded_config(tmp_path / "again" / "config.toml") == (cfg, [])


def test_a_resume_that_would_be_another_model_is_refused_and_changes_nothing(tmp_path, dataset, cli) -> None:
    run = tmp_path / "run"
    common = ["pretrain", "--data", str(dataset), "--out", str(run), *QUICK]
    assert cli(*common, "--steps", "2").returncode == 0
    before = tree(run)
    for extra, words in (
        (["--preset", "small"], "was run with model.preset='tiny' and keeps it (asked for 'small')"),
        (["--set", "model.n_layers=3"], "was run with model.n_layers=2 and keeps it (asked for 3)"),
        (["--set", "model.context=48"], "was run with model.context=32 and keeps it (asked for 48)"),
    ):
        proc = cli(*common, "--steps", "4", "--resume", *extra)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], proc.stderr
        assert tree(run) == before
