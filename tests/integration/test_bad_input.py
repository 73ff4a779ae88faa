"""Bad input, as a newcomer types it: every command-line flag, database and queue URL, file,
API parameter and agent setting that is wrong gets one whole, clear message and never a
traceback. CLI errors exit with status 2, API errors are 4xx JSON with an "error" string, and a
wrong agent setting leaves training running.

Real processes throughout: each CLI case is a `pgdash` subprocess (run a few at a time), the
API cases share one real server, the agent cases are real one-rank gloo jobs.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest
import socketio

from pgdash_agent.wire import AGENT_NAMESPACE, PROTOCOL_VERSION
from tests.helpers.procs import ROOT, WAIT_S, ServerProcess, launch_job, wait_job
from tests.helpers.closing import disconnect

TOKEN = "bad-input-test-token-0123456789"

# A message cut short ends on one of these words (or "at most 256"), or leaves a bracket open.
DANGLING = {"a", "an", "the", "of", "at", "most", "least", "to", "in", "for", "with", "and",
            "or", "than", "by", "from", "is", "are", "must", "be", "e.g.", "such", "as", "not"}


def assert_whole(message: str) -> None:
    """One line that ends where its sentence ends."""
    text = message.strip()
    assert text and "\n" not in text, f"not one line: {message!r}"
    assert "Traceback" not in text
    assert text.split()[-1].lower() not in DANGLING, f"cut short: {text!r}"
    assert not re.search(r"\bat (most|least) [\d_,.]+$", text), f"cut short: {text!r}"
    assert not text.endswith(("...", "\u2026", ",", ":", ";", " -")), f"cut short: {text!r}"
    for opening, closing in ("()", "[]", "{}"):
        assert text.count(opening) == text.count(closing), f"unbalanced {opening}: {text!r}"


# -- the command line ------------------------------------------------------------------------

@dataclass(frozen=True)
class Cli:
    """``pgdash ARGS`` (``{tmp}`` is the case folder, ``{busy}`` a port in use) must exit 2
    with one message holding each of ``expect`` and none of ``absent``."""

    name: str
    args: tuple[str, ...]
    expect: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    absent: tuple[str, ...] = ()


UNREACHABLE_PG = "postgresql://pgdash@127.0.0.1:1/x"
SUPPORTED = "SQLite or PostgreSQL"

CLI_CASES = [
    Cli("serve-port-out-of-range", ("serve", "--port", "99999"),
        ("Invalid value for '--port'", "0<=x<=65535")),
    Cli("serve-port-not-a-number", ("serve", "--port", "abc"), ("'abc' is not a valid integer",)),
    Cli("serve-port-in-use", ("serve", "--port", "{busy}", "--db", "sqlite:///{tmp}/p.db"),
        ("cannot listen on 127.0.0.1:", "Pick another --port")),
    Cli("serve-hang-after-negative", ("serve", "--hang-after", "-1"),
        ("Invalid value for '--hang-after'",)),
    Cli("serve-stall-after-not-a-number", ("serve", "--stall-after", "abc"),
        ("Invalid value for '--stall-after'", "'abc' is not a valid float")),
    Cli("serve-lease-zero", ("serve", "--lease", "0"), ("Invalid value for '--lease'",)),
    Cli("serve-keep-full-negative", ("serve", "--keep-full", "-5"),
        ("Invalid value for '--keep-full'",)),
    Cli("serve-keyframe-off-the-grid", ("serve", "--db", "sqlite:///{tmp}/kf.db"),
        ("PGDASH_KEYFRAME_S must be 0 (no keyframes) or a multiple of 0.5 seconds",),
        env={"PGDASH_KEYFRAME_S": "3.3"}),
    Cli("serve-beyond-loopback-without-token", ("serve", "--host", "0.0.0.0"),
        ("refusing to listen on 0.0.0.0 without a token", "--insecure")),
    Cli("serve-tls-cert-without-key", ("serve", "--tls-cert", "{tmp}/nope.pem"),
        ("--tls-cert and --tls-key go together",)),
    Cli("serve-tls-cert-missing", ("serve", "--tls-cert", "{tmp}/nope.pem", "--tls-key",
                                   "{tmp}/nope.key", "--db", "sqlite:///{tmp}/t.db"),
        ("cannot read --tls-cert (PGDASH_TLS_CERT) file", "nope.pem")),
    Cli("serve-notify-not-http", ("serve", "--notify", "ftp://x", "--db", "sqlite:///{tmp}/n.db"),
        ("--notify / PGDASH_NOTIFY must be an http(s) URL",)),
    Cli("db-postgres-spelling", ("serve", "--db", "postgres://pgdash:s3cret@127.0.0.1:1/x"),
        ("SQLAlchemy spells PostgreSQL 'postgresql'",
         "use postgresql+psycopg://pgdash:***@127.0.0.1:1/x"), absent=("s3cret",)),
    Cli("db-mysql", ("serve", "--db", "mysql://u@127.0.0.1/x"), (SUPPORTED, "not 'mysql'")),
    Cli("db-redis", ("serve", "--db", "redis://127.0.0.1:6379/0"),
        ("is a Redis URL, which goes to --queue", "sqlite:///pgdash.db")),
    Cli("db-garbage", ("serve", "--db", "not a url"), ("is not a database URL", SUPPORTED)),
    Cli("db-postgresql-unreachable", ("serve", "--db", UNREACHABLE_PG),
        ("could not connect to PostgreSQL at 127.0.0.1:1 (database x, user pgdash)",
         "Check that PostgreSQL runs and listens there")),
    Cli("db-sqlite-folder-missing", ("serve", "--db", "sqlite:///{tmp}/no/such/dir/x.db"),
        ("no/such/dir does not exist", "mkdir -p")),
    Cli("db-sqlite-folder-unwritable", ("serve", "--db", "sqlite:////proc/pgdash-bad-input.db"),
        ("cannot open the SQLite database /proc/pgdash-bad-input.db",
         "may create and write files in /proc")),
    Cli("db-sqlite-not-a-database", ("serve", "--db", "sqlite:///{tmp}/text.txt"),
        ("text.txt is not an SQLite database",)),
    Cli("db-sqlite-is-a-folder", ("serve", "--db", "sqlite:///{tmp}"), ("is a folder",)),
    Cli("db-from-environment", ("serve",), ("--db / PGDASH_DB", "not 'mysql'"),
        env={"PGDASH_DB": "mysql://u@127.0.0.1/x"}),
    Cli("queue-not-redis", ("serve", "--queue", "http://127.0.0.1:6379"),
        ("--queue / PGDASH_QUEUE must be a Redis URL such as redis://127.0.0.1:6379/0",)),
    Cli("queue-needs-postgresql", ("serve", "--queue", "redis://127.0.0.1:1/0", "--db",
                                   "sqlite:///{tmp}/q.db"),
        ("must share one PostgreSQL database",)),
    Cli("queue-redis-unreachable", ("serve", "--db", UNREACHABLE_PG, "--queue",
                                    "redis://127.0.0.1:1/0"),
        ("cannot reach Redis", "Connection refused")),
    Cli("db-upgrade-mysql", ("db", "upgrade", "--db", "mysql://u@127.0.0.1/x"), (SUPPORTED,)),
    Cli("db-upgrade-unreachable", ("db", "upgrade", "--db", UNREACHABLE_PG),
        ("could not connect to PostgreSQL",)),
    Cli("export-db-postgres-spelling", ("export", "1", "-o", "{tmp}/o.jsonl", "--db",
                                        "postgres://u@127.0.0.1:1/x"),
        ("spells PostgreSQL 'postgresql'",)),
    Cli("export-job-not-a-number", ("export", "abc", "-o", "{tmp}/o.jsonl"),
        ("'abc' is not a valid integer",)),
    Cli("export-no-such-job", ("export", "7", "-o", "{tmp}/o.jsonl", "--db",
                               "sqlite:///{tmp}/fresh.db"),
        ("no job with id 7 in sqlite:///", "GET /api/jobs shows their ids")),
    Cli("export-window-without-trace", ("export", "1", "-o", "{tmp}/o.jsonl", "--start", "5"),
        ("--start, --end and --max-events go with --trace",)),
    Cli("export-trace-cap-not-a-number", ("export", "1", "--trace", "-o", "{tmp}/t.json"),
        ("PGDASH_TRACE_MAX_EVENTS must be a positive integer, got 'abc'",),
        env={"PGDASH_TRACE_MAX_EVENTS": "abc"}),
    Cli("import-missing-file", ("import", "{tmp}/missing.jsonl", "--db",
                                "sqlite:///{tmp}/imp.db"),
        ("cannot read", "No such file or directory", "pgdash export")),
    Cli("import-not-an-export", ("import", "{tmp}/text.txt", "--db", "sqlite:///{tmp}/imp.db"),
        ("line 1: not JSON", "one JSON object per line")),
    Cli("import-binary-file", ("import", "{tmp}/binary.bin", "--db", "sqlite:///{tmp}/imp.db"),
        ("is not a text file", "made by `pgdash export`")),
    Cli("import-empty-file", ("import", "{tmp}/empty.jsonl", "--db", "sqlite:///{tmp}/imp.db"),
        ("empty.jsonl is empty",)),
    Cli("import-job-without-name", ("import", "{tmp}/noname.jsonl", "--db",
                                    "sqlite:///{tmp}/imp.db"),
        ("job.name must be a non-empty string of at most 256 characters, got ''",)),
    Cli("import-db-unreachable", ("import", "{tmp}/ok.jsonl", "--db", UNREACHABLE_PG),
        ("could not connect to PostgreSQL",)),
    Cli("import-a-folder", ("import", "{tmp}", "--db", "sqlite:///{tmp}/imp.db"),
        ("is a directory",)),
    Cli("replay-missing-file", ("replay", "{tmp}/missing.jsonl"), ("cannot read",)),
    Cli("replay-no-such-job", ("replay", "5", "--db", "sqlite:///{tmp}/fresh2.db"),
        ("no job with id 5",)),
    Cli("replay-db-garbage", ("replay", "1", "--db", "garbage"), ("is not a database URL",)),
    Cli("replay-step-too-small", ("replay", "{tmp}/noname.jsonl", "--step", "0"),
        ("Invalid value for '--step'",)),
    Cli("demo-unknown-scenario", ("demo", "--scenario", "nope"),
        ("Invalid value for '--scenario'", "'nope' is not one of")),
    Cli("demo-no-ranks", ("demo", "--ranks", "0"), ("Invalid value for '--ranks'",)),
    Cli("demo-db-postgres-spelling", ("demo", "--port", "0", "--db",
                                      "postgres://u@127.0.0.1:1/x"),
        ("spells PostgreSQL 'postgresql'",)),
]


def _environment(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGDASH_")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory):
    """Every CLI case run once, a few at a time (each is a fresh interpreter)."""
    tmp = tmp_path_factory.mktemp("cli")
    (tmp / "text.txt").write_text("hello, this is not a session file\n")
    (tmp / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (tmp / "empty.jsonl").write_text("")
    (tmp / "noname.jsonl").write_text(json.dumps({"format": "pgdash-session", "version": 1,
                                                  "job": {"name": ""}}) + "\n")
    (tmp / "ok.jsonl").write_text(json.dumps({"format": "pgdash-session", "version": 1,
                                              "job": {"name": "ok"}}) + "\n")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = str(busy.getsockname()[1])

    def run(case: Cli) -> subprocess.CompletedProcess:
        args = [a.replace("{tmp}", str(tmp)).replace("{busy}", port) for a in case.args]
        return subprocess.run([sys.executable, "-m", "dashboard", *args], cwd=tmp,
                              capture_output=True, text=True, timeout=90,
                              env=_environment(case.env))

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            results = dict(zip((c.name for c in CLI_CASES), pool.map(run, CLI_CASES)))
    finally:
        busy.close()
    return results


def cli_message(stderr: str) -> str:
    """The message of a failed command: click's "Error: ..." line, else its only line."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error: ")]
    if errors:
        assert len(errors) == 1, stderr
        other = [line for line in lines if line not in errors]
        assert all(line.startswith(("Usage: ", "Try '")) for line in other), stderr
        return errors[0][len("Error: "):]
    assert len(lines) == 1, f"expected one line, got:\n{stderr}"
    return lines[0]


