"""Each package declares its own version, README and metadata the way the workspace expects."""

from __future__ import annotations

import re
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
