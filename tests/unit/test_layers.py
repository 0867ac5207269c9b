"""The package's structure stays one-way (docs/architecture.md, "Inside `orchestrate`"): no import
cycle between modules of kvoffload, orchestrate's subpackages import only those below them, and no
orchestrate module shares a name with one of kvoffload/doctor.

Every import counts: at the top, inside a function, or under `if TYPE_CHECKING:` (a type-only import
is still an arrow a reader follows)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "kvoffload"
# orchestrate's floors, top first: a module may import its own floor and those after it
FLOORS = ("campaign", "checks", "cell", "installs", "")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, modules: set[str]) -> Iterator[str]:
    """The kvoffload modules `path` imports: `from pkg import name` counts as pkg.name where that is
    a module (a package's __init__ that only runs first is no arrow), else as pkg."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("kvoffload"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvoffload"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                yield sub if sub in modules else node.module


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in files.items():
        edges[name] = {m for m in imported(path, set(files)) if m in files and m != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def floor_of(module: str) -> int | None:
    prefix = "kvoffload.orchestrate."
    if not module.startswith(prefix):
        return None
    head = module[len(prefix) :].split(".")[0]
    return FLOORS.index(head) if head in FLOORS else FLOORS.index("")


def test_no_import_cycle_in_the_package() -> None:
    assert cycles(graph()) == []


def test_cycles_finds_a_loop() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_orchestrate_imports_only_downwards() -> None:
    up = [
        f"{src} -> {dst}"
        for src, targets in graph().items()
        for dst in targets
        if (fs := floor_of(src)) is not None and (fd := floor_of(dst)) is not None and fd < fs
    ]
    assert up == [], "orchestrate subpackages import only those below them (docs/architecture.md)"


@pytest.mark.parametrize("sub", FLOORS[:-1])
def test_every_floor_is_a_package(sub: str) -> None:
    assert (PACKAGE / "orchestrate" / sub / "__init__.py").is_file()


def test_no_orchestrate_module_shares_a_name_with_the_doctor() -> None:
    doctor = {p.stem for p in (PACKAGE / "doctor").glob("*.py")} - {"__init__"}
    orchestrate = {p.stem for p in (PACKAGE / "orchestrate").rglob("*.py")} - {"__init__"}
    assert doctor & orchestrate == set()
