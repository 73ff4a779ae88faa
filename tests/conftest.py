"""Shared fixtures: a real pgdash server in a subprocess on a free port, and one headless
Chromium per test process (helpers in tests/helpers/)."""

from __future__ import annotations

import pytest

from tests.helpers.browser import CHROMIUM_ARGS, chromium_path, sync_playwright
from tests.helpers.procs import ServerProcess


@pytest.fixture
def server(tmp_path):
    srv = ServerProcess(f"sqlite:///{tmp_path / 'pgdash.db'}",
                        log_path=tmp_path / "server.log").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for the whole session (each test opens its own context or page).
    Every test of the main thread uses this one: Playwright's sync API holds its event loop
    for as long as it is open, so a second ``sync_playwright()`` beside it fails ("using
    Playwright Sync API inside the asyncio loop")."""
    if sync_playwright is None:
        pytest.skip("the playwright package is missing: pip install -c constraints.txt "
                    "-e '.[test]' (never `playwright install`; the system chromium is used)")
    path = chromium_path()
    if path is None:
        pytest.skip("chromium is not installed: apt-get install chromium (tools/test does this "
                    "when run as root), or point PGDASH_CHROMIUM at a Chromium binary")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(autouse=True)
def no_rule_raised():
    """diagnose() keeps a rule that raises from taking the job's other rules (and the ingest
    that called it) down with it; in a test, a rule that raised is a failure."""
    from dashboard.diagnosis.rules import RULE_ERRORS

    before = dict(RULE_ERRORS)
    yield
    assert dict(RULE_ERRORS) == before, f"a diagnosis rule raised: {dict(RULE_ERRORS)}"