@pytest.mark.parametrize("case", CLI_CASES, ids=lambda c: c.name)
def test_cli_bad_input_exits_2_with_one_whole_message(case, cli_results):
    done = cli_results[case.name]
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output
    assert done.returncode == 2, f"exit {done.returncode}:\n{output}"
    message = cli_message(done.stderr)
    assert_whole(message)
    for text in case.expect:
        assert text in message, f"{text!r} not in {message!r}"
    for text in case.absent:
        assert text not in output


# -- the HTTP API ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Api:
    """``METHOD path`` must answer ``status`` with a JSON ``error`` holding each of
    ``expect`` (``/login`` answers its page, not JSON)."""

    name: str
    path: str
    status: int
    expect: tuple[str, ...]
    method: str = "GET"
    body: bytes | None = None
    token: str | None = TOKEN


ROUTES = "the routes are /api/jobs, /api/jobs/<id>"
API_CASES = [
    Api("job-unknown", "/api/jobs/999999", 404, ("no job with id 999999",)),
    Api("job-not-a-number", "/api/jobs/abc", 404, ("no API route '/api/jobs/abc'", ROUTES)),
    Api("job-negative", "/api/jobs/-1", 404, ("no API route", "a positive integer")),
    Api("job-too-big", "/api/jobs/99999999999999999999999", 404, ("no job with id",)),
    Api("state-at-not-a-number", "/api/jobs/{job}/state?at=notanumber", 400,
        ("at must be a time in Unix seconds", "got 'notanumber'")),
    Api("state-at-negative", "/api/jobs/{job}/state?at=-5", 400,
        ("is before job", "pick a moment from")),
    Api("state-at-missing", "/api/jobs/{job}/state", 400, ("at must be a time in Unix seconds",)),
    Api("state-at-nan", "/api/jobs/{job}/state?at=nan", 400, ("got 'nan'",)),
    Api("state-at-far-future", "/api/jobs/{job}/state?at=1e12", 400,
        ("after the server's clock", "pick a moment up to now")),
    Api("state-unknown-job", "/api/jobs/999999/state?at=5", 404, ("no job with id 999999",)),
    Api("compare-a-not-a-number", "/api/jobs/{job}/compare?a=x&b=5", 400,
        ("a must be a time in Unix seconds", "got 'x'")),
    Api("compare-a-far-future", "/api/jobs/{job}/compare?a=1e12", 400,
        ("a: ", "after the server's clock")),
    Api("compare-a-before-the-job", "/api/jobs/{job}/compare?a=1&b=-5", 400,
        ("a: ", "is before job")),
    Api("compare-unknown-job", "/api/jobs/999999/compare?a=5&b=6", 404,
        ("no job with id 999999",)),
    Api("collectives-rank-not-a-number", "/api/jobs/{job}/collectives?rank=x", 400,
        ("rank must be a non-negative integer, got 'x'",)),
    Api("collectives-rank-negative", "/api/jobs/{job}/collectives?rank=-1", 400,
        ("rank must be a non-negative integer",)),
    Api("trace-start-not-a-number", "/api/jobs/{job}/trace?start=b", 400,
        ("start must be a time in Unix seconds", "got 'b'")),
    Api("trace-end-infinite", "/api/jobs/{job}/trace?end=inf", 400, ("end must be a time",)),
    Api("trace-window-backwards", "/api/jobs/{job}/trace?start=20&end=10", 400,
        ("is after end",)),
    Api("trace-max-events-zero", "/api/jobs/{job}/trace?max_events=0", 400,
        ("max_events must be an integer from 1",)),
    Api("findings-job-zero", "/api/jobs/0/findings", 404, ("no job with id 0",)),
    Api("findings-job-not-a-number", "/api/jobs/abc/findings", 404, ("no API route",)),
    Api("findings-job-unknown", "/api/jobs/999999/findings", 404, ("no job with id 999999",)),
    Api("incidents-job-unknown", "/api/jobs/999999/incidents", 404, ("no job with id",)),
    Api("export-job-unknown", "/api/jobs/999999/export", 404, ("no job with id",)),
    Api("unknown-route", "/api/nope", 404, ("no API route '/api/nope'", ROUTES)),
    Api("unknown-job-route", "/api/jobs/{job}/nope", 404, ("no API route",)),
    Api("post-to-a-get-route", "/api/jobs", 405, ("Method Not Allowed",), method="POST",
        body=b'{"name": "x"}'),
    Api("wrong-token", "/api/jobs", 401, ("needs its token", "Authorization: Bearer"),
        token="wrong-token-wrong-token"),
    Api("login-without-token-field", "/login", 401, ("not this server's token",),
        method="POST", body=b"garbage=1", token=None),
]


