"""No import circle in `server/` or `gate/`, counting lazy and type-only imports.

import-linter's contracts hold the layers between packages; a circle inside a package is a pair
of modules that cannot be read (or changed) one without the other, and a lazy or `TYPE_CHECKING`
import hides it from Python, not from the reader. This walks every import statement with `ast`.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("server", "gate")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(node: ast.AST, modules: set[str]) -> set[str]:
    """The project modules one import statement names (`from gate import payment_required` names `gate.payment_required`)."""
    found: set[str] = set()
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
    else:
        return found
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and "." in name:
            found.add(name)
    return found


def parse(path: Path) -> ast.Module:
    """`ast.parse`, once more on CPython 3.11's spurious "AST constructor recursion depth mismatch"
    (python/cpython#106905: the conversion's depth count is per interpreter, so a parse in another
    thread of the same test worker can unbalance it); a real syntax error raises as ever."""
    source = path.read_text()
    try:
        return ast.parse(source, filename=str(path))
    except SystemError:
        return ast.parse(source, filename=str(path))


def import_graph() -> dict[str, set[str]]:
    paths = [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    modules = {module_name(path) for path in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        name = module_name(path)
        tree = parse(path)
        graph[name] = {target for node in ast.walk(tree) for target in imported(node, modules)} - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_walk_sees_lazy_and_type_only_imports():
    graph = cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}})
    assert graph == [["a", "b"]]
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gate.gate import X\ndef f():\n    from server import app\n"
    names = {t for node in ast.walk(ast.parse(source)) for t in imported(node, {"gate.gate", "server.app"})}
    assert names == {"gate.gate", "server.app"}


def test_no_import_circle_in_server_or_gate():
    assert cycles(import_graph()) == []
