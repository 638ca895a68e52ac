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
