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


# --- euler-kernels: the route ops/X.py -> cuda/X.py -> cuda/X.cu (DESIGN.md, "Layout of an op") ---------
KERNELS_SRC = PACKAGES / "euler-kernels" / "src" / "euler_kernels"
CUDA_DIR = KERNELS_SRC / "cuda"
SHARED_GPU = {"_module", "tables", "multi_tensor", "cast", "gemm", "fp8", "gemm_fp8"}  # GPU plumbing
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
