"""The layering of DESIGN.md holds: no package imports one above it, euler-bpe stays NumPy-free, the
imports inside a package read top-down (no circle) and sit at the top of each module."""

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


def test_euler_data_loads_no_duckdb() -> None:
    """Reading a dataset folder (the loaders, read_meta) needs no DuckDB: euler-train starts without it."""
    code = "import sys, euler_data; assert 'duckdb' not in sys.modules, 'import euler_data pulled in duckdb'"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- import structure inside a package: no circle, imports at the top of the module ---------------------
# Imports that may sit inside a function. An optional dependency (a package extra), anywhere:
OPTIONAL = {
    "cupy": "the [gpu] extra; CPU machines have no CuPy",
    "cupy.cuda": "the [gpu] extra (CuPy's NCCL bindings)",
    "cuda.pathfinder": "comes with CuPy's CUDA wheels ([gpu] extra); finds cuBLASLt",
    "tensorboardX": "the [tensorboard] extra of euler-train",
}
# A declared dependency kept out of start-up, in exactly this module:
LAZY_FOR_STARTUP = {
    ("euler-data/src/euler_data/__init__.py", "euler_data.pipeline"): "prepare: DuckDB stays out of "
    "`import euler_data`, which the loaders and read_meta (and so euler-train's start-up) need",
    ("euler-train/src/euler_train/plot.py", "matplotlib"): "over a second to import; only drawing needs it",
    ("euler-train/src/euler_train/commands.py", "euler_train.serve"): "the HTTP stack (Starlette, uvicorn) "
    "only for `serve`",
    ("euler-train/src/euler_train/plot.py", "matplotlib.pyplot"): "the same, after matplotlib.use('Agg')",
}


def own_modules(module: str) -> dict[str, Path]:
    """Dotted name -> file of every module of a package (a package's __init__.py is the package)."""
    src = PACKAGES / DIST_NAME[module] / "src"
    out = {}
    for file in (src / module).rglob("*.py"):
        parts = file.relative_to(src).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return out


def imported_names(node: ast.Import | ast.ImportFrom, here: str, is_package: bool) -> list[str]:
    """The dotted modules an import statement names: `from a import b` is a.b when that is a module
    (checked by the caller), else a; relative imports are resolved against `here`."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = here.split(".")[: None if is_package else -1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def import_graph(module: str) -> dict[str, set[str]]:
    """Module -> the package's own modules it imports (top-level, function-level, TYPE_CHECKING alike)."""
    modules = own_modules(module)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, file in modules.items():
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            targets = imported_names(node, name, file.name == "__init__.py")
            if isinstance(node, ast.ImportFrom):  # `from a import b`: the module a.b, or else a itself
                base, members = targets[0], targets[1:]
                targets = [m for m in members if m in modules] or [base]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan), each one a set of modules that all
    reach each other through imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while not part or part[-1] != v:
                part.append(stack.pop())
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def one_cycle(graph: dict[str, set[str]], part: list[str]) -> list[str]:
    """A path a -> b -> ... -> a inside one strongly connected part, to show in a failure."""
    path, members = [part[0]], set(part)
    while True:
        step = min(w for w in graph[path[-1]] if w in members)
        if step in path:
            return [*path[path.index(step) :], step]
        path.append(step)


def test_circles_finds_a_cycle_and_only_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert one_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    assert circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_no_import_circle_inside_a_package(module: str) -> None:
    """The imports among a package's own modules read top-down: no module is imported back, directly or
    through others, by a module it imports."""
    graph = import_graph(module)
    bad = [
        f"{' -> '.join(one_cycle(graph, part))} (all of {part} reach each other)" for part in circles(graph)
    ]
    assert not bad, f"import circles in {module}: {bad}"


