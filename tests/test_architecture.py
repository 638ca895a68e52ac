"""Package boundaries of docs/design.md, checked on the source (every import statement, any depth)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package -> top-level modules it must never import. ``dspark`` (the command line) sits above
# every other package: none of them may import it. ``validate`` (calibrate the simulator on the
# engine, measure its error) sits above ``sim`` and ``real``, beside ``tuning``: it may import
# control, sim, real and tuning; nothing but ``dspark`` may import it.
FORBIDDEN = {
    "control": {
        "torch",
        "simpy",
        "optuna",
        "matplotlib",
        "pandas",
        "time",
        "datetime",
        "sim",
        "real",
        "tuning",
        "reports",
        "dspark",
        "validate",
    },
    "sim": {"torch", "real", "optuna", "tuning", "reports", "dspark", "validate"},
    "real": {"sim", "simpy", "optuna", "tuning", "reports", "dspark", "validate"},
    "tuning": {"torch", "real", "reports", "dspark", "validate"},
    # optuna: reads studies
    "reports": {"sim", "real", "tuning", "torch", "simpy", "dspark", "validate"},
    "validate": {"dspark", "reports"},
}
#: every package of the lab (``dspark`` imports any of the others)
PACKAGES = (*FORBIDDEN, "dspark")


def imported_modules(path: Path) -> set[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add((alias.name.split(".")[0], node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.module.split(".")[0], node.lineno))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_boundaries(package):
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for mod, line in imported_modules(path):
            if mod in FORBIDDEN[package]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    assert not bad, "\n".join(bad)


def test_checker_sees_nested_imports(tmp_path):
    # The checker must catch imports inside functions too, not only at module top.
    f = tmp_path / "m.py"
    f.write_text("def f():\n    import torch.nn as nn\n    from simpy import Environment\n")
    assert {m for m, _ in imported_modules(f)} == {"torch", "simpy"}


def test_control_imports_without_heavy_libraries():
    import subprocess
    import sys

    code = (
        "import sys, control; control.make_controller('fixed');"
        "bad=[m for m in ('torch','simpy','optuna','matplotlib','pandas') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# ------------------------------------------------------------------ file-level import cycles
def module_graph(root: Path, packages) -> dict[str, set[str]]:
    """Module -> the project modules it imports (every import statement, any depth: a
    function-level import is an edge too). A name that is not a module resolves to the
    nearest enclosing module (``from real.engine import Request`` -> ``real.engine``,
    ``from real import tp`` -> ``real.tp``, ``from control import make_controller`` ->
    ``control``); relative imports are resolved against the importing module's package."""
    files = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        names = []
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                names += [f"{base}.{a.name}" for a in node.names]
        graph[mod] = {t for t in map(resolve, names) if t is not None and t != mod}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def test_no_file_import_cycles():
    cycles = [tuple(c) for c in import_cycles(module_graph(ROOT, PACKAGES))]
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_cycle_checker_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from p.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from p import a\n")  # a function-level import
    (pkg / "sub" / "c.py").write_text("from .. import d\nimport p.sub.e\n")
    (pkg / "d.py").write_text("")
    (pkg / "sub" / "e.py").write_text("from .c import x\n")  # relative, back to c
    graph = module_graph(tmp_path, ["p"])
    assert graph["p.a"] == {"p.b"} and graph["p.b"] == {"p.a"}
    assert graph["p.sub.c"] == {"p.d", "p.sub.e"}
    assert import_cycles(graph) == [["p.a", "p.b"], ["p.sub.c", "p.sub.e"]]
    (pkg / "b.py").write_text("def f():\n    pass\n")
    assert import_cycles(module_graph(tmp_path, ["p"])) == [["p.sub.c", "p.sub.e"]]


#: size limits of docs/design.md's house rules, per package file
MAX_FILE_LINES, MAX_CLASS_METHODS, MAX_FUNCTION_LINES = 600, 25, 80


def oversized(path: Path) -> list[str]:
    """What in ``path`` breaks a size limit: the file's lines, a class's methods (defined in its
    body), a function's lines (decorators excluded, nested functions counted on their own)."""
    src = path.read_text()
    out = []
    if src.count("\n") > MAX_FILE_LINES:
        out.append(f"{path}: {src.count(chr(10))} lines")
    for node in ast.walk(ast.parse(src, filename=str(path))):
        if isinstance(node, ast.ClassDef):
            n = sum(isinstance(x, ast.FunctionDef | ast.AsyncFunctionDef) for x in node.body)
            if n > MAX_CLASS_METHODS:
                out.append(f"{path}:{node.lineno} class {node.name}: {n} methods")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                out.append(f"{path}:{node.lineno} {node.name}: {n} lines")
    return out


def test_package_files_classes_and_functions_stay_small():
    found = [x for p in PACKAGES for f in sorted((ROOT / p).rglob("*.py")) for x in oversized(f)]
    assert not found, "\n".join(found)


def test_size_checker_sees_each_limit(tmp_path):
    body = "\n".join(f"    def m{i}(self):\n        pass" for i in range(MAX_CLASS_METHODS + 1))
    long_fn = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    p = tmp_path / "big.py"
    p.write_text(f"class C:\n{body}\n\n\n{long_fn}" + "\n" * MAX_FILE_LINES)
    found = oversized(p)
    assert len(found) == 3
    assert any("class C: 26 methods" in x for x in found)
    assert any("f: 81 lines" in x for x in found)