@pytest.fixture(scope="module")
def api_server(tmp_path_factory):
    """One server for every API case, with a job that has an event (job ``{job}``)."""
    tmp = tmp_path_factory.mktemp("api")
    srv = ServerProcess(f"sqlite:///{tmp / 'pgdash.db'}", log_path=tmp / "server.log",
                        extra=["--token", TOKEN],
                        env={"PGDASH_LOGIN_MAX_FAILURES": "0"}).start()
    client = socketio.Client(reconnection=False)
    try:
        client.connect(srv.url, namespaces=[AGENT_NAMESPACE], transports=["websocket"],
                       wait_timeout=WAIT_S,
                       auth={"v": PROTOCOL_VERSION, "session": "bad-input", "job": "bad-input",
                             "rank": 0, "host": "h", "pid": 1, "token": TOKEN})
        hello = {"job": "bad-input", "rank": 0, "world_size": 1, "host": "h", "pid": 1,
                 "backend": "gloo"}
        ack = client.call("batch", {"v": PROTOCOL_VERSION, "events": [
            {"seq": 1, "t": time.time(), "kind": "hello", "body": hello}]},
            namespace=AGENT_NAMESPACE, timeout=10)
        assert ack["ok"], ack
    finally:
        disconnect(client)
    job = srv.api("/api/jobs")["jobs"][0]["id"]
    yield srv, job, tmp
    srv.stop()
    assert "Traceback" not in (tmp / "server.log").read_text()


