"""Build a wheel and an sdist of every package, then install each wheel alone in a fresh venv.

    python scripts/check_wheels.py            # prints one line per package

Each wheel is installed with only its declared dependencies (sibling wheels are found in the build
folder, third-party ones on the package index) and imported.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["euler-bpe", "euler-kernels", "euler-model", "euler-data", "euler-train"]


class StepFailed(RuntimeError):
    """A child command failed; the message holds the command and the end of its output."""


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """`cmd`, its output captured; StepFailed with the child's own error when it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise StepFailed(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{tail}")
    return proc


def find_hatch(work: Path) -> list[str]:
    """A hatch to build with: this interpreter's, the one on PATH, the quick start's .venv, else a fresh
    one installed into a temporary venv."""
    if subprocess.run([sys.executable, "-m", "hatch", "--version"], capture_output=True).returncode == 0:
        return [sys.executable, "-m", "hatch"]
    for candidate in (shutil.which("hatch"), ROOT / ".venv" / "bin" / "hatch"):
        if candidate and Path(candidate).is_file():
            return [str(candidate)]
    env = work / "hatch-env"
    venv.EnvBuilder(with_pip=True).create(env)
    run([str(env / "bin" / "python"), "-m", "pip", "install", "-q", "hatch>=1.16"])
    return [str(env / "bin" / "hatch")]


def build_all(dist: Path, hatch: list[str]) -> None:
    for name in PACKAGES:
        run([*hatch, "build", "-t", "wheel", "-t", "sdist", str(dist)], cwd=ROOT / "packages" / name)


def install_alone(name: str, dist: Path, work: Path) -> str:
    env = work / name
    venv.EnvBuilder(with_pip=True).create(env)
    python = str(env / "bin" / "python")
    wheel = next(dist.glob(f"{name.replace('-', '_')}-*.whl"))
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--find-links", str(dist)]
    run([*pip, str(wheel)])
    module = name.replace("-", "_")
    return run([python, "-c", f"import {module}; print({module}.__version__)"]).stdout.strip()


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        dist = Path(tmp) / "dist"
        try:
            build_all(dist, find_hatch(Path(tmp)))
            print(f"built: {', '.join(sorted(p.name for p in dist.iterdir()))}")
            for name in PACKAGES:
                version = install_alone(name, dist, Path(tmp))
                print(f"{name}: wheel installs alone, import gives version {version}")
        except StepFailed as err:
            print(f"check_wheels: {err}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
