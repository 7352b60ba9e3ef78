"""Imports run one way: no import circle inside `batch_assets/` or `resources/`, and no import from `resources/` (the
model providers) up into `batch_assets/` (the product). Read from the source with the stdlib `ast`, every import
counted: module level, inside functions, under `if TYPE_CHECKING:` (a circle dodged by a late import is still a
circle a reader has to follow), and through `importlib`: in a module that loads modules by name (`import_module`,
`__import__`), a string naming a project module ("batch_assets.x.y" or "batch_assets.x.y:Name", the form the plug-in
registries hold) is an import by that module. (A name handed to another process, such as a forkserver's preload
list, is not loaded here and is not counted.) And project modules are imported at the top: a function-local import is for a heavy
optional library, or says on its line why it waits."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("batch_assets", "resources")
# The repository's top-level `resources/` folder installs as `batch_assets.resources` (setup.py): one import name,
# `batch_assets`, that cannot collide with a user's own `resources` module.
IMPORT_NAMES = {"resources": "batch_assets.resources"}
# A dotted module path, optionally with ":attribute": what a registry hands `importlib.import_module`.
LOADERS = {"import_module", "__import__"}
MODULE_STRING = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+(:[A-Za-z_][A-Za-z0-9_.]*)?$")


def module_files(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    files = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            parts[0] = IMPORT_NAMES.get(parts[0], parts[0])
            files[".".join(parts)] = path
    return files


def import_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, dict[str, int]]:
    """module -> {imported project module: line of the first such import}."""
    files = module_files(root, packages)
    roots = {IMPORT_NAMES.get(p, p).split(".")[0] for p in packages}

    def known(name: str) -> str | None:  # `from a.b import c`: the module a.b.c if it is one, else a.b
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {}
    for module, path in files.items():
        edges: dict[str, int] = {}
        tree = ast.parse(path.read_text(), str(path))
        loads_by_name = any(isinstance(node, (ast.Name, ast.Attribute)) and LOADERS & {
            getattr(node, "id", None), getattr(node, "attr", None)} for node in ast.walk(tree))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolved against this module's package
                    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{base}".strip(".")
                names = [f"{base}.{alias.name}" for alias in node.names]
            elif (loads_by_name and isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and MODULE_STRING.match(node.value)):
                names = [node.value.partition(":")[0]]  # loaded by importlib: an import all the same
            else:
                continue
            for name in names:
                target = known(name) if name.split(".")[0] in roots else None
                if target and target != module:
                    edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def describe(graph: dict[str, dict[str, int]], component: list[str]) -> str:
    return "; ".join(f"{a} -> {b} (line {graph[a][b]})" for a in component for b in component if b in graph[a])


def test_no_import_circle_in_batch_assets_or_resources() -> None:
    graph = import_graph(ROOT)
    found = circles(graph)
    assert not found, "import circles (break each by moving the shared part down):\n" + "\n".join(
        describe(graph, c) for c in found)


def test_resources_never_import_batch_assets() -> None:
    graph = import_graph(ROOT)
    providers = IMPORT_NAMES["resources"]
    upward = [f"{m} -> {t} (line {line})" for m, edges in graph.items() if f"{m}.".startswith(f"{providers}.")
              for t, line in edges.items() if not f"{t}.".startswith(f"{providers}.")]
    assert not upward, "providers must not reach up into the product:\n" + "\n".join(upward)


def test_the_checker_sees_circles_through_late_type_checking_and_importlib_imports(tmp_path: Path) -> None:
    """The checker itself: a circle closed only by a function-local import, one closed only under TYPE_CHECKING,
    and one closed only by a registry's import string (importlib) are all found; a one-way chain is not, nor a
    module's name in prose."""
    pkg = tmp_path / "batch_assets"
    (pkg / "sub").mkdir(parents=True)
    for name, text in {
        "__init__.py": "", "sub/__init__.py": "",
        "a.py": "from batch_assets.b import x\n",
        "b.py": "def f():\n    from batch_assets import a\n",
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from batch_assets.sub.d import y\n",
        "sub/d.py": "from ..c import z\n",
        "e.py": "import batch_assets.a\n",
        # a registry that loads its plug-ins by name (importlib), one of which imports the registry's user
        "f.py": "import importlib\nPLUGINS = {'x': 'batch_assets.sub.g:Plugin'}\n"
                "def load(n):\n    return importlib.import_module(PLUGINS[n].partition(':')[0])\n",
        "sub/g.py": '"""batch_assets.f is not an import: prose."""\nfrom batch_assets import h\n',
        "h.py": "from batch_assets.f import load\n",
        "i.py": "from batch_assets import j\nPRELOAD = ['batch_assets.i']  # for another process: not loaded here\n",
        "j.py": "PRELOAD = ['batch_assets.i']\n",
    }.items():
        (pkg / name).write_text(text)
    assert circles(import_graph(tmp_path, ("batch_assets",))) == [
        ["batch_assets.a", "batch_assets.b"], ["batch_assets.c", "batch_assets.sub.d"],
        ["batch_assets.f", "batch_assets.h", "batch_assets.sub.g"]]


