"""The direction of imports in dashboard/: data flows agent → ingest → state → diagnosis → web,
storage beside; the pure core knows nothing of Flask, SQL or Socket.IO; no import cycles.

How imports are counted: every ``import`` and ``from ... import`` statement anywhere in a
module's source counts, at module level or inside a function, a class or an ``if`` (also
``if TYPE_CHECKING:``): an import that runs late still ties the modules together. Relative
imports are resolved against the importing module. ``from a.b import c`` counts as an import
of the module ``a.b.c`` when that is a module of dashboard/, else of ``a.b``; an import of a
module does not count as one of its parent packages (Python runs their ``__init__`` first,
but that would make every package a cycle with its own modules). Only the source is read
(``ast``): nothing is imported, so the test runs in a fraction of a second.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dashboard"

# The rooms below web/: none of them may know who renders what they hold.
BELOW_WEB = ("dashboard.ingest", "dashboard.storage", "dashboard.state", "dashboard.diagnosis",
             "dashboard.history", "dashboard.cluster")
# The pure core: no web framework, no SQL.
PURE = ("dashboard.diagnosis", "dashboard.state")
SERVER_LIBRARIES = ("flask", "flask_socketio", "socketio", "engineio", "sqlalchemy")


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, pathlib.Path]:
    """Every module of dashboard/, by dotted name."""
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def imports(name: str, path: pathlib.Path, known=()) -> list[tuple[str, int]]:
    """What a module imports, as (dotted name, line), from anywhere in its source.

    ``from a.b import c`` gives ``a.b.c`` when that is one of the ``known`` modules, else
    ``a.b`` (c is then a name defined in a.b)."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[:len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append((full if full in known else base, node.lineno))
    return found


def graph() -> dict[str, dict[str, int]]:
    """module -> {dashboard module it imports: the first line that does}."""
    known = modules()
    edges: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        out = edges.setdefault(name, {})
        for target, line in sorted(imports(name, path, known), key=lambda found: found[1]):
            if target in known and target != name:
                out.setdefault(target, line)
    return edges


def offences(rule, message: str) -> list[str]:
    """``module:line imports target`` for every import that ``rule(module, target)`` forbids."""
    said = []
    known = modules()
    for name, path in known.items():
        for target, line in imports(name, path, known):
            if rule(name, target):
                said.append(f"{path.relative_to(ROOT)}:{line} imports {target} ({message})")
    return sorted(set(said))


def test_rooms_below_web_do_not_import_it():
    found = offences(lambda name, target: within(name, BELOW_WEB)
                     and within(target, ("dashboard.web",)),
                     "ingest, storage, state, diagnosis, history and cluster never know who "
                     "renders them: let web/ subscribe or call down instead")
    assert not found, "\n".join(found)


def test_pure_core_imports_no_server_library():
    found = offences(lambda name, target: within(name, PURE)
                     and within(target, SERVER_LIBRARIES),
                     "state.py and diagnosis/ are pure: no Flask, Socket.IO or SQLAlchemy")
    assert not found, "\n".join(found)


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module
    (Tarjan's algorithm, iterative), each as a closed list of modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return [_cycle_in(component, edges) for component in components]


def _cycle_in(component: set[str], edges: dict[str, dict[str, int]]) -> list[str]:
    """A closed path through a strongly connected component (breadth-first back to start)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges[node]):
                if child not in component:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else \
                        [start, node, start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    return sorted(component)


def test_no_import_cycle():
    edges = graph()
    found = cycles(edges)
    said = [" -> ".join(f"{a} (line {edges[a][b]})" for a, b in zip(cycle, cycle[1:]))
            + f" -> {cycle[-1]}" for cycle in found]
    assert not found, "import cycles among dashboard modules:\n" + "\n".join(said)


@pytest.mark.parametrize("edges, expected", [
    ({"a": {"b": 1}, "b": {"a": 2}}, [["a", "b", "a"]]),
    ({"a": {"b": 1}, "b": {"c": 1}, "c": {}}, []),
    ({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}, [["a", "b", "c", "a"]]),
])
def test_cycle_finder(edges, expected):
    assert cycles(edges) == expected


def test_import_reader_counts_function_level_and_relative_imports(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("def f():\n    from . import sibling\n    import flask\n")
    found = imports("dashboard.ingest.mod", source, {"dashboard.ingest.sibling"})
    assert ("dashboard.ingest.sibling", 2) in found and ("flask", 3) in found
