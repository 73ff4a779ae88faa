"""Trace export of a real gloo job whose last rank comes late, over HTTP and by the CLI,
as Chrome-trace / Perfetto JSON, checked for structure."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tests.helpers.procs import ROOT, ServerProcess, job_by_name, launch_job, wait_for, wait_job
from dashboard.history.trace import JOB_PID
from tests.helpers.trace import names, timeline


LATE_S = 6.0  # how long the last rank sleeps before its 6th all_reduce


HANG_AFTER = 2  # the server's --hang-after: the wait becomes a hang finding


def fetch(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def late_job(tmp_path_factory):
    """(server, job row, time the late rank began to sleep): 2 ranks, rank 1 late by LATE_S."""
    tmp = tmp_path_factory.mktemp("trace")
    srv = ServerProcess(f"sqlite:///{tmp / 'pgdash.db'}", log_path=tmp / "server.log",
                        extra=["--hang-after", str(HANG_AFTER)]).start()
    try:
        procs = launch_job("late_rank_job.py", 2, srv.url, "late", tmp, args=[str(LATE_S)])
        assert wait_job(procs, 120, tmp) == [0, 0]
        late_at = float(re.search(r"LATE (\S+)", (tmp / "late-rank1.log").read_text())[1])
        job = wait_for(lambda: (j := job_by_name(srv, "late")) and j["status"] == "finished"
                       and j, 30, "the job to be finished")
        wait_for(lambda: any(f["kind"] == "hang" and not f["active"] for f in
                             srv.api(f"/api/jobs/{job['id']}/findings")["findings"]),
                 30, "the hang finding, resolved once the late rank arrived")
        yield srv, job, late_at
    finally:
        srv.stop()


def test_a_real_job_becomes_a_trace_with_a_process_per_rank(late_job):
    srv, job, late_at = late_job
    status, trace = fetch(f"{srv.url}/api/jobs/{job['id']}/trace")
    assert status == 200 and trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    for e in events:
        assert {"ph", "pid", "tid", "ts"} <= set(e), e
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
    procs = names(trace)
    host = re.escape(json.loads(json.dumps(srv.api(f"/api/jobs/{job['id']}")))["ranks"][0]
                     ["host"])
    assert re.fullmatch(rf"rank 0 \({host}\)", procs[1]) and \
        re.fullmatch(rf"rank 1 \({host}\)", procs[2])
    sort = {e["pid"]: e["args"]["sort_index"] for e in events
            if e["ph"] == "M" and e["name"] == "process_sort_index"}
    assert sort[1] == 0 and sort[2] == 1
    threads = {(e["pid"], e["args"]["name"]) for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    for pid in (1, 2):
        assert any(p == pid and name.startswith("group 0") for p, name in threads), threads

    # Rank 0 waited in the all_reduce rank 1 entered LATE_S late: the heartbeats caught it.
    waits = [e for e in events if e["ph"] == "X" and e["pid"] == 1 and e["cat"] == "collective"
             and e["dur"] >= (LATE_S - 2.0) * 1e6]
    assert len(waits) == 1, [e for e in events if e["ph"] == "X"]
    wait = waits[0]
    assert wait["name"] == "all_reduce" and wait["args"]["seq"] == 6
    assert abs(wait["ts"] / 1e6 - late_at) < 1.0  # it entered as rank 1 began to sleep
    assert wait["dur"] <= (LATE_S + 2.0) * 1e6
    assert not [e for e in events if e["ph"] == "X" and e["pid"] == 2
                and e["cat"] == "collective" and e["dur"] >= 1e6], "rank 1 never waited long"

    # The hang blames rank 1 (the late one), on its own process and once for the whole job.
    hang = [e for e in events if e["ph"] == "i" and e["cat"] == "finding"
            and e["args"]["kind"] == "hang" and not e["name"].endswith("last seen")]
    assert {(e["pid"], e["s"]) for e in hang} == {(2, "p"), (JOB_PID, "g")}
    assert all(e["args"]["ranks"] == [1] for e in hang)
    assert late_at + HANG_AFTER - 1.0 <= hang[0]["ts"] / 1e6 <= late_at + LATE_S

    # Everything lies within the job's span. A finding's "last seen" is the moment the server
    # last diagnosed it active, which may follow the exits by their time on the way.
    job = srv.api(f"/api/jobs/{job['id']}")
    lo, hi = job["started_at"] * 1e6 - 1, job["ended_at"] * 1e6 + 1
    last_seen = [e for e in timeline(trace) if e["name"].endswith("last seen")]
    assert last_seen and all(lo <= e["ts"] <= hi + 10e6 for e in last_seen)
    outside = [e for e in timeline(trace) if e not in last_seen and (
        not lo <= e["ts"] <= hi or e["ts"] + e.get("dur", 0) > hi + 1)]
    assert not outside, outside
    assert trace["metadata"]["cut"] == {} and trace["metadata"]["job"]["name"] == "late"


def test_the_window_keeps_what_overlaps_it(late_job):
    srv, job, late_at = late_job
    start, end = late_at + 1.0, late_at + 3.0
    status, part = fetch(f"{srv.url}/api/jobs/{job['id']}/trace?start={start}&end={end}")
    assert status == 200
    _, whole = fetch(f"{srv.url}/api/jobs/{job['id']}/trace")
    kept = timeline(part)
    assert kept and len(kept) < len(timeline(whole))
    for e in kept:
        assert e["ts"] <= end * 1e6 + 1 and e["ts"] + e.get("dur", 0) >= start * 1e6 - 1, e
    assert any(e["ph"] == "X" and e["dur"] >= (LATE_S - 2.0) * 1e6 for e in kept), \
        "the long wait overlaps the window, so it stays whole"
    assert not any(e["name"].startswith("init_process_group") for e in kept)
    assert part["metadata"]["window"] == {"start": start, "end": end}


def test_the_cap_thins_cheapest_first_and_says_what_it_dropped(late_job):
    srv, job, _ = late_job
    _, whole = fetch(f"{srv.url}/api/jobs/{job['id']}/trace")
    total = len(timeline(whole))
    cap = sum(e["cat"] in ("finding", "incident") for e in timeline(whole))  # room for those only
    status, capped = fetch(f"{srv.url}/api/jobs/{job['id']}/trace?max_events={cap}")
    assert status == 200
    kept = timeline(capped)
    assert len(kept) == cap < total
    cut = capped["metadata"]["cut"]
    assert sum(c["dropped"] for c in cut.values()) + len(kept) == total
    assert cut["counters"]["dropped"] > 0 and "findings" not in cut
    assert {e["cat"] for e in kept} == {"finding", "incident"}, "findings are the last to go"
    assert names(capped) == names(whole), "process and thread names are always kept"


@pytest.mark.parametrize("query, message", [
    ("start=yesterday", "start must be a time in Unix seconds"),
    ("end=nan", "end must be a time in Unix seconds"),
    ("start=20&end=10", "start (20.0) is after end (10.0)"),
    ("max_events=0", "max_events must be an integer from 1 to"),
    ("max_events=99999999999", "PGDASH_TRACE_MAX_EVENTS"),
])
def test_bad_trace_requests_are_refused_with_the_reason(late_job, query, message):
    srv, job, _ = late_job
    status, body = fetch(f"{srv.url}/api/jobs/{job['id']}/trace?{query}")
    assert status == 400 and message in body["error"], body


def test_an_unknown_job_has_no_trace(late_job):
    srv, _, _ = late_job
    status, body = fetch(f"{srv.url}/api/jobs/9999/trace")
    assert status == 404 and "no job with id 9999" in body["error"]


def test_cli_export_writes_the_same_trace(late_job, tmp_path):
    srv, job, _ = late_job
    out = tmp_path / "trace.json"
    run = subprocess.run([sys.executable, "-m", "dashboard", "export", str(job["id"]), "--trace",
                          "-o", str(out), "--db", srv.db_url], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "ui.perfetto.dev" in run.stdout
    from_cli = json.loads(out.read_text())
    _, from_api = fetch(f"{srv.url}/api/jobs/{job['id']}/trace")

    def shape(trace):
        return sorted((e["ph"], e["name"], e["pid"], e["ts"], e.get("dur", 0))
                      for e in trace["traceEvents"])

    assert shape(from_cli) == shape(from_api)
    capped = subprocess.run([sys.executable, "-m", "dashboard", "export", str(job["id"]),
                             "--trace", "--max-events", "3", "-o", "-", "--db", srv.db_url],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert capped.returncode == 0, capped.stderr
    assert len(timeline(json.loads(capped.stdout))) <= 3
    bad = subprocess.run([sys.executable, "-m", "dashboard", "export", str(job["id"]),
                          "--start", "5", "-o", "-", "--db", srv.db_url],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode != 0 and "go with --trace" in bad.stderr
