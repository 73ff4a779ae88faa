"""The HTTP API in process, through Flask's test client on the app ``pgdash serve`` runs
(``create_app``): errors are JSON, and every API route and /metrics wants the bearer token.
What needs the real server (the login cookie against the server's log, TLS, websockets,
binding beyond loopback) is in tests/integration/test_access.py and test_server.py."""

import pytest

from dashboard.web.app import create_app
from tests.helpers.web import close_app

TOKEN = "tok-3f9a-very-secret"
PROTECTED = ["/api/jobs", "/api/jobs/1", "/api/jobs/1/findings", "/api/jobs/1/collectives",
             "/api/jobs/1/gpus", "/api/jobs/1/export", "/api/jobs/1/state?at=1",
             "/metrics", "/api/nothing-here"]


def served(tmp_path, **config):
    return create_app({"DB": f"sqlite:///{tmp_path / 'db.sqlite'}", "PUSH_INTERVAL": 60,
                       **config})


@pytest.fixture
def client(tmp_path):
    app = served(tmp_path)
    yield app.test_client()
    close_app(app)


@pytest.fixture
def locked(tmp_path):
    app = served(tmp_path, TOKEN=TOKEN)
    yield app.test_client()
    close_app(app)


def test_api_errors_are_json(client):
    resp = client.get("/api/jobs/12345")
    assert resp.status_code == 404 and resp.is_json
    assert "no job with id 12345" in resp.get_json()["error"]


def test_api_and_metrics_need_the_bearer_token(locked):
    for path in PROTECTED:
        for headers in ({}, {"Authorization": "Bearer wrong"},
                        {"Authorization": f"Basic {TOKEN}"},
                        {"Authorization": f"Bearer {TOKEN}x"}):
            resp = locked.get(path, headers=headers)
            text = resp.get_data(as_text=True)
            assert resp.status_code == 401, (path, headers, resp.status_code)
            assert "Bearer" in resp.get_json()["error"]
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")
            assert TOKEN not in text
    resp = locked.get("/api/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
    assert resp.status_code == 200 and resp.get_json() == {"jobs": []}
    resp = locked.get("/metrics", headers={"Authorization": f"bearer {TOKEN}"})
    assert resp.status_code == 200 and "pgdash_jobs" in resp.get_data(as_text=True)
