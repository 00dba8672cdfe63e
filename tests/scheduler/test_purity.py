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


def test_the_core_reads_in_small_parts():
    """Issue 17: no function of the core over 60 lines, no module over 500."""
    long_functions, long_files = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > 500:
            long_files.append(path.name)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > 60:
                    long_functions.append(f"{path.relative_to(PACKAGE)}:{node.name}")
    assert not long_functions and not long_files, (long_functions, long_files)
