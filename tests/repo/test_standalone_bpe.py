"""`pip install packages/euler-bpe` into a clean venv works, and importing it does not pull in NumPy."""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path

import pytest

BPE = Path(__file__).resolve().parents[2] / "packages" / "euler-bpe"


@pytest.mark.slow
def test_euler_bpe_installs_alone_without_numpy(tmp_path: Path) -> None:
    venv.EnvBuilder(with_pip=True).create(tmp_path / "venv")
    python = tmp_path / "venv" / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(BPE)]
    subprocess.run(pip, check=True, timeout=600)
    probe = "import sys, euler_bpe; print(euler_bpe.__version__); print('numpy' in sys.modules)"
    run = {"check": True, "capture_output": True, "text": True}
    out = subprocess.run([str(python), "-c", probe], **run).stdout.split()
    assert out[1] == "False", "euler_bpe imported numpy"
    listed = subprocess.run([str(python), "-m", "pip", "list"], **run).stdout
    assert "numpy" not in listed.lower(), "installing euler-bpe pulled numpy into the venv"
