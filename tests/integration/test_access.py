"""Access control, the loopback rule and TLS, on a real server process: with --token nobody
without it reads or sends anything; with --tls-cert agents and scripts talk https/wss."""

from __future__ import annotations

import http.client
import os
import re
import ssl
import subprocess
import sys
import urllib.parse

import pytest
import socketio

from pgdash_agent.wire import PROTOCOL_VERSION, UI_NAMESPACE
from tests.helpers.closing import disconnect
from tests.helpers.procs import (ROOT, WAIT_S, ServerProcess, job_by_name, launch_job, wait_for,
                                 wait_job)
from dashboard.web.access import COOKIE, Access
from tests.helpers.tls import make_cert

TOKEN = "tok-3f9a-very-secret"


@pytest.fixture
def locked(tmp_path):
    srv = ServerProcess(f"sqlite:///{tmp_path / 'db.sqlite'}", log_path=tmp_path / "server.log",
                        extra=["--token", TOKEN]).start()
    yield srv
    srv.stop()


def ask(server, method, path, headers=None, body=None, context=None):
    """One raw HTTP request (no redirect following): (status, headers, text)."""
    parsed = urllib.parse.urlparse(server.url)
    if parsed.scheme == "https":
        conn = http.client.HTTPSConnection(parsed.hostname, parsed.port, timeout=10,
                                           context=context or server.ssl_context)
    else:
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        with conn.getresponse() as resp:  # conn.close() leaves it open after a failed read
            return resp.status, resp.headers, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


def login(server, token):
    body = urllib.parse.urlencode({"token": token, "next": "/jobs/1"})
    return ask(server, "POST", "/login", {"Content-Type": "application/x-www-form-urlencoded"},
               body)


