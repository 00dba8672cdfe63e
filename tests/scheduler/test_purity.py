"""Rule of the house: extension/scheduler imports nothing outside the standard library."""

import ast
import sys
from pathlib import Path

import extension.scheduler

PACKAGE = Path(extension.scheduler.__file__).parent


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_scheduler_core_uses_the_standard_library_only():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) >= 8
    outside = {
        f"{path.name}: {name}"
        for path in files
        for name in imported_modules(path)
        if name not in sys.stdlib_module_names and name != "__future__"
    }
    assert not outside, f"non-stdlib imports in the core: {sorted(outside)}"


def test_the_check_would_catch_a_third_party_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import yaml\nfrom .cycle import schedule\n")
    assert imported_modules(bad) == {"yaml"}
