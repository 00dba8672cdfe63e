"""Rules of the house for product code (issues 17 and 28): every module states its one
responsibility in its docstring's first line; no function over 60 lines except one that only
returns a data literal (the OpenAPI documents); no file past about 600 lines (a file is as long
as its one responsibility needs; past that, it gets a look); no object reaches into another
object's ``_private`` members (another instance of the same class may: Python's own convention);
and no mixins: a class is built from collaborators passed in, the one exception being the spawner
mixin JupyterHub forces (one class over LocalProcessSpawner and KubeSpawner). Alembic migrations
are schema literals and are left out."""

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


# Underscore names that are public API of the library that defines them (SQLAlchemy's Row
# mapping, namedtuple's methods, os._exit), or a framework's insides we must reach, each said why.
PUBLIC_UNDERSCORE = {"_exit", "_replace", "_asdict", "_fields", "_make", "_mapping", "_getframe"}
FRAMEWORK_REACHES = {
    # JupyterHub gives no hook for these: restarts.py restarts managed services through the
    # service spawner class; the shutdown hook and the spawner's log name are the hub's own
    "hub_config/restarts.py": {"_ServiceSpawner", "_wmla_json"},
    "hub_config/__init__.py": {"_wmla_servers_first", "_log_name"},
    # plotly's FigureWidget keeps its figure in these; the widget mirrors it for anywidget
    "widgets/plotly_widget.py": {"_widget_data", "_widget_layout", "_data", "_layout_obj",
                                 "_props"},
}  # fmt: skip
# The one mixin JupyterHub forces: WmlaSpawnerMixin over LocalProcessSpawner and KubeSpawner.
FORCED_MIXIN = "WmlaSpawnerMixin"
EXCEPTIONS = ("Error", "Exception", "Refused")


def private_reaches(path: Path) -> list[str]:
    """``other._name`` where ``other`` is not ``self``/``cls`` and ``_name`` is not an
    attribute the enclosing class itself sets (another instance of the same class)."""
    tree = ast.parse(path.read_text())
    allowed = PUBLIC_UNDERSCORE | FRAMEWORK_REACHES.get(str(path.relative_to(REPO)), set())
    found = []

    def visit(node: ast.AST, own: set[str]) -> None:
        if isinstance(node, ast.ClassDef):
            own = own | {
                n.attr for n in ast.walk(node)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                and n.value.id in ("self", "cls") and n.attr.startswith("_")
            } | {
                f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            } | {
                t.id for a in node.body if isinstance(a, (ast.Assign, ast.AnnAssign))
                for t in (a.targets if isinstance(a, ast.Assign) else [a.target])
                if isinstance(t, ast.Name)
            }  # fmt: skip
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and node.attr not in allowed
            and node.attr not in own
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append(f"{path.relative_to(REPO)}:{node.lineno} {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, own)

    visit(tree, set())
    return found


def mixins(paths: list[Path]) -> list[str]:
    """Classes built from more than one of our own classes, or from an underscore one."""
    ours = {
        node.name
        for p in paths
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ClassDef)
    }
    found = []
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases]
            own = [b for b in bases if b.split(".")[-1] in ours and b != "Protocol"]
            if all(b.endswith(EXCEPTIONS) for b in own):
                continue  # an exception under two of ours is a hierarchy of kinds, no mixin
            if len(own) > 1 or any(b.split(".")[-1].startswith("_") for b in own):
                if own == [FORCED_MIXIN]:
                    continue
                found.append(f"{p.relative_to(REPO)}:{node.lineno} {node.name}({', '.join(bases)})")
    return found


def test_every_module_states_its_responsibility_first():
    missing = []
    for path in product_files():
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if not doc.strip() or not doc.strip().splitlines()[0].strip():
            missing.append(str(path.relative_to(REPO)))
    assert not missing, "say in one first line what each of these is for:\n" + "\n".join(missing)


def test_no_object_reaches_into_another_objects_privates():
    found = [reach for path in product_files() for reach in private_reaches(path)]
    assert not found, "give these a public, declared interface:\n" + "\n".join(found)


def test_no_mixins_but_the_one_the_framework_forces():
    found = mixins(product_files())
    assert not found, "compose these from collaborators passed in:\n" + "\n".join(found)


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
    code = REPO / "extension" / "house_rules_probe.py"
    code.write_text(
        "class A:\n    def __init__(self):\n        self._mine = 1\n"
        "    def same(self, other):\n        return other._mine\n"
        "def reach(b):\n    return b._theirs\n"
        "class _Part:\n    pass\n"
        "class Whole(_Part):\n    pass\n"
    )
    try:
        assert [r.split()[-1] for r in private_reaches(code)] == ["b._theirs"]
        assert [m.split()[-1] for m in mixins([code])] == ["Whole(_Part)"]
    finally:
        code.unlink()
