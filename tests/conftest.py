"""Shared fixtures: a real pgdash server in a subprocess on a free port (helpers in
tests/helpers/)."""

from __future__ import annotations

import pytest

from tests.helpers.procs import ServerProcess


@pytest.fixture
def server(tmp_path):
    srv = ServerProcess(f"sqlite:///{tmp_path / 'pgdash.db'}",
                        log_path=tmp_path / "server.log").start()
    yield srv
    srv.stop()