def late_project_imports(root: Path, packages: tuple[str, ...] = PACKAGES) -> set[tuple[str, str]]:
    """(file, module) for each import of a project module inside a function with no `#` reason on its line."""
    found = set()
    roots = {IMPORT_NAMES.get(p, p).split(".")[0] for p in packages}
    for path in module_files(root, packages).values():
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and inner.level == 0:
                    names = [inner.module or ""]
                elif isinstance(inner, ast.Import):
                    names = [alias.name for alias in inner.names]
                else:
                    continue
                for name in names:
                    if name.split(".")[0] in roots and "#" not in lines[inner.lineno - 1]:
                        found.add((path.relative_to(root).as_posix(), name))
    return found


def test_project_modules_are_imported_at_the_top() -> None:
    found = sorted(late_project_imports(ROOT))
    assert not found, ("function-local imports of project modules (import them at the top, or say on the line why "
                       "they wait):\n" + "\n".join(f"{f}: {m}" for f, m in found))


# Tests mirror the package: a test of batch_assets/<a>/<b>/<m>.py lives in tests/<a>/<b>/, of resources/<sub>/<m>.py in
# tests/resources/<sub>/; top-level modules and whole-product scenarios at tests/ itself. A reader finds a module's
# tests by its path, and a new test has one obvious home. These folders test what lives outside both packages:
OUTSIDE_PACKAGES = {
    "k8s": "the top-level k8s/ folder: deployment files, the Dagster chart, the cluster stand-in",
    "gpu": "device-only tests, run on a CUDA node (tests/gpu/README.md)",
    "daemon_site": "sitecustomize.py for the processes a test starts, not tests",
}


def package_folders(root: Path, packages: tuple[str, ...] = PACKAGES) -> set[str]:
    """Each folder of the packages that holds a module, as the tests/ folder that mirrors it ('.': tests/ itself,
    for batch_assets/'s top level)."""
    mirrors = set()
    for package in packages:
        for path in (root / package).rglob("*.py"):
            inner = path.parent.relative_to(root / package)
            mirrors.add((Path(package) / inner if package != "batch_assets" else inner).as_posix())
    return mirrors


def misplaced_test_folders(root: Path, packages: tuple[str, ...] = PACKAGES,
                           outside: dict[str, str] = OUTSIDE_PACKAGES) -> list[str]:
    """Folders under tests/ holding Python modules that mirror no package folder and are not listed in `outside`,
    and folders of test modules that are not packages all the way up to tests/ (without `__init__.py` pytest
    imports a test module by its bare name, so two folders' test_x.py collide)."""
    tests, mirrors = root / "tests", package_folders(root, packages)
    found = []
    for folder in sorted({p.parent for p in tests.rglob("*.py") if "__pycache__" not in p.parts
                          and p.name != "__init__.py"}):
        inner = folder.relative_to(tests).as_posix()
        if inner not in mirrors and inner.split("/")[0] not in outside:
            found.append(f"tests/{inner}/ mirrors no folder of {' or '.join(f'{p}/' for p in packages)}: move its "
                         "modules to the folder that mirrors the module they test (tests/README.md)")
        if any(p.name.startswith("test_") for p in folder.glob("*.py")):
            missing = [f for f in [folder, *folder.parents] if f.is_relative_to(tests) and
                       not (f / "__init__.py").exists()]
            found += [f"tests/{f.relative_to(tests).as_posix()}/ has test modules below it but no __init__.py"
                      for f in missing]
    return found


def test_test_folders_mirror_the_package() -> None:
    found = misplaced_test_folders(ROOT)
    assert not found, "\n".join(found)


def test_the_checker_finds_a_flat_folder_and_a_folder_that_is_not_a_package(tmp_path: Path) -> None:
    for name in ("batch_assets/stages/sinks/csv.py", "batch_assets/spec.py", "resources/hf/embedder.py",
                 "tests/__init__.py", "tests/test_spec.py", "tests/stages/__init__.py",
                 "tests/stages/sinks/__init__.py", "tests/stages/sinks/test_csv.py",
                 "tests/resources/__init__.py", "tests/resources/hf/__init__.py", "tests/resources/hf/test_embedder.py",
                 "tests/k8s/__init__.py", "tests/k8s/test_chart.py", "tests/daemon_site/sitecustomize.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert misplaced_test_folders(tmp_path) == []
    (tmp_path / "tests/providers").mkdir()
    (tmp_path / "tests/providers/__init__.py").write_text("")
    (tmp_path / "tests/providers/test_embedder.py").write_text("")  # the old flat folder
    (tmp_path / "tests/providers/fault_proxy.py").write_text("")
    (tmp_path / "tests/stages/sinks/__init__.py").unlink()
    (tmp_path / "tests/resources/hf/helper.py").write_text("")  # a helper beside its users: fine
    found = misplaced_test_folders(tmp_path)
    assert len(found) == 2, found
    assert found[0].startswith("tests/providers/ mirrors no folder of batch_assets/ or resources/"), found
    assert found[1] == "tests/stages/sinks/ has test modules below it but no __init__.py", found
