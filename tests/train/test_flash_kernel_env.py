"""EULER_FLASH_KERNEL (which bf16 FlashAttention kernels a GPU runs) and EULER_GEMM_TUNE (whether bf16
products are timed against cuBLASLt's) are checked before any work: a bad value is one line and exit 2
from euler-train, on any machine, and no run folder appears."""

from __future__ import annotations

import os
import subprocess
import sys


def run(argv: list[str], value: str, name: str = "EULER_FLASH_KERNEL") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{name: value})
    cmd = [sys.executable, "-m", "euler_train.cli", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def test_a_bad_flash_kernel_choice_is_refused_before_work(tmp_path, dataset, tiny_run) -> None:
    out = tmp_path / "run"
    pretrain = ["pretrain", "--data", str(dataset), "--out", str(out), "--steps", "1", "--no-progress"]
    for argv in (
        pretrain,
        ["generate", "--checkpoint", str(tiny_run), "--prompt", "a", "--max-new-tokens", "2"],
    ):
        proc = run(argv, "wgmma")
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2, (argv[0], proc.returncode, proc.stderr[-500:])
        assert len(lines) == 1 and "EULER_FLASH_KERNEL must be one of auto, sm90, mma" in lines[0], lines
        assert "Traceback" not in proc.stderr
    assert not out.exists()
    # the documented values pass the check (the CPU never reaches the GPU kernels)
    good = run(pretrain, "mma")
    assert good.returncode == 0, good.stderr[-500:]


def test_a_bad_gemm_tuning_switch_is_refused_before_work(tmp_path, dataset) -> None:
    out = tmp_path / "run"
    pretrain = ["pretrain", "--data", str(dataset), "--out", str(out), "--steps", "1", "--no-progress"]
    proc = run(pretrain, "off", "EULER_GEMM_TUNE")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-500:])
    assert len(lines) == 1 and "EULER_GEMM_TUNE must be 0" in lines[0], lines
    assert "Traceback" not in proc.stderr
    assert not out.exists()
    good = run(pretrain, "0", "EULER_GEMM_TUNE")
    assert good.returncode == 0, good.stderr[-500:]