def request(srv: ServerProcess, case: Api, job: int) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    headers = {"Authorization": f"Bearer {case.token}"} if case.token else {}
    if case.body is not None:
        headers["Content-Type"] = ("application/json" if case.path.startswith("/api/")
                                   else "application/x-www-form-urlencoded")
    try:
        conn.request(case.method, case.path.replace("{job}", str(job)), body=case.body,
                     headers=headers)
        with conn.getresponse() as resp:  # conn.close() leaves it open after a failed read
            return resp.status, resp.getheader("Content-Type") or "", resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("case", API_CASES, ids=lambda c: c.name)
def test_api_bad_input_answers_4xx_with_one_whole_error(case, api_server):
    srv, job, _ = api_server
    status, kind, body = request(srv, case, job)
    text = body.decode("utf-8", "replace")
    assert "Traceback" not in text
    assert status == case.status, f"{status}: {text[:500]}"
    if not case.path.startswith("/api/"):  # the login page says it in its form
        for expected in case.expect:
            assert expected in text.replace("&#39;", "'"), text
        return
    assert kind.startswith("application/json"), kind
    error = json.loads(body)["error"]
    assert isinstance(error, str)
    assert_whole(error)
    for expected in case.expect:
        assert expected in error, f"{expected!r} not in {error!r}"


