"""The server's edges over real websockets: bad input is refused with a reason, nothing stored
is lost, tokens are enforced, and browsers get live pushes."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import time

import pytest
import socketio

from pgdash_agent.wire import AGENT_NAMESPACE, PROTOCOL_VERSION, UI_NAMESPACE
from dashboard.web.live import apply
from tests.helpers.closing import disconnect
from tests.helpers.procs import ROOT, ServerProcess, get_json, job_by_name, wait_for
from tests.helpers.agents import HELLO, agent_client, ev, send


def test_bad_batches_are_refused_with_reasons_and_lose_nothing(server):
    client = agent_client(server.url)
    try:
        first = send(client, [ev(1, "hello", HELLO)])
        assert first == {"ok": True, "stored": 1, "rejected": [], "job": first.get("job")}
        ack = client.call("batch", "garbage", namespace=AGENT_NAMESPACE, timeout=10)
        assert ack == {"ok": False, "error": "batch must be an object, got str", "retry": False}
        assert send(client, "garbage")["error"] == "batch.events must be a list"
        ack = send(client, [ev(2, "group", {"name": "0", "ranks": "all"}),
                            ev(3, "group", {"name": "0", "ranks": [0]})])
        assert ack["ok"] and ack["stored"] == 1
        assert ack["rejected"] == [{"seq": 2, "error": "events[0].body.ranks: Expected "
                                                       "`array`, got `str`"}]
        assert send(client, [ev(1, "hello", HELLO)])["stored"] == 0  # a resend: ignored
        assert send(client, [], v=7)["error"] == "batch.v must be 1, got 7"
        huge = [ev(10 + i, "exit", {"clean": True}) for i in range(501)]
        assert "limit is 500" in send(client, huge)["error"]
    finally:
        disconnect(client)
    job = wait_for(lambda: job_by_name(server, "edge"), 10, "the job")
    assert first["job"] == job["id"]  # the agent can name the job's page
    detail = server.api(f"/api/jobs/{job['id']}")
    assert detail["groups"] == [{"id": "0", "name": "0", "desc": None, "backend": None,
                                 "ranks": [0], "family": "0"}]
    assert detail["ranks"][0]["status"] in ("running", "lost")


def test_malformed_connect_is_refused_with_the_reason(server):
    with pytest.raises(AssertionError, match="auth.session is missing"):
        agent_client(server.url, auth={"v": PROTOCOL_VERSION, "job": "x"})


def test_token_is_enforced(tmp_path):
    srv = ServerProcess(f"sqlite:///{tmp_path / 'db.sqlite'}", extra=["--token", "s3cret"]).start()
    try:
        with pytest.raises(AssertionError, match="wrong or missing token; set PGDASH_TOKEN"):
            agent_client(srv.url, token="wrong")
        client = agent_client(srv.url, token="s3cret")
        assert send(client, [ev(1, "hello", HELLO)])["ok"]
        disconnect(client)
    finally:
        srv.stop()


def test_browser_gets_a_snapshot_then_deltas_over_socketio(server):
    agent = agent_client(server.url, session="live", job="live")
    ui = socketio.Client(reconnection=False)
    inbox: queue.Queue = queue.Queue()
    ui.on("job", lambda payload: inbox.put(("job", payload)), namespace=UI_NAMESPACE)
    ui.on("job_delta", lambda payload: inbox.put(("job_delta", payload)),
          namespace=UI_NAMESPACE)
    try:
        assert send(agent, [ev(1, "hello", {**HELLO, "job": "live"}),
                            ev(2, "group", {"name": "0", "ranks": [0]})])["stored"] == 2
        job = wait_for(lambda: job_by_name(server, "live"), 10, "the job")
        ui.connect(server.url, namespaces=[UI_NAMESPACE], transports=["websocket"])
        assert ui.call("watch", {"job": job["id"]}, namespace=UI_NAMESPACE) == {"ok": True}
        kind, first = inbox.get(timeout=5)
        assert kind == "job" and first["job_id"] == job["id"]
        held = first["sections"]
        assert held["job"]["id"] == job["id"] and held["rank_stats"] == []
        assert [g["ranks"] for g in held["groups"]] == [[0]]
        stats = {"start": 100, "end": 101, "rows": [
            {"group": "0", "op": "all_reduce", "count": 3, "bytes": 12, "sum_us": 30.0,
             "max_us": 12.0, "hist": [[26, 3]]}]}
        sent_at = time.monotonic()
        assert send(agent, [ev(3, "coll_stats", stats)])["stored"] == 1
        version = first["v"]
        while True:  # deltas until the summary shows (diagnosis may push one first)
            kind, d = inbox.get(timeout=5)
            assert kind == "job_delta" and d["base"] == version and d["v"] == version + 1
            version = d["v"]
            assert "job" not in d["sections"] and "groups" not in d["sections"]  # unchanged
            held = apply(held, d)
            if held["rank_stats"]:
                break
        assert time.monotonic() - sent_at < 5
        assert held["rank_stats"] == [{"rank": 0, "count": 3, "group": "0",
                                       "op": "all_reduce", "p50_us": held["rank_stats"][0][
                                           "p50_us"]}]
        assert held["ops"][0]["count"] == 3
        # What the deltas built is what a new watcher's snapshot says.
        ui.call("watch", {"job": job["id"]}, namespace=UI_NAMESPACE)
        while True:
            kind, again = inbox.get(timeout=5)
            if kind == "job":
                break
            held = apply(held, again)
        assert again["v"] >= version
        stable = lambda secs: {k: v for k, v in secs.items()  # noqa: E731
                                  if k not in ("findings", "incidents")}
        assert stable(held) == stable(again["sections"])
        assert ui.call("watch", {"job": 999}, namespace=UI_NAMESPACE)["error"] == \
            "no job with id 999"
        assert "job must be an integer" in ui.call("watch", {"job": "1; drop"},
                                                   namespace=UI_NAMESPACE)["error"]
    finally:
        disconnect(ui)
        disconnect(agent)


def test_db_upgrade_and_bad_db_url(tmp_path):
    db = tmp_path / "fresh.db"
    out = subprocess.run([sys.executable, "-m", "dashboard", "db", "upgrade", "--db",
                          f"sqlite:///{db}"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "is up to date" in out.stdout and db.exists()
    bad = subprocess.run([sys.executable, "-m", "dashboard", "db", "upgrade", "--db",
                          "not a url"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode != 0 and "is not a database URL" in bad.stderr
    missing = subprocess.run([sys.executable, "-m", "dashboard", "serve", "--db",
                              f"sqlite:///{tmp_path}/no/such/dir/x.db"],
                             capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert missing.returncode != 0 and "does not exist" in missing.stderr


def test_metrics_expose_jobs_ranks_and_ingest_counters(server):
    import urllib.request

    agent = agent_client(server.url, session="m", job='quote"job')
    try:
        assert send(agent, [ev(1, "hello", {**HELLO, "job": 'quote"job'}),
                            ev(2, "exit", {"clean": "no"}),
                            ev(3, "coll_stats", {"start": 99.0, "end": 100.0, "rows": [
                                {"group": "0", "op": "all_reduce", "count": 3, "bytes": 12,
                                 "sum_us": 3000.0, "max_us": 1500.0,
                                 "hist": [[77, 2], [84, 1]]}]}),
                            ev(4, "heartbeat", {"groups": [], "dropped": {"coll_stats": 4}})]
                    )["stored"] == 3
        wait_for(lambda: job_by_name(server, 'quote"job'), 10, "the job")
        with urllib.request.urlopen(server.url + "/metrics", timeout=5) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = resp.read().decode()
    finally:
        disconnect(agent)
    lines = text.splitlines()
    assert 'pgdash_jobs{status="running"} 1.0' in lines
    assert 'pgdash_ingest_events_total{result="stored"} 4.0' in lines  # connect + 3
    assert 'pgdash_ingest_events_total{result="rejected"} 1.0' in lines
    assert 'pgdash_ingest_batches_total{protocol="v1"} 1.0' in lines
    assert 'pgdash_ranks{job="quote\\"job",state="running"} 1.0' in lines
    assert 'pgdash_agent_dropped_events_total{job="quote\\"job",kind="coll_stats"} 4.0' in lines
    # Latency in seconds per family and op, all ranks merged: 2 calls of ~0.8 ms, 1 of ~1.5 ms.
    family = 'family="0",job="quote\\"job"'
    bucket = "pgdash_collective_latency_seconds_bucket"
    op = 'op="all_reduce",source="wrapper"'
    assert f'{bucket}{{{family},le="0.001",{op}}} 2.0' in lines
    assert f'{bucket}{{{family},le="0.005",{op}}} 3.0' in lines
    assert f'pgdash_collective_latency_seconds_count{{{family},{op}}} 3.0' in lines
    assert f'pgdash_collective_latency_seconds_sum{{{family},{op}}} 0.003' in lines
    assert f'pgdash_collective_bytes_total{{{family},{op}}} 12.0' in lines
    assert any(l.startswith("pgdash_ingest_lag_seconds ") for l in lines)
    # No series per rank unless asked for (PGDASH_METRICS_PER_RANK): bounded cardinality.
    assert not [l for l in lines if "rank=" in l]
    for line in lines:  # every sample line is "name{labels} number" or a comment
        assert line.startswith("#") or float(line.rsplit(" ", 1)[1]) >= 0


def test_state_at_a_moment_over_http(server):
    import urllib.error

    agent = agent_client(server.url, session="past", job="past")
    try:
        assert send(agent, [ev(1, "hello", {**HELLO, "job": "past"}),
                            ev(2, "group", {"name": "0", "ranks": [0]})])["stored"] == 2
        job = wait_for(lambda: job_by_name(server, "past"), 10, "the job")
        now = get_json(f"{server.url}/api/jobs/{job['id']}/state?at={time.time() + 1}")
        assert set(now) == {"at", "job", "ranks", "groups", "progress", "findings",
                            "incidents", "sections"}
        assert now["sections"]["ranks"] == now["ranks"]
        assert [r["rank"] for r in now["ranks"]] == [0]
        assert [g["ranks"] for g in now["groups"]] == [[0]]
        assert get_json(f"{server.url}/api/jobs/{job['id']}/state?at=1000")["ranks"] == []
        for bad, reason in ((99.0, b"is before job"), (time.time() + 3600, b"after the server")):
            with pytest.raises(urllib.error.HTTPError) as info:
                get_json(f"{server.url}/api/jobs/{job['id']}/state?at={bad}")
            assert info.value.code == 400 and reason in info.value.read()
            info.value.close()
        for bad in ("", "?at=soon", "?at=nan", "?at=inf"):
            with pytest.raises(urllib.error.HTTPError) as info:
                get_json(f"{server.url}/api/jobs/{job['id']}/state{bad}")
            assert info.value.code == 400
            assert b"at must be a time in Unix seconds" in info.value.read()
            info.value.close()
        with pytest.raises(urllib.error.HTTPError) as info:
            get_json(f"{server.url}/api/jobs/4242/state?at=1")
        assert info.value.code == 404
        info.value.close()
        # The same job as a session file (what `pgdash import` reads).
        import urllib.request

        with urllib.request.urlopen(f"{server.url}/api/jobs/{job['id']}/export") as resp:
            assert resp.headers["Content-Type"] == "application/x-ndjson"
            assert "pgdash-job-" in resp.headers["Content-Disposition"]
            lines = resp.read().decode().splitlines()
        from dashboard.history.archive import Archive

        archive = Archive.read(lines)
        assert archive.job["name"] == "past" and len(archive.sessions) == 1
        assert [e["kind"] for e in archive.events] == ["connect", "hello", "group"]
    finally:
        disconnect(agent)


def test_state_at_a_moment_has_the_sections_the_live_feed_sent_at_it(server):
    """Replay and live share one derivation: ``state?at=T`` carries the very sections the
    live feed sent when it judged the job at T (display states included)."""
    t0 = time.time()
    agents = [agent_client(server.url, session=f"feed{r}", job="feed", rank=r)
              for r in range(2)]
    ui = socketio.Client(reconnection=False)
    inbox: queue.Queue = queue.Queue()
    ui.on("job", inbox.put, namespace=UI_NAMESPACE)
    try:
        for r, client in enumerate(agents):
            # Rank 0 waits in all_reduce #5 since t0 - 5; rank 1 never entered it.
            row = {"group": "0", "entered": 5 - r, "completed": 4,
                   "inflight_op": None if r else "all_reduce",
                   "inflight_since": None if r else t0 - 5}
            assert send(client, [
                ev(1, "hello", {**HELLO, "job": "feed", "rank": r, "world_size": 2}, t0 - 8),
                ev(2, "group", {"name": "0", "ranks": [0, 1]}, t0 - 8),
                ev(3, "heartbeat", {"groups": [row]}, t0 - 1)])["stored"] == 3
        job = wait_for(lambda: job_by_name(server, "feed"), 10, "the job")
        time.sleep(1.0)  # everything received well before the moment the feed judges at
        ui.connect(server.url, namespaces=[UI_NAMESPACE], transports=["websocket"])
        assert ui.call("watch", {"job": job["id"]}, namespace=UI_NAMESPACE) == {"ok": True}
        live = inbox.get(timeout=10)
        at = live["at"]
        assert at is not None and at > t0
        states = {r["rank"]: r for r in live["sections"]["rank_states"]}
        assert states[0]["state"] == "waiting" and states[0]["waiting"]["on"] == [1]
        assert states[1]["state"] == "running"
        group = live["sections"]["group_states"][0]
        assert group["behind"] == [[1, 1]] and group["state"] == "behind"
        replay = get_json(f"{server.url}/api/jobs/{job['id']}/state?at={at!r}")
        assert replay["at"] == at
        ours, theirs = replay["sections"], live["sections"]
        assert set(ours) == set(theirs)
        for name in theirs:
            if name not in ("findings", "incidents"):  # live keeps resolved ones too
                assert ours[name] == theirs[name], name
        assert [f["id"] for f in ours["findings"]] == \
            [f["id"] for f in theirs["findings"] if f["active"]]
    finally:
        for client in agents:
            disconnect(client)
        disconnect(ui)


def test_a_big_json_answer_is_gzipped_for_a_client_that_accepts_it(server):
    import gzip
    import http.client
    import urllib.parse

    agent = agent_client(server.url, session="wide", job="wide")
    try:
        assert send(agent, [ev(1, "hello", {**HELLO, "job": "wide"}),
                            ev(2, "group", {"name": "0", "ranks": list(range(4096))})]
                    )["stored"] == 2
        job = wait_for(lambda: job_by_name(server, "wide"), 10, "the job")
        parts = urllib.parse.urlsplit(server.url)

        def fetch(path: str, **headers: str) -> tuple[dict, bytes]:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
            try:
                conn.request("GET", path, headers={k.replace("_", "-"): v
                                                   for k, v in headers.items()})
                with conn.getresponse() as resp:  # conn.close() leaves it open on a failure
                    assert resp.status == 200
                    return dict(resp.getheaders()), resp.read()
            finally:
                conn.close()

        moment = f"/api/jobs/{job['id']}/state?at={time.time() + 1}"
        plain_headers, plain = fetch(moment)
        assert "Content-Encoding" not in plain_headers and len(plain) > 16 * 1024
        headers, body = fetch(moment, Accept_Encoding="gzip, deflate")
        assert headers["Content-Encoding"] == "gzip" and "Accept-Encoding" in headers["Vary"]
        assert len(body) < len(plain) // 3
        assert json.loads(gzip.decompress(body))["groups"] == json.loads(plain)["groups"]
        headers, body = fetch(moment, Accept_Encoding="gzip;q=0, deflate")  # gzip refused
        assert "Content-Encoding" not in headers
        assert json.loads(body)["groups"] == json.loads(plain)["groups"]
        # A small answer goes as it is.
        headers, body = fetch(f"/api/jobs/{job['id']}/incidents", Accept_Encoding="gzip")
        assert "Content-Encoding" not in headers and isinstance(json.loads(body), (dict, list))
    finally:
        disconnect(agent)


def test_state_at_within_answers_the_keyframe_before_the_moment(tmp_path):
    """``&within=S``: the newest keyframe in [at - S, at], read, not folded: the same answer
    as the exact moment it is; without one in reach, the moment asked, folded."""
    from tests.helpers.storedjob import keyframe_moments, stored_job

    db = tmp_path / "kf.sqlite"
    job_id, start, end = stored_job(db, 128, 40)
    kept = keyframe_moments(db, job_id)  # on the 10 s grid
    import sqlite3
    import zlib

    con = sqlite3.connect(db)  # one keyframe this pgdash cannot read: that moment is folded
    con.execute("UPDATE keyframes SET answer = ? WHERE at = ?", (zlib.compress(b"x\ny"),
                                                                 kept[-1]))
    con.commit()
    con.close()
    srv = ServerProcess(f"sqlite:///{db}", log_path=tmp_path / "server.log").start()
    try:
        path = f"/api/jobs/{job_id}/state?at="
        exact = srv.api(f"{path}{kept[0]!r}")
        near = srv.api(f"{path}{kept[0] + 7.5!r}&within=10")
        assert near["at"] == kept[0] and near == exact
        assert len(near["ranks"]) == 128
        # Within 5 s of start + 39.5 there is none (start + 40 is after the moment): folded.
        assert srv.api(f"{path}{kept[-1] + 1!r}&within=5")["at"] == kept[-1] + 1
        assert "keyframe of job" in (tmp_path / "server.log").read_text()
        folded = srv.api(f"{path}{start + 39.5!r}&within=5")
        assert folded["at"] == start + 39.5 and folded == srv.api(f"{path}{start + 39.5!r}")
        import urllib.error

        for bad in ("-1", "301", "nan", "soon", ""):
            with pytest.raises(urllib.error.HTTPError) as info:
                srv.api(f"{path}{start + 20!r}&within={bad}")
            assert info.value.code == 400, bad
            assert b"within must be seconds from 0 to 300" in info.value.read(), bad
            info.value.close()
    finally:
        srv.stop()


def test_opening_an_ended_big_job_prepares_its_incidents_in_the_background(tmp_path):
    """GET /incidents (the page opening the job) has the server fold toward each incident
    mark and store the keyframes a second apart around it; the exact moments there are then
    answered from them, the same answers a fold gives."""
    from dashboard.diagnosis.incidents import marks as incident_marks
    from tests.helpers.storedjob import keyframe_moments, stored_job

    db = tmp_path / "kf.sqlite"
    job_id, start, end = stored_job(db, 128, 40)
    srv = ServerProcess(f"sqlite:///{db}", log_path=tmp_path / "server.log").start()
    try:
        marks = incident_marks(srv.api(f"/api/jobs/{job_id}/incidents")["incidents"])
        assert marks and all(start + 10 < m < end for m in marks)
        wanted = {m + k for m in marks for k in range(-10, 1)}  # (all inside the job)
        deadline = time.monotonic() + 120
        while not wanted <= set(keyframe_moments(db, job_id)):
            assert time.monotonic() < deadline, sorted(wanted - set(keyframe_moments(db, job_id)))
            time.sleep(0.5)
        path = f"/api/jobs/{job_id}/state?at="
        moments = (marks[0] - 4, marks[-1])
        read = [srv.api(f"{path}{at!r}") for at in moments]
        # Before the hang and as its incident began, compared (both moments read).
        compared = f"/api/jobs/{job_id}/compare?a={marks[0] - 15!r}&b={marks[0] + 2!r}"
        changes = srv.api(compared)
        assert {r["rank"] for r in changes["ranks"]} == set(range(128))  # stuck, or the one
        assert changes["findings"]["appeared"]  # holding them up
    finally:
        srv.stop()
    import sqlite3

    con = sqlite3.connect(db)  # the same moments folded: by a server that has no keyframes
    con.execute("DELETE FROM keyframes")
    con.commit()
    con.close()
    srv = ServerProcess(f"sqlite:///{db}", log_path=tmp_path / "server2.log").start()
    try:
        for at, answer in zip(moments, read):
            assert answer["at"] == at and srv.api(f"{path}{at!r}") == answer
        assert srv.api(compared) == changes
    finally:
        srv.stop()


def test_a_test_server_whose_free_port_was_taken_meanwhile_starts_on_another(tmp_path):
    """tests.helpers.procs: another process can bind the port free_port() found before the
    server does (CI failed two tests so); the helper finds another one."""
    import socket

    srv = ServerProcess(f"sqlite:///{tmp_path / 'pgdash.db'}", log_path=tmp_path / "s.log")
    taken = srv.port
    with socket.socket() as thief:
        thief.bind(("127.0.0.1", taken))
        thief.listen()
        srv.start()
        try:
            assert srv.port != taken and get_json(srv.url + "/api/jobs") is not None
            assert "Address already in use" in (tmp_path / "s.log").read_text()
        finally:
            srv.stop()
