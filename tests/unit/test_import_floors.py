"""
The package's imports, read from its source (ast): no circle, and no import from a floor to a higher one.

The floors, lowest first: what every stream shares (``common``), the broker packages and Spark,
what runs beside the streams (placement, scheduling, redrive, the registry of brokers, the
schemes), and the Streams page (``console``), which only reads what the floors below record.
Every import counts, a function's own too: one written inside a function to dodge a circle is
still the circle. An import under ``if TYPE_CHECKING:`` never runs, so it makes no circle; it
still may not reach a higher floor.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "airflow_shared_stream"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE

FLOORS: dict[str, int] = {
    "common": 0,
    "kafka": 1,
    "sqs": 1,
    "pubsub": 1,
    "servicebus": 1,
    "spark": 1,
    "placement": 2,
    "execution_api_warmup": 2,
    "runner_fork": 2,
    "warmup_heartbeat": 2,
    "scheduling": 2,
    "brokers": 2,
    "redrive": 2,
    "redrive_grant": 2,
    "redrive_dag": 2,
    "queues": 2,
    "testing": 2,
    "get_provider_info": 2,
    "__init__": 2,
    "console": 3,
}
"""The first part of a module's name below the package -> its floor."""


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    type_only: bool


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports_in(tree: ast.AST, importer: str, type_only: bool = False) -> Iterator[Import]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.body:
                yield from _imports_in(ast.Module(body=[child], type_ignores=[]), importer, True)
            for child in node.orelse:
                yield from _imports_in(ast.Module(body=[child], type_ignores=[]), importer, type_only)
            continue
        names: list[str] = []
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from package import module`` imports the module; ``from module import name``, the module.
            names = [
                f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES else node.module
                for alias in node.names
            ]
        for name in names:
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                yield Import(importer, name, line, type_only)
        yield from _imports_in(node, importer, type_only)


def _all_imports() -> list[Import]:
    found: list[Import] = []
    for name, path in sorted(MODULES.items()):
        tree = ast.parse(path.read_text(), filename=str(path))
        found.extend(i for i in _imports_in(tree, name) if i.imported != name)
    return found


IMPORTS = _all_imports()


def floor(module: str) -> int:
    parts = module.split(".")
    room = parts[1] if len(parts) > 1 else "__init__"
    if room not in FLOORS:
        raise AssertionError(f"{module} is on no floor: add its room to FLOORS")
    return FLOORS[room]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
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

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_walk_finds_the_imports_it_must() -> None:
    """The walker sees module-level, function-local and type-only imports (or it proves nothing)."""
    seen = {(i.importer, i.imported, i.type_only) for i in IMPORTS}
    assert (f"{PACKAGE}.common.trigger", f"{PACKAGE}.common.figures", False) in seen
    assert (f"{PACKAGE}.console.streams", f"{PACKAGE}.scheduling", False) in seen  # inside a function
    assert any(i.type_only for i in IMPORTS)


def test_every_module_is_on_a_floor() -> None:
    for module in MODULES:
        floor(module)


def test_no_import_reaches_a_higher_floor() -> None:
    upward = [
        f"{i.importer} (floor {floor(i.importer)}) imports {i.imported} (floor {floor(i.imported)}) "
        f"on line {i.line}"
        for i in IMPORTS
        if floor(i.imported) > floor(i.importer)
    ]
    assert upward == []


def test_no_circle_of_imports() -> None:
    edges: dict[str, set[str]] = {}
    for i in IMPORTS:
        if not i.type_only:
            edges.setdefault(i.importer, set()).add(i.imported)
    assert _cycles(edges) == []


@pytest.mark.parametrize(
    ("edges", "circle"),
    [
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": {"c"}}, []),
    ],
)
def test_the_circle_finder_finds_circles(edges: dict[str, set[str]], circle: list[list[str]]) -> None:
    assert _cycles(edges) == circle
