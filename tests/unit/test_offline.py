"""The offline guarantee: the pages load nothing from outside the pgdash server.

Training clusters are often air-gapped, so every template and every file under ``static/``
(except the vendored libraries themselves) must reference only the server's own files: no
``http://``, ``https://``, ``ws://`` or protocol-relative ``//host`` URL in a ``src=``,
``href=``, ``url()``, ``@import``, ``import``, ``fetch()``, ``io()`` or anywhere else. Vendored
libraries carry their version in the file name and ship with a licence of the same version.
No browser needed; ``test_browser.py`` checks the same thing with the network cut off.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "dashboard" / "web" / "templates"
STATIC = ROOT / "static"
VENDOR = STATIC / "vendor"

BINARY = {".png", ".jpg", ".jpeg", ".gif", ".webp", ".ico", ".woff", ".woff2", ".ttf", ".otf"}

# Absolute URLs with a network scheme, anywhere (comments included: a URL in a comment is
# one edit away from being loaded). XML namespace names are identifiers, not resources.
ABSOLUTE = re.compile(r"\b(?:https?|wss?|ftp)://[^\s\"'`)<>]*", re.IGNORECASE)
NOT_A_RESOURCE = re.compile(r"^https?://www\.w3\.org/", re.IGNORECASE)
# Protocol-relative URLs ("//cdn.example.com/x.js") where something is loaded from: an
# attribute, url(), @import, or a string literal handed to import/fetch/io/WebSocket/etc.
PROTOCOL_RELATIVE = re.compile(
    r"""(?:\b(?:src|href|srcset|action|poster|data|formaction)\s*=\s*["']?\s*"""
    r"""|\burl\(\s*["']?\s*|@import\s+(?:url\(\s*)?["']?\s*"""
    r"""|["'`])//[a-z0-9-]+(?:\.[a-z0-9-]+)+""",
    re.IGNORECASE)


def offline_violations(text: str) -> list[str]:
    """Every external reference in ``text`` (one entry per occurrence)."""
    found = [m.group(0) for m in ABSOLUTE.finditer(text) if not NOT_A_RESOURCE.match(m.group(0))]
    found += [m.group(0) for m in PROTOCOL_RELATIVE.finditer(text)]
    return found


def page_files() -> list[Path]:
    files = sorted(TEMPLATES.rglob("*.html"))
    files += sorted(p for p in STATIC.rglob("*") if p.is_file() and VENDOR not in p.parents
                    and p.suffix.lower() not in BINARY)
    return files


def test_the_scan_covers_the_pages():
    names = {p.relative_to(ROOT).as_posix() for p in page_files()}
    assert {"dashboard/web/templates/base.html", "dashboard/web/templates/job.html",
            "dashboard/web/templates/jobs.html", "static/js/common.js", "static/js/job/main.js",
            "static/js/job/live.js", "static/js/job/replay.js", "static/js/job/sections/ranks.js",
            "static/js/jobs.js", "static/js/topology.js", "static/js/charts.js",
            "static/css/pgdash.css"} <= names, names
    assert not any(n.startswith("static/vendor/") for n in names)


@pytest.mark.parametrize("path", page_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_page_files_reference_nothing_outside_the_server(path):
    text = path.read_text(encoding="utf-8", errors="replace")
    bad = []
    for lineno, line in enumerate(text.splitlines(), 1):
        bad += [f"line {lineno}: {ref}" for ref in offline_violations(line)]
    assert not bad, (f"{path.relative_to(ROOT)} references resources outside the pgdash "
                     f"server (vendor them under static/vendor/ instead): {bad}")


@pytest.mark.parametrize("snippet", [
    '<script src="https://cdn.jsdelivr.net/npm/socket.io-client@4/dist/socket.io.min.js">',
    "<link rel=stylesheet href=//fonts.googleapis.com/css?family=Inter>",
    "body { background: url('https://example.com/bg.png'); }",
    '@import url("//fonts.example.com/a.css");',
    '@import "http://example.com/a.css";',
    'import x from "https://esm.sh/x";',
    'fetch("//api.example.com/jobs")',
    'const s = io("wss://dash.example.com/ui");',
    'new WebSocket("ws://10.0.0.1:8686/socket.io/")',
    "el('img', { src: `//cdn.example.com/${name}.png` })",
])
def test_the_scan_catches_external_references(snippet):
    assert offline_violations(snippet), snippet


@pytest.mark.parametrize("snippet", [
    "<link rel=\"stylesheet\" href=\"{{ url_for('static', filename='css/pgdash.css') }}\">",
    '<link rel="icon" href="data:,">',
    'fetch(url(path), { headers: { Accept: "application/json" } })',
    'window.io("/ui", { path: root + "/socket.io" })',
    "// a comment // with slashes",
    'document.createElementNS("http://www.w3.org/2000/svg", "svg")',
    "const re = /^\\/(?!\\/)/;",
])
def test_the_scan_allows_local_references(snippet):
    assert offline_violations(snippet) == [], snippet


def test_templates_load_only_static_files_that_exist():
    """Every ``url_for('static', filename=...)`` in a template names a shipped file."""
    refs = []
    for path in TEMPLATES.rglob("*.html"):
        text = path.read_text(encoding="utf-8")
        refs += re.findall(r"url_for\(\s*['\"]static['\"]\s*,\s*filename\s*=\s*['\"]([^'\"]+)",
                           text)
    assert refs, "no static files referenced by the templates?"
    missing = sorted(r for r in refs if not (STATIC / r).is_file())
    assert not missing, f"templates reference static files that do not exist: {missing}"


VERSIONED = re.compile(r"^(?P<name>.+?)-(?P<version>\d+(?:\.\d+)+(?:[-+][0-9A-Za-z.]+?)?)"
                       r"(?:\.min)?\.(?:m?js|css)$")


def vendor_problems(vendor: Path) -> list[str]:
    """What is wrong with the vendored scripts and styles in ``vendor`` (empty when all is
    well)."""
    scripts = sorted(vendor.glob("*.js")) + sorted(vendor.glob("*.mjs")) + \
        sorted(vendor.glob("*.css"))
    if not scripts:
        return [f"nothing vendored under {vendor}?"]
    problems = []
    for js in scripts:
        m = VERSIONED.match(js.name)
        if not m:
            problems.append(f"{js.name}: no version in the file name (name-1.2.3.min.js)")
            continue
        version = m.group("version")
        licences = [p.name for p in vendor.iterdir()
                    if p.name.upper().startswith(("LICENSE", "LICENCE", "COPYING"))
                    and re.search(rf"(?<![\d.]){re.escape(version)}(?![\d])", p.name)]
        if not licences:
            problems.append(f"{js.name}: no LICENSE file with version {version} in its name "
                            f"next to it (tools/vendor_js.py copies both)")
        # A banner that states a version ("Socket.IO v4.8.4") must agree with the file name.
        head = js.read_text(encoding="utf-8", errors="replace")[:500]
        banner = re.search(r"\bv(\d+\.\d+\.\d+)\b", head)
        if banner and banner.group(1) != version:
            problems.append(f"{js.name}: its banner says v{banner.group(1)}")
    return problems


def test_vendored_scripts_carry_their_version_and_licence():
    problems = vendor_problems(VENDOR)
    assert not problems, "\n".join(problems)


def test_the_vendor_check_catches_missing_or_stale_licences(tmp_path):
    (tmp_path / "socket.io-4.8.5.min.js").write_text("/*! Socket.IO v4.8.5 */")
    (tmp_path / "LICENSE-socket.io-client-4.8.4.txt").write_text("MIT")
    (tmp_path / "chart-4.4.1.min.js").write_text("/*! Chart.js v4.4.0 */")
    (tmp_path / "LICENSE-chart-4.4.1.txt").write_text("MIT")
    (tmp_path / "helper.js").write_text("")
    (tmp_path / "uPlot-1.6.33.min.css").write_text(".uplot{}")
    assert vendor_problems(tmp_path) == [
        "chart-4.4.1.min.js: its banner says v4.4.0",
        "helper.js: no version in the file name (name-1.2.3.min.js)",
        "socket.io-4.8.5.min.js: no LICENSE file with version 4.8.5 in its name next to it "
        "(tools/vendor_js.py copies both)",
        "uPlot-1.6.33.min.css: no LICENSE file with version 1.6.33 in its name next to it "
        "(tools/vendor_js.py copies both)",
    ]