# -- the agent's settings --------------------------------------------------------------------

AGENT_CASES = [
    ("interval-not-a-number", {"PGDASH_INTERVAL_S": "abc"},
     "PGDASH_INTERVAL_S must be a float, got 'abc'"),
    ("server-not-http", {"PGDASH_SERVER": "ftp://x"},
     "PGDASH_SERVER must look like http://host:port, got 'ftp://x'"),
    ("wire-unknown", {"PGDASH_WIRE": "v9"}, "PGDASH_WIRE must be auto, v1 or v2"),
    ("relay-unknown", {"PGDASH_RELAY": "sometimes"},
     "PGDASH_RELAY must be auto, 1 or 0, got 'sometimes'"),
    ("batch-negative", {"PGDASH_MAX_BATCH_EVENTS": "-3"},
     "PGDASH_MAX_BATCH_EVENTS must be positive, got -3"),
]


@pytest.fixture(scope="module")
def agent_runs(tmp_path_factory):
    """Each bad setting on a real one-rank gloo job, all started at once."""
    tmp = tmp_path_factory.mktemp("agent")
    started = {name: launch_job("fault_job.py", 1, "http://127.0.0.1:9", f"agent-{name}", tmp,
                                env=env, args=["healthy", "3"])
               for name, env, _ in AGENT_CASES}
    codes = {name: wait_job(procs, 120, tmp)[0] for name, procs in started.items()}
    return {name: (codes[name], (tmp / f"agent-{name}-rank0.log").read_text(errors="replace"))
            for name in codes}


@pytest.mark.parametrize("name, env, expected", AGENT_CASES, ids=[c[0] for c in AGENT_CASES])
def test_bad_agent_setting_says_one_line_and_training_goes_on(name, env, expected, agent_runs):
    code, output = agent_runs[name]
    assert "Traceback" not in output, output
    assert code == 0, output  # the job ran to its end
    said = [line for line in output.splitlines() if line.startswith("pgdash:")]
    assert len(said) == 1, output
    assert said[0].startswith("pgdash: agent not started (training continues without it): ")
    assert expected in said[0], said[0]
    assert_whole(said[0])


def test_the_table_covers_at_least_thirty_bad_inputs():
    assert len(CLI_CASES) + len(API_CASES) + len(AGENT_CASES) >= 30
    names = [c.name for c in CLI_CASES] + [c.name for c in API_CASES]
    assert len(names) == len(set(names))
