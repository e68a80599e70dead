"""run.attention_kernel (which bf16 FlashAttention kernels a GPU runs) and run.gemm_tuning (whether bf16
products are timed against cuBLASLt's), through the real CLI in a subprocess: a bad value is a config
error (one line, exit 2, no run folder) on any machine; the documented values are accepted on the CPU,
which never reaches the GPU kernels, and recorded in the run's config. The environment variables that
chose these before are no longer read: one note on stderr, and the run goes on as configured."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from euler_train.config import load_toml

OLD_SWITCHES = ("EULER_MATMUL_PRECISION", "EULER_FLASH_KERNEL", "EULER_GEMM_TUNE", "CUPY_TF32")


def run(argv: list[str], **env: str) -> subprocess.CompletedProcess:
    """`python -m euler_train.cli ARGV` in a subprocess whose environment is this one's without the old
    switches (so that only `env` sets them), plus `env`."""
    base = {k: v for k, v in os.environ.items() if k not in OLD_SWITCHES}
    cmd = [sys.executable, "-m", "euler_train.cli", *argv]
    return subprocess.run(
        cmd, capture_output=True, text=True, env={**base, "PYTHONUNBUFFERED": "1", **env}, timeout=120
    )


def pretrain(dataset, out, *settings: str) -> list[str]:
    """A two-step tiny pretrain on the CPU with these `--set` settings."""
    argv = ["pretrain", "--data", str(dataset), "--out", str(out), "--steps", "2", "--no-progress"]
    argv += ["--device", "cpu", "--set", "model.context=64"]
    for setting in settings:
        argv += ["--set", setting]
    return argv


def run_settings(out) -> dict:
    return load_toml(out / "config.toml")["run"]


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("run.attention_kernel=bogus", ["run.attention_kernel", "auto", "sm90", "mma", "bogus"]),
        ("run.gemm_tuning=maybe", ["run.gemm_tuning", "maybe"]),
    ],
)
def test_a_bad_setting_is_refused_before_work(tmp_path, dataset, setting, named) -> None:
    out = tmp_path / "run"
    proc = run(pretrain(dataset, out, setting))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-500:])
    assert len(lines) == 1 and all(word in lines[0] for word in named), lines
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_the_settings_are_accepted_on_the_cpu(tmp_path, dataset) -> None:
    out = tmp_path / "run"
    proc = run(pretrain(dataset, out, "run.gemm_tuning=false", "run.attention_kernel=mma"))
    assert proc.returncode == 0, proc.stderr[-500:]
    assert "no longer read" not in proc.stderr
    settings = run_settings(out)
    assert settings["attention_kernel"] == "mma" and settings["gemm_tuning"] is False


def test_the_old_environment_variable_is_noted_once_and_ignored(tmp_path, dataset) -> None:
    out = tmp_path / "run"
    proc = run(pretrain(dataset, out), EULER_FLASH_KERNEL="mma")
    assert proc.returncode == 0, proc.stderr[-500:]
    notes = [line for line in proc.stderr.splitlines() if "no longer read" in line]
    assert notes == [
        "euler-train: note: EULER_FLASH_KERNEL is no longer read; "
        "--set run.attention_kernel=auto|sm90|mma chooses it"
    ], proc.stderr
    assert run_settings(out)["attention_kernel"] == "auto"  # the variable chose nothing
