"""Rules of the house for product code (issue 17): no function over 60 lines except one that
only returns a data literal (the OpenAPI documents), no file past about 600 lines (a file is as
long as its one responsibility needs; past that, it gets a look). Alembic
migrations are schema literals and are left out."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("extension", "spawner", "hub_config", "widgets")
MAX_FUNCTION = 60
MAX_FILE = 600  # a file is as long as its one responsibility needs; past this, a look


def product_files() -> list[Path]:
    return sorted(
        p
        for part in PRODUCT
        for p in (REPO / part).rglob("*.py")
        if "migrations" not in p.parts and "__pycache__" not in p.parts
    )


def returns_a_literal(node: ast.AST) -> bool:
    body = [n for n in node.body if not isinstance(n, ast.Expr)]  # docstrings aside
    return (
        len(body) == 1
        and isinstance(body[0], ast.Return)
        and isinstance(body[0].value, (ast.Dict, ast.List, ast.Tuple))
    )


def long_functions(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION and not returns_a_literal(node):
                found.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_product_function_is_over_60_lines():
    found = [
        f"{p.parent.relative_to(REPO)}/{f}" for p in product_files() for f in long_functions(p)
    ]
    assert not found, "cut these into named steps:\n" + "\n".join(found)


@pytest.mark.parametrize("path", product_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_product_file_is_past_600_lines(path: Path):
    lines = path.read_text().count("\n")
    assert lines <= MAX_FILE, (
        f"{path.relative_to(REPO)} has {lines} lines: split it by what it does"
    )


def test_the_checks_find_what_they_look_for(tmp_path: Path):
    long = tmp_path / "long.py"
    long.write_text(
        "def f():\n"
        + "    x = 1\n" * 70
        + "\n\ndef g():\n    return {\n"
        + "    1: 2,\n" * 70
        + "}\n"
    )
    assert [f.split()[-3] for f in long_functions(long)] == ["f"]
