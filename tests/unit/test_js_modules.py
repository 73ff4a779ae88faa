"""The page's own JavaScript is one module system: ES modules that import what they use, with
no import cycle and no globals of their own (vendored libraries aside)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers.procs import ROOT

JS = ROOT / "static" / "js"
TEMPLATES = ROOT / "dashboard" / "web" / "templates"
IMPORT = re.compile(r'^\s*import\s[^;]*?from\s+"(\.[^"]+)";', re.M)


def modules() -> dict[Path, list[Path]]:
    """Each of our JS files and the files it imports (resolved)."""
    graph = {}
    for path in sorted(JS.rglob("*.js")):
        text = path.read_text()
        graph[path] = [(path.parent / ref).resolve() for ref in IMPORT.findall(text)]
    return graph


def test_imports_resolve_and_form_no_cycle():
    graph = modules()
    assert len(graph) >= 14
    for path, deps in graph.items():
        missing = [d for d in deps if d not in graph]
        assert not missing, f"{path.relative_to(ROOT)} imports missing {missing}"
    done, path_stack = set(), []

    def visit(node):
        if node in path_stack:
            cycle = path_stack[path_stack.index(node):] + [node]
            raise AssertionError("import cycle: " + " -> ".join(
                p.relative_to(JS).as_posix() for p in cycle))
        if node in done:
            return
        path_stack.append(node)
        for dep in graph[node]:
            visit(dep)
        path_stack.pop()
        done.add(node)

    for node in graph:
        visit(node)


# The one global, on purpose: the job page's read-only face for tests and tools (bench/page.py).
TOOL_HOOKS = {("job/main.js", "pgdashJob")}


def test_no_globals_and_only_module_scripts():
    for path in JS.rglob("*.js"):
        text = path.read_text()
        rel = path.relative_to(ROOT)
        found = {(path.relative_to(JS).as_posix(), name)
                 for name in re.findall(r"^\s*window\.(\w+)\s*=", text, re.M)}
        assert found <= TOOL_HOOKS, f"{rel} sets globals {found - TOOL_HOOKS}"
        assert "(function () {" not in text, f"{rel} is a classic script (an IIFE)"
    for template in TEMPLATES.glob("*.html"):
        for tag in re.findall(r"<script[^>]*>", template.read_text()):
            if "/js/" in tag.replace("filename='js/", "/js/"):
                assert 'type="module"' in tag, f"{template.name}: {tag} is not a module"
