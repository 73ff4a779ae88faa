"""Incidents on real gloo jobs: a frozen rank is one incident (a stall, then the hang), told
to a real webhook; a checkpoint pause on a DP x TP mesh says nothing at the default settings;
a slow rank is one straggler incident."""

from __future__ import annotations

import collections
import http.server
import json
import threading
import urllib.request

import pytest

from tests.helpers.procs import ServerProcess, get_body, job_by_name, launch_job, wait_for, wait_job


class _Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        self.server.calls.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hook():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    srv.calls = []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def stop(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def incidents(server, job_id):
    return server.api(f"/api/jobs/{job_id}/incidents")["incidents"]


def test_a_frozen_rank_is_one_incident_a_stall_then_the_hang(tmp_path, hook):
    url = f"http://127.0.0.1:{hook.server_address[1]}/hook"
    # Short thresholds keep the test short; bench/detect.py measures the defaults.
    srv = ServerProcess(f"sqlite:///{tmp_path / 'pgdash.db'}", log_path=tmp_path / "server.log",
                        extra=["--stall-after", "3", "--hang-after", "12",
                               "--notify", url]).start()
    procs = launch_job("fault_job.py", 3, srv.url, "frozen", tmp_path, args=["hang", "30"])
    try:
        job = wait_for(lambda: job_by_name(srv, "frozen"), 60, "the job")
        stalled = wait_for(lambda: [i for i in incidents(srv, job["id"]) if i["active"]], 60,
                           "an incident")
        assert [(i["id"], i["kind"], i["severity"], i["ranks"]) for i in stalled] == [
            ("hang:r2", "stall", "warning", [2])]
        assert "Rank 2" in stalled[0]["summary"] or "rank 2" in stalled[0]["summary"]
        hung = wait_for(lambda: [i for i in incidents(srv, job["id"])
                                 if i["active"] and i["kind"] == "hang"], 40, "the hang")
        assert len([i for i in incidents(srv, job["id"]) if i["active"]]) == 1
        (inc,) = hung
        assert (inc["id"], inc["severity"], inc["ranks"]) == ("hang:r2", "critical", [2])
        kinds = {fid.split(":")[0] for fid in inc["findings"]}
        assert kinds == {"stall", "hang"}, inc["findings"]
        # Replay at this moment: the same incident from the findings active then.
        at = srv.api(f"/api/jobs/{job['id']}/state?at={inc['last_seen']}")
        assert [(i["id"], i["kind"], i["ranks"]) for i in at["incidents"]] == [
            ("hang:r2", "hang", [2])]
        # The job list and /metrics count it; the webhook heard of it twice.
        row = next(j for j in srv.api("/api/jobs")["jobs"] if j["id"] == job["id"])
        assert row["incidents"] == 1
        with urllib.request.urlopen(srv.url + "/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        assert 'pgdash_incidents_active{job="frozen",severity="critical"} 1' in metrics
        calls = wait_for(lambda: hook.calls if len(hook.calls) >= 2 else None, 20,
                         "two notifications")
        assert [(c["event"], c["incident"]["id"]) for c in calls] == [
            ("new", "hang:r2"), ("escalated", "hang:r2")]
        assert calls[0]["text"].startswith("[pgdash] WARNING incident new in frozen")
        assert calls[1]["url"].endswith(f"/jobs/{job['id']}")
    finally:
        stop(procs)
        srv.stop()


def test_a_checkpoint_pause_on_a_mesh_says_nothing_at_the_default_settings(tmp_path):
    srv = ServerProcess(f"sqlite:///{tmp_path / 'pgdash.db'}",
                        log_path=tmp_path / "server.log").start()
    # Rank 0 checkpoints for 5 s while the others wait in a barrier; before, the straggler
    # rule blamed rank 0, and rank 1 (which only waited for rank 0 in its TP group).
    procs = launch_job("fault_job.py", 4, srv.url, "pause", tmp_path,
                       args=["pause", "40", "5", "60"])
    try:
        assert wait_job(procs, 180, tmp_path) == [0, 0, 0, 0]
        job = wait_for(lambda: job_by_name(srv, "pause"), 30, "the job")
        wait_for(lambda: srv.api(f"/api/jobs/{job['id']}")["status"] == "finished", 30,
                 "the job to finish")
        found = srv.api(f"/api/jobs/{job['id']}/findings")["findings"]
        loud = [(f["kind"], f["ranks"], f["summary"]) for f in found
                if f["severity"] in ("warning", "critical")]
        assert loud == []
        assert incidents(srv, job["id"]) == []
    finally:
        stop(procs)
        srv.stop()


def test_a_straggler_is_one_incident_judged_on_half_second_summaries(tmp_path):
    """At the default settings the agents summarise latencies every half second and the
    server names the slow rank (bench/detect.py measures how many steps that takes)."""
    srv = ServerProcess(f"sqlite:///{tmp_path / 'pgdash.db'}",
                        log_path=tmp_path / "server.log").start()
    procs = launch_job("fault_job.py", 3, srv.url, "slow", tmp_path,
                       args=["straggler", "40", "150"])
    try:
        job = wait_for(lambda: job_by_name(srv, "slow"), 60, "the job")
        found = wait_for(lambda: [i for i in incidents(srv, job["id"]) if i["active"]], 60,
                         "an incident")
        assert [(i["id"], i["kind"], i["severity"], i["ranks"]) for i in found] == [
            ("straggler:r2", "straggler", "warning", [2])], found
        assert wait_job(procs, 120, tmp_path) == [0, 0, 0]
        loud = {(i["id"], tuple(i["ranks"])) for i in incidents(srv, job["id"])
                if i["severity"] in ("warning", "critical")}
        assert loud == {("straggler:r2", (2,))}, loud
        wait_for(lambda: srv.api(f"/api/jobs/{job['id']}")["status"] == "finished", 30,
                 "the job to finish")
        # Counted from the export, which reads the packs too: on a slow machine the job can
        # outlast PGDASH_PACK_AFTER_S, and its first minute leaves the events table.
        lines = [json.loads(line) for line in get_body(
            f"{srv.url}/api/jobs/{job['id']}/export", timeout=60).splitlines()]
        rank2 = {ln["session"]["id"] for ln in lines
                 if "session" in ln and ln["session"]["rank"] == 2}
        counts = collections.Counter(ln["event"]["kind"] for ln in lines if "event" in ln
                                     and ln["event"]["session"] in rank2)
        # Two summaries per heartbeat (PGDASH_STATS_INTERVAL_S 0.5, PGDASH_INTERVAL_S 1),
        # less the first and last partial intervals.
        assert counts["heartbeat"] >= 5 and counts["coll_stats"] >= 1.6 * counts["heartbeat"], \
            counts
    finally:
        stop(procs)
        srv.stop()
