"""Each package declares its own version, README and metadata the way the workspace expects."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

PACKAGES = Path(__file__).resolve().parents[2] / "packages"
NAMES = ["euler-bpe", "euler-kernels", "euler-model", "euler-data", "euler-train"]


@pytest.mark.parametrize("name", NAMES)
def test_package_layout_and_version(name: str) -> None:
    root = PACKAGES / name
    meta = tomllib.loads((root / "pyproject.toml").read_text())
    assert meta["build-system"]["build-backend"] == "hatchling.build"
    assert meta["project"]["name"] == name
    assert "version" in meta["project"]["dynamic"]
    about = root / meta["tool"]["hatch"]["version"]["path"]
    assert re.fullmatch(r'__version__ = "\d+\.\d+\.\d+[^"]*"\n', about.read_text())
    assert (root / "README.md").read_text().startswith(f"# {name}")


@pytest.mark.parametrize("name", NAMES)
def test_internal_dependencies_use_compatible_ranges(name: str) -> None:
    deps = tomllib.loads((PACKAGES / name / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        if dep.startswith("euler-"):
            assert re.fullmatch(r"euler-[a-z]+(\[[a-z]+\])?>=\d+\.\d+,<\d+\.\d+", dep), f"{name}: {dep!r}"


def test_the_kernels_wheel_takes_every_cuda_source() -> None:
    """euler-kernels' wheel is its whole package folder, so the .cu and .cuh files of every op folder ship
    beside their launchers (hatch takes every file of `packages` that git does not ignore): nothing
    narrows it to Python files, and git ignores none of the sources."""
    root = PACKAGES / "euler-kernels"
    wheel = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["packages"] == ["src/euler_kernels"]
    assert not {"include", "exclude", "only-include", "artifacts"} & wheel.keys()
    sources = sorted((root / "src" / "euler_kernels").glob("*/*.cu*"))
    assert len(sources) > 20
    ignored = subprocess.run(
        ["git", "check-ignore", *map(str, sources)], capture_output=True, text=True, cwd=root
    ).stdout.split()
    assert not ignored, f"git ignores {ignored}"
