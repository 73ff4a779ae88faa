"""Token guessing is limited per client address: past PGDASH_LOGIN_MAX_FAILURES failed attempts
in PGDASH_LOGIN_WINDOW_S, an address gets 429 with a Retry-After on the API, /login and /ui,
right token or not (agents connecting with a wrong token count too); other addresses and
successful attempts are unaffected; memory is bounded."""

from __future__ import annotations

import http.client
import json
import re
import socket
import urllib.parse

import pytest
import socketio
import websocket

from pgdash_agent.wire import AGENT_V2_PATH, PROTOCOL_V2, UI_NAMESPACE, decode_v2, encode_v2
from tests.helpers.procs import ServerProcess, wait_for
from tests.helpers.closing import disconnect
from dashboard.ingest.guard import LoginGuard, client_address, from_config

TOKEN = "tok-guess-me-if-you-can-7c1"
GUESSER = "127.0.0.1"
OTHER = "127.0.0.2"  # all of 127/8 is loopback on Linux: a second client address
WINDOW_S = 6


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_guard_counts_failures_in_a_sliding_window_per_address():
    clock = Clock()
    guard = LoginGuard(max_failures=3, window_s=10, max_addresses=100, clock=clock)
    for _ in range(2):
        guard.failed("a")
        clock.now += 1
    assert guard.retry_after("a") == 0  # two of three: still allowed
    guard.failed("a")  # failures at 1000, 1001, 1002
    assert guard.retry_after("a") == pytest.approx(8)  # until 1000 leaves the window
    assert guard.retry_after("b") == 0  # another address is not touched
    clock.now = 1010.5  # the first failure has left the window: one more try
    assert guard.retry_after("a") == 0
    guard.failed("a")
    assert guard.retry_after("a") == pytest.approx(0.5)  # now 1001 must leave
    assert guard.counters["failures"] == 4 and guard.counters["refused"] == 2
    message = guard.message("a", 7.2)
    assert "PGDASH_LOGIN_MAX_FAILURES" in message and "PGDASH_LOGIN_WINDOW_S" in message
    assert "8 s" in message and "3 per 10 s" in message


def test_guard_memory_is_bounded_by_addresses_and_failures():
    clock = Clock()
    guard = LoginGuard(max_failures=5, window_s=60, max_addresses=50, clock=clock)
    for i in range(10_000):  # a guesser with many addresses, or a scan
        guard.failed(f"10.0.{i // 256}.{i % 256}")
        guard.failed("steady")  # keeps failing: stays the most recent, never evicted
    assert len(guard) == 50
    assert guard.counters["evicted"] == 10_000 - 49
    assert max(len(t) for t in guard._failures.values()) == 5
    assert guard.retry_after("steady") > 0
    off = LoginGuard(max_failures=0, window_s=60, max_addresses=1, clock=clock)
    for _ in range(100):
        off.failed("a")
    assert off.retry_after("a") == 0 and len(off) == 0


def test_the_address_behind_trusted_proxies_is_the_one_the_outermost_saw():
    # Direct: X-Forwarded-For is whatever the client wrote, so it is ignored.
    assert client_address("10.0.0.9", "1.2.3.4", proxies=0) == "10.0.0.9"
    # One proxy (nginx's $proxy_add_x_forwarded_for): the last entry is the real client;
    # what the client wrote itself, further left, does not spread its guesses.
    assert client_address("10.0.0.1", "6.6.6.6, 203.0.113.7", proxies=1) == "203.0.113.7"
    assert client_address("10.0.0.1", "6.6.6.6, 203.0.113.7, 10.0.0.2", 2) == "203.0.113.7"
    # Fewer entries than proxies, or none: the connection's own address.
    assert client_address("10.0.0.1", "203.0.113.7", proxies=2) == "10.0.0.1"
    assert client_address("10.0.0.1", None, proxies=1) == "10.0.0.1"
    assert client_address(None, None, proxies=0) == "?"


@pytest.mark.parametrize("config, named", [
    ({"LOGIN_PROXIES": "yes"}, "PGDASH_LOGIN_PROXIES must be an integer"),
    ({"LOGIN_MAX_FAILURES": "many"}, "PGDASH_LOGIN_MAX_FAILURES must be an integer"),
    ({"LOGIN_WINDOW_S": 0}, "PGDASH_LOGIN_WINDOW_S must be positive"),
    ({"LOGIN_MAX_ADDRESSES": -3}, "PGDASH_LOGIN_MAX_ADDRESSES must be positive"),
])
def test_bad_settings_are_named(config, named):
    with pytest.raises(ValueError, match=named):
        from_config(config)


@pytest.fixture
def guarded(tmp_path):
    srv = ServerProcess(f"sqlite:///{tmp_path / 'db.sqlite'}", log_path=tmp_path / "server.log",
                        extra=["--token", TOKEN],
                        env={"PGDASH_LOGIN_MAX_FAILURES": "3",
                             "PGDASH_LOGIN_WINDOW_S": str(WINDOW_S)}).start()
    yield srv
    srv.stop()


def ask(server, method, path, source=GUESSER, headers=None, body=None):
    """One raw HTTP request from a chosen loopback address: (status, headers, text)."""
    parsed = urllib.parse.urlparse(server.url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10,
                                      source_address=(source, 0))
    try:
        conn.request(method, path, body=body, headers=headers or {})
        with conn.getresponse() as resp:  # conn.close() leaves it open after a failed read
            return resp.status, resp.headers, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


def login(server, token, source=GUESSER):
    return ask(server, "POST", "/login", source,
               {"Content-Type": "application/x-www-form-urlencoded"},
               urllib.parse.urlencode({"token": token, "next": "/"}))