def test_pages_redirect_to_login_and_the_cookie_is_not_the_token(locked, tmp_path):
    status, head, _ = ask(locked, "GET", "/jobs/7?at=5")
    assert status == 303 and head["Location"] == "/login?next=/jobs/7%3Fat%3D5"
    assert ask(locked, "GET", "/")[0] == 303
    status, _, text = ask(locked, "GET", "/login?next=/jobs/7")
    assert status == 200 and 'name="token"' in text and 'value="/jobs/7"' in text
    # Static files hold nothing of a job: they stay public (the login page needs its CSS).
    assert ask(locked, "GET", "/static/css/pgdash.css")[0] == 200

    status, _, text = login(locked, "not-it")
    assert status == 401 and "not this server&#39;s token" in text and "not-it" not in text

    status, head, _ = login(locked, TOKEN)
    assert status == 303 and head["Location"] == "/jobs/1"
    cookie = head["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    value = cookie.split(";")[0].split("=", 1)[1]
    assert value and TOKEN not in value and value == Access(TOKEN).cookie_value
    jar = {"Cookie": f"{COOKIE}={value}"}
    assert ask(locked, "GET", "/", jar)[0] == 200
    assert ask(locked, "GET", "/api/jobs", jar)[0] == 200  # the page's own fetches
    assert ask(locked, "GET", "/", {"Cookie": f"{COOKIE}={value[:-1]}0"})[0] == 303

    # An open redirect through ?next= is not possible.
    body = urllib.parse.urlencode({"token": TOKEN, "next": "//evil.example/"})
    _, head, _ = ask(locked, "POST", "/login",
                     {"Content-Type": "application/x-www-form-urlencoded"}, body)
    assert head["Location"] == "/"

    status, head, _ = ask(locked, "GET", "/logout", jar)
    assert status == 303 and f"{COOKIE}=;" in head["Set-Cookie"]
    locked.stop()
    assert TOKEN not in (tmp_path / "server.log").read_text()


def ui_client(server, headers=None):
    client = socketio.Client(reconnection=False)
    reasons = []
    client.on("connect_error", reasons.append, namespace=UI_NAMESPACE)
    try:
        client.connect(server.url, namespaces=[UI_NAMESPACE], transports=["websocket"],
                       headers=headers or {}, wait_timeout=WAIT_S)
    except socketio.exceptions.ConnectionError:
        disconnect(client)
        raise AssertionError(f"refused: {reasons}") from None
    return client


def test_ui_namespace_needs_the_cookie_or_header(locked):
    with pytest.raises(AssertionError, match="log in at /login"):
        ui_client(locked)
    with pytest.raises(AssertionError, match="log in at /login"):
        ui_client(locked, {"Cookie": f"{COOKIE}=forged"})
    for headers in ({"Cookie": f"{COOKIE}={Access(TOKEN).cookie_value}"},
                    {"Authorization": f"Bearer {TOKEN}"}):
        client = ui_client(locked, headers)
        try:
            ack = client.call("watch", {"jobs": True}, namespace=UI_NAMESPACE, timeout=10)
            assert ack == {"ok": True}
        finally:
            disconnect(client)


def test_agents_with_the_token_are_stored_and_others_refused(locked, tmp_path):
    procs = launch_job("train_job.py", 2, locked.url, "tokened", tmp_path,
                       env={"PGDASH_TOKEN": TOKEN}, args=["--steps", "5"])
    assert wait_job(procs, 120, tmp_path) == [0, 0]
    job = wait_for(lambda: job_by_name(locked, "tokened"), 20, "the job")
    assert job["world_size"] == 2
    procs = launch_job("train_job.py", 2, locked.url, "intruder", tmp_path,
                       env={"PGDASH_TOKEN": "guess"}, args=["--steps", "3"])
    assert wait_job(procs, 120, tmp_path) == [0, 0]  # training is not hurt by a refusal
    assert job_by_name(locked, "intruder") is None
    text = (tmp_path / "intruder-rank0.log").read_text()
    assert "wrong or missing token" in text and "guess" not in text


def serve(args, timeout=30):
    return subprocess.run([sys.executable, "-m", "dashboard", "serve", "--port", "0", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PGDASH_TOKEN": ""})


def test_serving_beyond_loopback_without_a_token_is_refused(tmp_path):
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    for host in ("0.0.0.0", "::"):
        done = serve(["--host", host, "--db", db])
        assert done.returncode == 2, done.stderr
        assert "--token" in done.stderr and "PGDASH_TOKEN" in done.stderr
        assert "--insecure" in done.stderr
    # Both TLS files or neither; a missing file is named with its flag.
    done = serve(["--tls-cert", str(tmp_path / "nope.pem"), "--db", db])
    assert done.returncode == 2 and "--tls-key" in done.stderr
    done = serve(["--tls-cert", str(tmp_path / "nope.pem"), "--tls-key",
                  str(tmp_path / "nope.key"), "--db", db])
    assert done.returncode == 2
    assert "cannot read --tls-cert (PGDASH_TLS_CERT) file" in done.stderr
    assert "nope.pem" in done.stderr
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    done = serve(["--tls-cert", str(tmp_path / "junk.pem"), "--tls-key",
                  str(tmp_path / "junk.pem"), "--db", db])
    assert done.returncode == 2 and "must be PEM files" in done.stderr


def test_insecure_allows_an_open_non_loopback_server(tmp_path):
    srv = ServerProcess(f"sqlite:///{tmp_path / 'db.sqlite'}", log_path=tmp_path / "s.log",
                        extra=["--host", "0.0.0.0", "--insecure"]).start()
    try:
        assert srv.api("/api/jobs") == {"jobs": []}
    finally:
        srv.stop()
    assert "without --token (--insecure)" in (tmp_path / "s.log").read_text()


def test_tls_serves_https_and_agents_verify_the_certificate(tmp_path):
    cert, key = make_cert(tmp_path)
    srv = ServerProcess(f"sqlite:///{tmp_path / 'db.sqlite'}", log_path=tmp_path / "s.log",
                        extra=["--tls-cert", str(cert), "--tls-key", str(key),
                               "--token", TOKEN]).start()
    try:
        assert srv.url.startswith("https://")
        status, _, _ = ask(srv, "GET", "/api/jobs", {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200
        # Without the CA the certificate is not trusted: no silent downgrade.
        with pytest.raises(ssl.SSLCertVerificationError):
            ask(srv, "GET", "/api/jobs", context=ssl.create_default_context())
        # A real gloo job over wss, trusting the self-signed certificate via PGDASH_CA_FILE.
        procs = launch_job("train_job.py", 2, srv.url, "over-tls", tmp_path,
                           env={"PGDASH_TOKEN": TOKEN, "PGDASH_CA_FILE": str(cert)},
                           args=["--steps", "5"])
        assert wait_job(procs, 120, tmp_path) == [0, 0]
        job = wait_for(lambda: (j := job_by_name(srv, "over-tls")) and
                       j["status"] == "finished" and j, 30, "the job over wss")
        assert len(srv.api(f"/api/jobs/{job['id']}")["ranks"]) == 2
        # It spoke the compact protocol (v2 over wss): TLS no longer sends agents back to v1.
        counts = batches(srv)
        assert counts["v1"] == 0 and counts["v2"] > 0, counts
        # An agent that speaks v1 (Socket.IO over wss, piped to Werkzeug) is served too, and
        # the cookie that a login over https sets is a secure one.
        procs = launch_job("train_job.py", 1, srv.url, "v1-over-tls", tmp_path,
                           env={"PGDASH_TOKEN": TOKEN, "PGDASH_CA_FILE": str(cert),
                                "PGDASH_WIRE": "v1"}, args=["--steps", "3"])
        assert wait_job(procs, 120, tmp_path) == [0]
        wait_for(lambda: (j := job_by_name(srv, "v1-over-tls")) and j["status"] == "finished",
                 30, "the v1 job over wss")
        assert batches(srv)["v1"] > 0
        status, head, _ = login(srv, TOKEN)
        assert status == 303 and "Secure" in head["Set-Cookie"]
        # Without PGDASH_CA_FILE the agent refuses the unknown certificate and says why.
        procs = launch_job("train_job.py", 1, srv.url, "untrusted", tmp_path,
                           env={"PGDASH_TOKEN": TOKEN, "PGDASH_FLUSH_TIMEOUT_S": "3"},
                           args=["--steps", "3"])
        assert wait_job(procs, 120, tmp_path) == [0]
        assert job_by_name(srv, "untrusted") is None
        text = (tmp_path / "untrusted-rank0.log").read_text()
        assert "certificate is not trusted" in text and "PGDASH_CA_FILE" in text
    finally:
        srv.stop()


def batches(srv) -> dict[str, float]:
    """Agent batches the server received, by protocol, from its /metrics."""
    status, _, text = ask(srv, "GET", "/metrics", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200
    found = re.findall(r'^pgdash_ingest_batches_total\{protocol="(v\d)"\} (\S+)$', text, re.M)
    return {protocol: float(n) for protocol, n in found}


def test_browser_logs_in_and_the_page_goes_live(locked, browser):
    """Headless Chromium: the page sends you to the login form, the token lets you in, the
    live feed (/ui, authorised by the cookie) connects, and logout locks the page again."""
    from playwright.sync_api import expect

    agent = socketio.Client(reconnection=False)
    agent.connect(locked.url, namespaces=["/agent"], transports=["websocket"],
                  auth={"v": PROTOCOL_VERSION, "session": "s-browser", "job": "seen",
                        "rank": 0, "host": "node-a", "pid": 1, "token": TOKEN},
                  wait_timeout=WAIT_S)
    try:
        ack = agent.call("batch", {"v": PROTOCOL_VERSION, "events": [
            {"seq": 1, "t": 1.0, "kind": "hello", "body": {"job": "seen", "rank": 0,
                                                            "world_size": 1, "host": "node-a",
                                                            "pid": 1}}]},
                         namespace="/agent", timeout=10)
        assert ack["ok"] and ack["stored"] == 1
        jid = wait_for(lambda: job_by_name(locked, "seen"), 10, "the job")["id"]
        errors = []
        context = browser.new_context()  # its own cookies: logged out
        try:
            page = context.new_page()
            page.set_default_timeout(10_000)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{locked.url}/jobs/{jid}")
            expect(page).to_have_url(re.compile(r"/login\?next=/jobs/"))
            page.fill("#token", "wrong")
            page.click("#login-submit")
            expect(page.locator("#login-error")).to_have_text(
                "That is not this server's token.")
            page.fill("#token", TOKEN)
            page.click("#login-submit")
            expect(page).to_have_url(f"{locked.url}/jobs/{jid}")
            expect(page.locator("#live-text")).to_have_text("Live")
            expect(page.locator("#job-name")).to_have_text("seen")
            assert page.evaluate("document.cookie") == ""  # HttpOnly: no script reads it
            page.goto(f"{locked.url}/logout")
            page.goto(f"{locked.url}/")
            expect(page).to_have_url(re.compile(r"/login\?next=/$"))
        finally:
            context.close()
        assert errors == []
    finally:
        disconnect(agent)


def test_the_page_goes_live_over_https_beside_a_v2_agent_over_wss(tmp_path, browser):
    """With --tls-cert the front decrypts every connection: an agent's compact websocket stays
    on its loop while the page and its Socket.IO feed are piped to Werkzeug."""
    import websocket
    from playwright.sync_api import expect

    from pgdash_agent.wire import AGENT_V2_PATH, PROTOCOL_V2, decode_v2, encode_v2

    cert, key = make_cert(tmp_path)
    srv = ServerProcess(f"sqlite:///{tmp_path / 'db.sqlite'}", log_path=tmp_path / "s.log",
                        extra=["--tls-cert", str(cert), "--tls-key", str(key)]).start()
    ws = websocket.create_connection("wss" + srv.url[len("https"):] + AGENT_V2_PATH,
                                     timeout=20, sslopt={"ca_certs": str(cert)})
    try:
        ws.send_binary(encode_v2({"auth": {"v": PROTOCOL_V2, "session": "s-tls", "job": "tls",
                                           "rank": 0, "host": "h", "pid": 1}}))
        assert decode_v2(ws.recv())["ok"]
        ws.send_binary(encode_v2({"id": 1, "events": [
            {"seq": 1, "t": 1.0, "kind": "hello", "body": {"job": "tls", "rank": 0,
                                                            "world_size": 1, "host": "h",
                                                            "pid": 1}}]}))
        assert decode_v2(ws.recv())["stored"] == 1
        # A frame many times the TLS read buffer (dashboard.ingest.tls.READ_BUFFER) arrives
        # whole: five errors with 60 kB of text each.
        text = "x" * 60_000
        ws.send_binary(encode_v2({"id": 2, "events": [
            {"seq": 2 + i, "t": 2.0, "kind": "error",
             "body": {"where": "step", "error_type": "RuntimeError", "error": f"{i}{text}"}}
            for i in range(5)]}))
        assert decode_v2(ws.recv())["stored"] == 5
        jid = wait_for(lambda: job_by_name(srv, "tls"), 10, "the job")["id"]
        context = browser.new_context(ignore_https_errors=True)  # the self-signed certificate
        errors = []
        try:
            page = context.new_page()
            page.set_default_timeout(15_000)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{srv.url}/jobs/{jid}")
            expect(page.locator("#live-text")).to_have_text("Live")
            expect(page.locator("#job-name")).to_have_text("tls")
        finally:
            context.close()
        assert errors == []
    finally:
        ws.close()
        srv.stop()
