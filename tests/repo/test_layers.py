"""The layering of DESIGN.md holds: no package imports one above it, and euler-bpe stays NumPy-free."""

from __future__ import annotations

import ast
import re
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


# --- euler-kernels: the route ops/X.py -> cuda/X.py -> cuda/X.cu (DESIGN.md, "Layout of an op") ---------
KERNELS_SRC = PACKAGES / "euler-kernels" / "src" / "euler_kernels"
CUDA_DIR = KERNELS_SRC / "cuda"
SHARED_GPU = {"_module", "tables", "multi_tensor", "cast", "gemm"}  # GPU plumbing several ops use
LAUNCHER_OF = {"attention": "flash_attention", "residual_rmsnorm": "rmsnorm"}  # else the op's own name
KERNEL = re.compile(r'extern "C" __global__ void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(')


def cuda_modules_imported(file: Path) -> set[str]:
    """Names of the euler_kernels.cuda submodules a file imports (`from euler_kernels.cuda import x`, or
    `from euler_kernels.cuda.x import ...`)."""
    found = set()
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "euler_kernels.cuda":
            found |= {alias.name for alias in node.names if (CUDA_DIR / f"{alias.name}.py").exists()}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("euler_kernels.cuda."):
            found.add(node.module.split(".")[2])
    return found


def string_constants(file: Path) -> set[str]:
    tree = ast.parse(file.read_text(encoding="utf-8"))
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def launcher_of_cu(cu: Path) -> str:
    """The launcher module beside a .cu file: the longest module name that its name starts with
    (flash_attention_bf16.cu -> flash_attention.py)."""
    names = [p.stem for p in CUDA_DIR.glob("*.py") if cu.stem.startswith(p.stem)]
    assert names, f"{cu.name} has no launcher module beside it (cuda/<name>.py)"
    return max(names, key=len)


def reaches_into_euler_kernels_cuda(node: ast.AST, aliases: set[str]) -> bool:
    """Whether an AST node imports euler_kernels.cuda (any form) or reads `<alias of euler_kernels>.cuda`."""
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        return module.startswith("euler_kernels.cuda") or (
            module == "euler_kernels" and any(a.name == "cuda" for a in node.names)
        )
    if isinstance(node, ast.Import):
        return any(a.name.startswith("euler_kernels.cuda") for a in node.names)
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "cuda"
        and isinstance(node.value, ast.Name)
        and node.value.id in aliases
    )


def test_no_package_imports_euler_kernels_cuda() -> None:
    """euler-model and euler-train use euler-kernels' public API only: no `euler_kernels.cuda` import and
    no `ek.cuda.<name>` reached through the package."""
    offenders = []
    for module in sorted(ALLOWED.keys() - {"euler_kernels"}):
        for file in (PACKAGES / DIST_NAME[module] / "src" / module).rglob("*.py"):
            tree = ast.parse(file.read_text(encoding="utf-8"))
            imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import)]
            aliases = {a.asname or a.name for n in imports for a in n.names if a.name == "euler_kernels"}
            offenders += [
                f"{file.relative_to(PACKAGES)}:{node.lineno}"
                for node in ast.walk(tree)
                if reaches_into_euler_kernels_cuda(node, aliases)
            ]
    assert not offenders, f"euler_kernels.cuda used outside euler-kernels: {offenders}"


def test_euler_kernels_modules_stay_small() -> None:
    sizes = {p.relative_to(KERNELS_SRC): len(p.read_text().splitlines()) for p in KERNELS_SRC.rglob("*.py")}
    largest = max(sizes, key=sizes.get)
    assert sizes[largest] < 300, f"{largest} has {sizes[largest]} lines; split it (largest module < 300)"


OPS = sorted(p.stem for p in (KERNELS_SRC / "ops").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("op", OPS)
def test_each_op_with_a_kernel_has_its_launcher_and_kernel_beside(op: str) -> None:
    """An op that runs a kernel of its own imports exactly one launcher, cuda/X.py, and cuda/X*.cu exists;
    anything else it imports from euler_kernels.cuda is shared plumbing."""
    own = cuda_modules_imported(KERNELS_SRC / "ops" / f"{op}.py") - SHARED_GPU
    if not own and op not in LAUNCHER_OF:
        assert not list(CUDA_DIR.glob(f"{op}*.cu")), f"ops/{op}.py does not launch its cuda/{op}*.cu"
        return
    launcher = LAUNCHER_OF.get(op, op)
    assert own == {launcher}, f"ops/{op}.py should import its launcher cuda/{launcher}.py only, got {own}"
    assert (CUDA_DIR / f"{launcher}.py").exists() and list(CUDA_DIR.glob(f"{launcher}*.cu"))


@pytest.mark.parametrize("cu", sorted(p.name for p in CUDA_DIR.glob("*.cu")))
def test_every_kernel_is_named_literally_by_the_launcher_beside_it(cu: str) -> None:
    """Each __global__ kernel of X*.cu appears as a string in cuda/X.py and in no other launcher, and no
    other launcher loads X*.cu: `grep -r <kernel name>` finds the .cu and its launcher."""
    kernels = set(KERNEL.findall((CUDA_DIR / cu).read_text()))
    assert kernels, f"no kernels found in {cu}"
    launcher = launcher_of_cu(CUDA_DIR / cu)
    strings = {p.stem: string_constants(p) for p in CUDA_DIR.glob("*.py")}
    missing = kernels - strings[launcher]
    assert not missing, f"cuda/{launcher}.py does not name {sorted(missing)} of {cu} literally"
    for other, consts in strings.items():
        if other != launcher:
            assert not (consts & (kernels | {cu})), f"cuda/{other}.py names {cu} or its kernels"
