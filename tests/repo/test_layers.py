"""The layering of DESIGN.md holds: no package imports one above it, and euler-bpe stays NumPy-free."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

PACKAGES = Path(__file__).resolve().parents[2] / "packages"

# module -> the euler modules it may import (DESIGN.md, "Layers")
ALLOWED = {
    "euler_bpe": set(),
    "euler_kernels": set(),
    "euler_model": {"euler_kernels"},
    "euler_data": {"euler_bpe"},
    "euler_train": {"euler_bpe", "euler_kernels", "euler_model", "euler_data"},
}
DIST_NAME = {mod: mod.replace("_", "-") for mod in ALLOWED}


def imported_top_modules(src: Path) -> dict[str, set[Path]]:
    """Top-level module names imported anywhere under src (absolute imports only), with where."""
    found: dict[str, set[Path]] = {}
    for file in src.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), filename=str(file))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(file)
    return found


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_no_package_imports_one_above_it(module: str) -> None:
    src = PACKAGES / DIST_NAME[module] / "src" / module
    assert src.is_dir(), f"missing package source {src}"
    imports = imported_top_modules(src)
    ours = {name for name in imports if name in ALLOWED and name != module}
    forbidden = ours - ALLOWED[module]
    where = {name: sorted(str(p.relative_to(PACKAGES)) for p in imports[name]) for name in forbidden}
    assert not forbidden, f"{module} imports {where}, which DESIGN.md does not allow"


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_euler_imports_are_declared_dependencies(module: str) -> None:
    root = PACKAGES / DIST_NAME[module]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    declared = {
        dep.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip() for dep in project["dependencies"]
    }
    imports = imported_top_modules(root / "src" / module)
    used = {DIST_NAME[name] for name in imports if name in ALLOWED and name != module}
    assert used <= declared, (
        f"{module} imports {sorted(used - declared)} without declaring them in pyproject.toml"
    )


def test_euler_bpe_has_no_numpy() -> None:
    src = PACKAGES / "euler-bpe" / "src" / "euler_bpe"
    assert "numpy" not in imported_top_modules(src)
    code = "import sys, euler_bpe; assert 'numpy' not in sys.modules, 'euler_bpe pulled in numpy'"
    subprocess.run([sys.executable, "-c", code], check=True)