def metric(server, outcome):
    status, _, text = ask(server, "GET", "/metrics", OTHER, bearer(TOKEN))
    assert status == 200, text
    return int(float(re.search(rf'pgdash_login_attempts_total\{{outcome="{outcome}"\}} (\S+)',
                               text).group(1)))


def ui_refusal(server, headers):
    """Why /ui refused a connection (None: it was accepted)."""
    client = socketio.Client(reconnection=False)
    reasons = []
    client.on("connect_error", reasons.append, namespace=UI_NAMESPACE)
    try:
        client.connect(server.url, namespaces=[UI_NAMESPACE], transports=["websocket"],
                       headers=headers, wait_timeout=10)
        return None
    except socketio.exceptions.ConnectionError as exc:
        return f"{exc}: {reasons}"
    finally:
        disconnect(client)


def test_guessing_the_token_is_cut_off_per_address_then_allowed_again(guarded):
    # Successful attempts never count, however many.
    for _ in range(10):
        assert ask(guarded, "GET", "/api/jobs", headers=bearer(TOKEN))[0] == 200
    assert login(guarded, TOKEN)[0] == 303
    # A request without any credential is not a guess: 401, not counted.
    for _ in range(5):
        assert ask(guarded, "GET", "/api/jobs")[0] == 401
    assert metric(guarded, "failed") == 0

    # Three wrong guesses, each by a different door, are answered as usual ...
    assert ask(guarded, "GET", "/api/jobs", headers=bearer("guess-1"))[0] == 401
    assert login(guarded, "guess-2")[0] == 401
    assert ask(guarded, "GET", "/metrics", headers=bearer("guess-3"))[0] == 401
    # ... then the address is refused everywhere, the right token included.
    status, head, text = ask(guarded, "GET", "/api/jobs", headers=bearer("guess-4"))
    assert status == 429
    assert 1 <= int(head["Retry-After"]) <= WINDOW_S
    error = json.loads(text)["error"]
    assert "PGDASH_LOGIN_MAX_FAILURES" in error and GUESSER in error and "guess" not in error
    assert ask(guarded, "GET", "/api/jobs", headers=bearer(TOKEN))[0] == 429
    status, head, text = login(guarded, TOKEN)
    assert status == 429 and "Retry-After" in head
    assert "PGDASH_LOGIN_MAX_FAILURES" in text and TOKEN not in text
    assert "PGDASH_LOGIN_MAX_FAILURES" in ui_refusal(guarded, bearer(TOKEN))
    # The page (no credential) is refused too, as a page: the login form with the reason.
    status, _, text = ask(guarded, "GET", "/jobs/1")
    assert status == 429 and "<form" in text and "PGDASH_LOGIN_WINDOW_S" in text

    # Another address, and successful logins from it, are not touched.
    assert ask(guarded, "GET", "/api/jobs", OTHER, bearer(TOKEN))[0] == 200
    assert login(guarded, TOKEN, OTHER)[0] == 303
    assert ui_refusal(guarded, bearer(TOKEN)) is not None  # (the guesser, still)
    assert metric(guarded, "failed") == 3
    assert metric(guarded, "refused") >= 5

    # Once the window has passed, the right token works again from the guesser's address.
    wait_for(lambda: ask(guarded, "GET", "/api/jobs", headers=bearer(TOKEN))[0] == 200,
             WINDOW_S + 30, "the guesser's address let in again after the window",
             interval=0.5)
    assert ui_refusal(guarded, bearer(TOKEN)) is None


def agent_hello(server, token, source):
    """An agent's (protocol v2) hello from a chosen loopback address: the server's reply."""
    parsed = urllib.parse.urlparse(server.url)
    sock = socket.create_connection((parsed.hostname, parsed.port), timeout=10,
                                    source_address=(source, 0))
    ws = websocket.create_connection(f"ws://{parsed.hostname}:{parsed.port}{AGENT_V2_PATH}",
                                     socket=sock, timeout=10)
    try:
        auth = {"v": PROTOCOL_V2, "session": f"s-{source}", "job": "guess", "rank": 0,
                "host": "h", "pid": 1}
        if token is not None:
            auth["token"] = token
        ws.send_binary(encode_v2({"auth": auth}))
        return decode_v2(ws.recv())
    finally:
        ws.close()


def test_agents_guessing_the_token_are_cut_off_too(guarded):
    agents, careless, other = "127.0.0.3", "127.0.0.4", "127.0.0.5"
    # An agent without a token is misconfigured, not guessing: refused, never counted.
    for _ in range(5):
        reply = agent_hello(guarded, None, careless)
        assert reply["ok"] is False and "PGDASH_TOKEN" in reply["error"]
    assert agent_hello(guarded, TOKEN, careless)["ok"] is True
    # Wrong tokens are guesses: three are answered as usual, then the address is refused,
    # the right token included, with the settings named.
    for i in range(3):
        reply = agent_hello(guarded, f"guess-{i}", agents)
        assert reply["ok"] is False and "PGDASH_TOKEN" in reply["error"]
    reply = agent_hello(guarded, TOKEN, agents)
    assert reply["ok"] is False and "PGDASH_LOGIN_MAX_FAILURES" in reply["error"]
    assert TOKEN not in reply["error"]
    # ... on the HTTP doors too (one guard for every door), and no other address is touched.
    assert ask(guarded, "GET", "/api/jobs", agents, bearer(TOKEN))[0] == 429
    assert agent_hello(guarded, TOKEN, other)["ok"] is True
    assert metric(guarded, "failed") == 3
