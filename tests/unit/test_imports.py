"""Rules of the import graph: test modules share code through tests/helpers.py only."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):  # function-level imports count too
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_no_test_module_imports_another_test_module():
    offenders = {str(p.relative_to(TESTS)): sorted(m for m in imported_modules(p)
                                                   if m.startswith("tests.") and m.rsplit(".", 1)[-1].startswith("test_"))
                 for p in TESTS.rglob("test_*.py")}
    assert not {k: v for k, v in offenders.items() if v}