def function_level_imports(file: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import statement inside a function or method of a file."""
    found = []
    for fn in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    found += [(node.lineno, alias.name) for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    found.append((node.lineno, "." * node.level + (node.module or "")))
    return sorted(set(found))  # a nested function's imports are walked from each enclosing function


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_imports_sit_at_the_top_of_the_module(module: str) -> None:
    """No import inside a function, except an optional dependency or a listed start-up exception."""
    offenders = []
    for file in sorted((PACKAGES / DIST_NAME[module] / "src" / module).rglob("*.py")):
        rel = str(file.relative_to(PACKAGES))
        offenders += [
            f"{rel}:{line}: {name}"
            for line, name in function_level_imports(file)
            if name not in OPTIONAL and (rel, name) not in LAZY_FOR_STARTUP
        ]
    assert not offenders, f"imports inside functions (move them to the top of the module): {offenders}"


def test_the_allowed_lazy_imports_still_exist() -> None:
    """Every start-up exception names an import that is still there (a stale entry would allow a new one)."""
    for rel, name in LAZY_FOR_STARTUP:
        assert name in {n for _, n in function_level_imports(PACKAGES / rel)}, f"stale entry {rel}: {name}"


# --- euler-kernels: a folder per op with its op module, launcher and .cu (DESIGN.md, "Layout of an op") ---
KERNELS_SRC = PACKAGES / "euler-kernels" / "src" / "euler_kernels"
CUDA_DIR = KERNELS_SRC / "cuda"  # shared: the loader, tables, cast and headers
OP_DIRS = sorted(d for d in KERNELS_SRC.iterdir() if (d / "__init__.py").exists() and d != CUDA_DIR)
CU_FILES = sorted(KERNELS_SRC.glob("*/*.cu"))
# launchers of other folders that an op may use: the shared products and FP8 copies of matmul/
SHARED_GPU = {"matmul.gemm", "matmul.gemm_fp8", "matmul.fp8", "matmul.fp8_scales"}
KERNEL = re.compile(r'extern "C" __global__ void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(')
INCLUDE = re.compile(r'^#include "([^"]+)"', re.M)


def string_constants(file: Path) -> set[str]:
    tree = ast.parse(file.read_text(encoding="utf-8"))
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def is_launcher(file: Path) -> bool:
    """A launcher names a .cu file (it loads its kernels) or reaches for cuBLAS (blas.py's library)."""
    return any(s.endswith(".cu") for s in string_constants(file)) or file.stem in {"gemm", "gemm_fp8", "blas"}


def launchers_imported(file: Path) -> set[str]:
    """ "<folder>.<module>" of every launcher of an op folder that a file imports."""
    found = set()
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("euler_kernels."):
            parts = node.module.split(".")[1:]
            modules = [parts] if len(parts) == 2 else [[*parts, a.name] for a in node.names]
            for folder, *rest in modules:
                path = KERNELS_SRC / folder / f"{rest[0]}.py" if rest else None
                if folder != "cuda" and path is not None and path.exists() and is_launcher(path):
                    found.add(f"{folder}.{rest[0]}")
    return found


def test_every_cu_file_the_loader_is_asked_for_exists_once() -> None:
    """Each .cu name is unique across the op folders, and every .cu file a module names is one of them (the
    loader finds a .cu by its name alone: cuda/_module.py's source_path)."""
    names = [cu.name for cu in CU_FILES]
    assert len(names) == len(set(names)), f"two .cu files of one name: {sorted(names)}"
    asked = {s for p in KERNELS_SRC.rglob("*.py") for s in string_constants(p) if s.endswith(".cu")}
    assert asked, "no .cu file named by any module"
    assert not asked - set(names), f"named but not found: {sorted(asked - set(names))}"
    assert not set(names) - asked, f"never loaded: {sorted(set(names) - asked)}"


@pytest.mark.parametrize(
    "source", [p.relative_to(KERNELS_SRC).as_posix() for p in sorted(KERNELS_SRC.glob("*/*.cu*"))]
)
def test_every_include_is_found_in_its_folder_or_the_shared_one(source: str) -> None:
    """`#include "x"` resolves where the loader looks: the file's own folder, then cuda/ (include_dirs)."""
    path = KERNELS_SRC / source
    for header in INCLUDE.findall(path.read_text()):
        assert (path.parent / header).exists() or (CUDA_DIR / header).exists(), (
            f"{source}: {header} not found"
        )


@pytest.mark.parametrize("cu", [p.relative_to(KERNELS_SRC).as_posix() for p in CU_FILES])
def test_every_kernel_is_named_literally_by_a_launcher_beside_it(cu: str) -> None:
    """Each __global__ kernel of a .cu file appears as a string in a launcher of its own folder, and no
    launcher of another folder names the file or its kernels: `grep -r <kernel name>` finds the .cu and its
    launcher."""
    path = KERNELS_SRC / cu
    kernels = set(KERNEL.findall(path.read_text()))
    assert kernels, f"no kernels found in {cu}"
    beside = set().union(*(string_constants(p) for p in path.parent.glob("*.py")))
    assert not kernels - beside, (
        f"no launcher in {path.parent.name}/ names {sorted(kernels - beside)} of {cu}"
    )
    for other in KERNELS_SRC.rglob("*.py"):
        if other.parent != path.parent and is_launcher(other):
            assert not (string_constants(other) & (kernels | {path.name})), (
                f"{other} names {cu} or its kernels"
            )


@pytest.mark.parametrize("folder", [d.name for d in OP_DIRS])
def test_each_op_uses_the_launchers_of_its_own_folder(folder: str) -> None:
    """Following an op's call into the GPU stays in its folder: the launchers a module imports are its own
    folder's, or the shared products and FP8 copies of matmul/ (and anything of the shared cuda/)."""
    for file in sorted((KERNELS_SRC / folder).glob("*.py")):
        foreign = {m for m in launchers_imported(file) if not m.startswith(f"{folder}.")} - SHARED_GPU
        assert not foreign, f"{folder}/{file.name} imports launchers of other folders: {sorted(foreign)}"


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
