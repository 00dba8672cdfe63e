"""Rules of the house on imports (docs/architecture.md "Rules of the house", issue 17): the core
imports nothing of the extension outside itself; scheduler <- backends <- service; metering
and sim never import the service's handlers or store tables; no package imports another that
imports it back, and no module cycles inside a package. Every import counts, also one inside
a function: a lazy import is still an arrow.

KNOWN_CYCLES lists a cycle that is allowed for now, with what must move (none today).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import extension

ROOT = Path(extension.__file__).parent


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module under ``root`` by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path) -> set[str]:
    """The dotted names ``name`` imports (``from a import b`` gives ``a`` and ``a.b``)."""
    found = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return found


def graph(root: Path = ROOT, package: str = "extension") -> dict[str, set[str]]:
    """Module -> the modules of the same tree it imports."""
    mods = modules(root, package)
    return {m: {t for t in imports(m, p) if t in mods and t != m} for m, p in mods.items()}


def part(module: str, depth: int) -> str:
    """The package (or module) ``module`` belongs to, ``depth`` names deep."""
    return ".".join(module.split(".")[:depth])


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def part_graph(edges: dict[str, set[str]], depth: int, within: str = "") -> dict[str, set[str]]:
    """The arrows between parts ``depth`` names deep (those under ``within`` only)."""
    out: dict[str, set[str]] = {}
    for a, targets in edges.items():
        if not a.startswith(within) or a.count(".") + 1 < depth:
            continue
        for b in targets:
            if b.startswith(within) and b.count(".") + 1 >= depth:
                pa, pb = part(a, depth), part(b, depth)
                if pa != pb:
                    out.setdefault(pa, set()).add(pb)
                    out.setdefault(pb, set())
    return out


EDGES = graph()


def arrows(source: str, target: str) -> list[str]:
    """Every ``module -> imported`` from under ``source`` to under ``target``."""
    return sorted(
        f"{a} -> {b}"
        for a, targets in EDGES.items()
        if a == source or a.startswith(source + ".")
        for b in targets
        if b == target or b.startswith(target + ".")
    )


# -- the direction of the arrows ----------------------------------------------------------------
def test_the_core_imports_nothing_of_the_extension_outside_itself():
    outside = [
        f"{a} -> {b}"
        for a, targets in EDGES.items()
        if a.startswith("extension.scheduler")
        for b in targets
        if not b.startswith("extension.scheduler")
    ]
    assert not outside


@pytest.mark.parametrize(
    "source, target",
    [
        ("extension.backends", "extension.service"),
        ("extension.scheduler", "extension.backends"),
        ("extension.sim", "extension.service"),
        ("extension.sim", "extension.metering"),
    ],
    ids=["backends-not-service", "scheduler-not-backends", "sim-not-service", "sim-not-metering"],
)
def test_arrows_run_one_way(source, target):
    assert not arrows(source, target)


def test_metering_never_imports_the_service():
    assert not arrows("extension.metering", "extension.service")


# -- no cycles ---------------------------------------------------------------------------------
# none left: metering has its handler base in extension/webapi.py and the store's
# transition_facts(); the CLI and the magics share extension/tables.py
KNOWN_CYCLES: dict[tuple[str, str], str] = {}


def test_no_package_cycles_but_the_known_ones():
    groups = cycles(part_graph(EDGES, 2))
    known = [set(pair) for pair in KNOWN_CYCLES]
    new = [g for g in groups if not any(set(g) <= k for k in known)]
    assert not new, f"packages importing each other: {new}"


# the packages below extension (extension's own parts are the package tests above)
PACKAGES = sorted(
    m
    for m, path in modules(ROOT, "extension").items()
    if path.name == "__init__.py" and m != "extension"
)


@pytest.mark.parametrize("package", PACKAGES, ids=PACKAGES)
def test_no_module_cycles_inside_a_package(package):
    depth = package.count(".") + 2
    inside = part_graph(EDGES, depth, within=package + ".")
    assert not cycles(inside), f"modules of {package} importing each other"


def test_sim_report_and_its_command_line_no_longer_import_each_other():
    assert not arrows("extension.sim.report", "extension.sim.command")


# -- the checker itself --------------------------------------------------------------------------
def test_the_checker_finds_a_lazy_import_cycle_and_a_package_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "a").mkdir(parents=True)
    (pkg / "b").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "b" / "__init__.py").write_text("")
    (pkg / "a" / "one.py").write_text("def f():\n    from .two import g\n")
    (pkg / "a" / "two.py").write_text("from . import one\n")
    (pkg / "b" / "three.py").write_text("from pkg.a.one import f\n")
    (pkg / "a" / "four.py").write_text("import pkg.b.three\n")
    edges = graph(pkg, "pkg")
    assert cycles(part_graph(edges, 3, within="pkg.a.")) == [["pkg.a.one", "pkg.a.two"]]
    assert cycles(part_graph(edges, 2)) == [["pkg.a", "pkg.b"]]
