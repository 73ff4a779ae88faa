"""Snapshots on real gloo jobs: what the blamed rank is doing, on its incident and on demand,
over either protocol, and bad requests refused without changing anything."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pgdash_agent import board

from dashboard.ingest.asks import MIN_INTERVAL_S
from tests.helpers.procs import (ROOT, ServerProcess, get_body, job_by_name, launch_job,
                                 wait_for)

TOKEN = "snap-token-0123456789"
SLEEP_LINE = "time.sleep(3600)"  # where tests/jobs/fault_job.py's "hang" rank sleeps
SLEEP_LINE_NO = next(n for n, line in enumerate(
    (ROOT / "tests/jobs/fault_job.py").read_text().splitlines(), 1) if SLEEP_LINE in line)


def _server(tmp_path, hang_after, *extra):
    return ServerProcess(f"sqlite:///{tmp_path / 'pgdash.db'}", log_path=tmp_path / "server.log",
                         extra=["--hang-after", str(hang_after), *extra]).start()


def _stop(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def _post(server, path, body, token=TOKEN):
    data = json.dumps(body).encode() if not isinstance(body, bytes) else body
    req = urllib.request.Request(server.url + path, data=data, method="POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {token}"}
                                             if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:  # the error is the response: closed, as resp above
            return exc.code, json.loads(exc.read() or b"{}")


PY_SPY = str(Path(sys.executable).with_name("py-spy"))  # the test extra installs it


def _hung_job(server, tmp_path, name, wire="v2", token=None, py_spy=PY_SPY):
    env = {"PGDASH_WIRE": wire, "PGDASH_PY_SPY": py_spy,
           **({"PGDASH_TOKEN": token} if token else {})}
    procs = launch_job("fault_job.py", 2, server.url, name, tmp_path, args=["hang"], env=env)
    job = wait_for(lambda: job_by_name(server, name), 60, f"job {name}")
    return job["id"], procs


def test_an_incident_carries_the_culprits_stack_at_the_line_it_is_frozen_in(tmp_path):
    server = _server(tmp_path, 3)
    job_id, procs = _hung_job(server, tmp_path, "frozen")
    try:
        incident = wait_for(lambda: next((i for i in server.api(
            f"/api/jobs/{job_id}/incidents")["incidents"] if i["kind"] == "hang"), None),
            60, "the hang's incident")
        assert incident["ranks"] == [1]
        request = wait_for(lambda: next((r for r in server.api(
            f"/api/jobs/{job_id}/snapshots")["snapshots"]
            if r["reason"] == f"incident {incident['id']}"), None), 30,
            "the snapshot asked with the incident")
        assert request["asked"] == [0, 1]  # the blamed rank and its victim
        view = wait_for(lambda: (v := server.api(
            f"/api/jobs/{job_id}/snapshots/{request['id']}?detail=1"))["complete"] and v, 30,
            "both ranks' answers")
        culprit = view["ranks"]["1"]
        assert culprit["status"] == "answered"
        training = culprit["threads"][0]
        assert training["training"] and SLEEP_LINE in training["stack"]
        # Grouped: two different stacks, one rank each; the culprit's says where it stands.
        assert [g["ranks"] for g in view["groups"]] == [[0], [1]]
        assert view["groups"][1]["where"]["code"] == SLEEP_LINE
        # The incident itself shows the culprit's training-thread stack.
        shown = wait_for(lambda: next((i for i in server.api(
            f"/api/jobs/{job_id}/incidents")["incidents"]
            if i["id"] == incident["id"] and i.get("snapshot")), None), 30,
            "the incident's snapshot")
        assert shown["snapshot"]["rank"] == 1 and SLEEP_LINE in shown["snapshot"]["stack"]
    finally:
        _stop(procs)
        server.stop()


@pytest.mark.parametrize("wire", ["v1", "v2"])
def test_a_snapshot_on_demand_and_bad_requests_change_nothing(tmp_path, wire):
    # No incident meanwhile (its own snapshot would make the first request below too soon).
    server = _server(tmp_path, 600, "--token", TOKEN)
    # py-spy where v2 runs; none where v1 runs (the answer says so)
    job_id, procs = _hung_job(server, tmp_path, f"asked-{wire}", wire, TOKEN,
                              PY_SPY if wire == "v2" else str(tmp_path / "no-py-spy"))
    path = f"/api/jobs/{job_id}/snapshots"
    try:
        log = tmp_path / f"asked-{wire}-rank1.log"
        wait_for(lambda: log.exists() and "FAULT" in log.read_text(), 60, "rank 1 asleep")
        for body, status, said in (
                ({"ranks": [0, 7]}, 400, "has no rank 7"),
                ({"ranks": "some"}, 400, "the body must be JSON"),
                (b"\xff not json", 400, "the body must be JSON"),
                ({"ranks": [True]}, 400, "the body must be JSON"),
                ({"ranks": list(range(5000))}, 400, "the body must be JSON"),
                ({"ranks": [0], "native": "yes"}, 400, '"native" must be true or false')):
            got, answer = _post(server, path, body)
            assert (got, said in answer.get("error", "")) == (status, True), (body, answer)
        assert _post(server, path, {"ranks": [0]}, token="wrong")[0] == 401
        assert _post(server, "/api/jobs/999/snapshots", {"ranks": "all"})[0] == 404
        assert server.api(path)["snapshots"] == []  # nothing was asked by any of those
        status, made = _post(server, path, {"ranks": "all"})
        assert status == 202 and made["asked"] == [0, 1], made
        assert _post(server, path, {"ranks": [0, 1]})[0] == 429  # a flood waits its turn
        view = wait_for(lambda: (v := server.api(made["url"] + "?detail=all"))["complete"]
                        and v, 30, "the answers")
        # Where each rank stands in the world group: rank 0 waits inside the collective
        # that rank 1 (asleep) never entered.
        waiting, asleep = view["wavefront"]["0"]  # one rank each: by rank
        assert (waiting["ranks"], waiting["inflight_op"]) == ([0], "all_reduce")
        assert (asleep["ranks"], asleep["inflight_op"]) == ([1], None)
        assert asleep["entered"] == waiting["entered"] - 1
        assert {r: row["status"] for r, row in view["ranks"].items()} == \
            {"0": "answered", "1": "answered"}
        assert SLEEP_LINE in view["ranks"]["1"]["threads"][0]["stack"]
        assert "all_reduce" in view["ranks"]["0"]["threads"][0]["stack"]
        groups = view["ranks"]["0"]["groups"]
        assert groups and groups[0]["inflight_op"] == "all_reduce"
        # The collectives it completed before, with their times (the job's busy steps).
        recent = view["ranks"]["1"]["recent"]
        assert len(recent) >= 5 and {c["op"] for c in recent} == {"all_reduce"}
        assert all(c["start"] <= c["end"] <= view["ranks"]["1"]["t"] for c in recent)
        # Numbered as the Flight Recorder numbers them: one after the other, up to the last
        # rank 1 completed; all issued from Python (the wrappers timed them).
        seqs = [c["seq"] for c in recent]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and \
            seqs[-1] == asleep["completed"], (seqs, asleep)
        assert {c["source"] for c in recent} == {"wrapper"}
        # The same from the command line, by the job's name (after the rate limit's second).
        time.sleep(MIN_INTERVAL_S)
        done = subprocess.run([sys.executable, "-m", "dashboard", "snapshot", f"asked-{wire}",
                               "--ranks", "1", "--server", server.url, "--token", TOKEN],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        assert "1 of 1 ranks answered" in done.stdout and SLEEP_LINE in done.stdout
        assert f"rank 1: MainThread at fault_job.py:{SLEEP_LINE_NO} in <module>" in done.stdout
        # Native frames, asked for: py-spy's where it is installed, else why there are none.
        time.sleep(MIN_INTERVAL_S)
        done = subprocess.run([sys.executable, "-m", "dashboard", "snapshot", f"asked-{wire}",
                               "--ranks", "1", "--native", "--server", server.url,
                               "--token", TOKEN],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        if wire == "v2":
            assert "native frames of rank 1, innermost first:" in done.stdout, done.stdout
            native = done.stdout.split("native frames of rank 1, innermost first:")[1]
            assert "time_sleep" in native and "fault_job.py" in native, native
        else:
            assert "(rank 1: no native frames: py-spy is not installed" in done.stdout
        done = subprocess.run([sys.executable, "-m", "dashboard", "snapshot", "nope",
                               "--server", server.url, "--token", TOKEN],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert done.returncode == 2 and "has no job named 'nope'" in done.stderr
    finally:
        _stop(procs)
        server.stop()


def test_a_rank_blocked_in_c_with_the_gil_held_is_read_from_outside_by_its_hosts_peer(tmp_path):
    """Its agent cannot answer (no thread of its interpreter runs); the server has rank 0's
    agent, on the same host, read it with py-spy: the page shows where it is blocked."""
    server = _server(tmp_path, 600)
    procs = launch_job("fault_job.py", 2, server.url, "gil", tmp_path, args=["gil"],
                       env={"PGDASH_PY_SPY": PY_SPY})
    try:
        job = wait_for(lambda: job_by_name(server, "gil"), 60, "job gil")
        wait_for(lambda: "FAULT" in (tmp_path / "gil-rank1.log").read_text(), 60,
                 "rank 1 blocked")
        time.sleep(1.0)  # rank 1's agent has stopped with it
        status, made = _post(server, f"/api/jobs/{job['id']}/snapshots", {"ranks": "all"})
        assert status == 202, made
        view = wait_for(lambda: (v := server.api(made["url"]))["ranks"]["1"].get(
            "read_from_outside", {}).get("t") and v, 45, "rank 1 read by rank 0")
        assert view["ranks"]["0"]["status"] == "answered"
        assert view["ranks"]["1"]["status"] in ("waiting", "no answer")
        outside = view["ranks"]["1"]["read_from_outside"]
        assert outside["by"] == 0 and outside["gil_held_by"] == "MainThread", outside
        assert "fault_job.py" in outside["dump"] and "match" in outside["dump"], outside["dump"]
    finally:
        _stop(procs)
        server.stop()


def _read_by_host_reader(server, tmp_path, job_name: str, env: dict,
                         procs: list) -> tuple[dict, dict]:
    """A 2-rank job whose ranks both block with the GIL held (its processes added to
    ``procs``), snapshotted once they have: (its job, the snapshot's view), each rank read by
    the host reader."""
    procs += launch_job("fault_job.py", 2, server.url, job_name, tmp_path, args=["gil-all"],
                       env={"PGDASH_PY_SPY": PY_SPY, **env})
    job = wait_for(lambda: job_by_name(server, job_name), 60, f"job {job_name}")
    for rank in (0, 1):
        wait_for(lambda: "FAULT" in (tmp_path / f"{job_name}-rank{rank}.log").read_text(), 60,
                 f"rank {rank} blocked")
    time.sleep(1.0)  # their agents have stopped with them
    status, made = _post(server, f"/api/jobs/{job['id']}/snapshots", {"ranks": "all"})
    assert status == 202, made
    view = wait_for(lambda: all((v := server.api(made["url"]))["ranks"][r].get(
        "read_from_outside", {}).get("t") for r in ("0", "1")) and v, 60,
        "both ranks read by the host reader")
    for r in ("0", "1"):
        assert view["ranks"][r]["status"] in ("waiting", "no answer")
        outside = view["ranks"][r]["read_from_outside"]
        assert outside["host_reader"] is True, outside
        assert outside["gil_held_by"] == "MainThread", outside
        assert "fault_job.py" in outside["dump"] and "match" in outside["dump"], outside
    assert view["ranks"]["0"]["read_from_outside"]["reader_pid"] not in (p.pid for p in procs)
    return job, view


def test_a_host_whose_every_rank_is_blocked_with_the_gil_held_is_read_by_its_host_reader(
        tmp_path):
    """No agent of the host can answer or read another; the process rank 0's agent started
    (pgdash_agent.reader: LOCAL_RANK 0, py-spy installed) reads both, and the page names it."""
    server = _server(tmp_path, 600)
    procs = []
    try:
        job, view = _read_by_host_reader(server, tmp_path, "gilall", {}, procs)
        assert {view["ranks"][r]["read_from_outside"]["by"] for r in ("0", "1")} == {0}
        pid = view["ranks"]["0"]["read_from_outside"]["reader_pid"]
        # A server restarted meanwhile: the blocked ranks cannot connect again, their reader
        # does, and is asked though no rank of the job is connected.
        server.stop()
        server = ServerProcess(server.db_url, port=server.port, log_path=tmp_path / "again.log",
                               extra=["--hang-after", "600"]).start()
        wait_for(lambda: "pgdash_host_readers 1.0" in get_body(
            server.url + "/metrics", timeout=10).decode(), 60, "the reader back")
        status, made = _post(server, f"/api/jobs/{job['id']}/snapshots", {"ranks": "all"})
        assert status == 202, made
        assert sorted(made.get("not_connected", [])) == [0, 1], made
        again = wait_for(lambda: all((v := server.api(made["url"]))["ranks"][r].get(
            "read_from_outside", {}).get("t") for r in ("0", "1")) and v, 60,
            "both ranks read by the host reader after the restart")
        assert again["ranks"]["1"]["read_from_outside"]["reader_pid"] == pid
        assert "match" in again["ranks"]["1"]["read_from_outside"]["dump"]
    finally:
        _stop(procs)
        server.stop()
    _gone(pid)


def test_ranks_started_without_local_rank_have_a_host_reader_too(tmp_path):
    """As mp.spawn starts them: no LOCAL_RANK says which rank is first on the host, so the
    first of the job's ranks to claim it starts the reader (pgdash_agent.reader.claim), one
    for the host, whichever rank that is."""
    server = _server(tmp_path, 600)
    procs = []
    try:
        # (TMPDIR: the claim's file, which the killed ranks leave behind, stays the test's)
        _, view = _read_by_host_reader(server, tmp_path, "gilspawn",
                                       {"LOCAL_RANK": None, "TMPDIR": str(tmp_path)}, procs)
        outside = [view["ranks"][r]["read_from_outside"] for r in ("0", "1")]
        assert len({o["by"] for o in outside}) == 1 and outside[0]["by"] in (0, 1), outside
        pid = outside[0]["reader_pid"]
        assert outside[1]["reader_pid"] == pid  # one reader for the host ...
        assert "pgdash_host_readers 1.0" in get_body(  # ... and only one
            server.url + "/metrics", timeout=10).decode()
    finally:
        _stop(procs)
        server.stop()
    _gone(pid)


def _gone(pid: int) -> None:
    """The reader follows the rank that started it."""
    wait_for(lambda: not board.how_ended(pid)[0], 10, "the reader gone")
