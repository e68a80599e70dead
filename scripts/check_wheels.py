"""Build a wheel and an sdist of every package, then install each wheel alone in a fresh venv.

    python scripts/check_wheels.py            # prints one line per package

Each wheel is installed with only its declared dependencies (sibling wheels are found in the build
folder, third-party ones on the package index) and imported.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["euler-bpe", "euler-kernels", "euler-model", "euler-data", "euler-train"]


def build_all(dist: Path) -> None:
    for name in PACKAGES:
        cmd = [sys.executable, "-m", "hatch", "build", "-t", "wheel", "-t", "sdist", str(dist)]
        subprocess.run(cmd, cwd=ROOT / "packages" / name, check=True, capture_output=True)


def install_alone(name: str, dist: Path, work: Path) -> str:
    env = work / name
    venv.EnvBuilder(with_pip=True).create(env)
    python = str(env / "bin" / "python")
    wheel = next(dist.glob(f"{name.replace('-', '_')}-*.whl"))
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--find-links", str(dist)]
    subprocess.run([*pip, str(wheel)], check=True)
    module = name.replace("-", "_")
    probe = f"import {module}; print({module}.__version__)"
    return subprocess.run([python, "-c", probe], check=True, capture_output=True, text=True).stdout.strip()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dist = Path(tmp) / "dist"
        build_all(dist)
        print(f"built: {', '.join(sorted(p.name for p in dist.iterdir()))}")
        for name in PACKAGES:
            version = install_alone(name, dist, Path(tmp))
            print(f"{name}: wheel installs alone, import gives version {version}")


if __name__ == "__main__":
    main()
