"""End to end: real gloo ranks with the agent, a real server, real websockets, real SQLite."""

from __future__ import annotations

import collections
import time

import pytest

from tests.helpers.procs import ServerProcess, job_by_name, launch_job, wait_for, wait_job
from tests.helpers.jobs import expected_counts


@pytest.mark.parametrize("world", [2, 3])
def test_job_shows_ranks_groups_and_exact_counts(server, tmp_path, world):
    name = f"plan-{world}"
    codes = wait_job(launch_job("plan_job.py", world, server.url, name, tmp_path), 120, tmp_path)
    assert codes == [0] * world

    job = wait_for(lambda: (j := job_by_name(server, name)) and j["status"] == "finished" and j,
                   20, "the job to be finished")
    assert job["world_size"] == world and job["backend"] == "gloo"

    detail = server.api(f"/api/jobs/{job['id']}")
    assert [r["rank"] for r in detail["ranks"]] == list(range(world))
    assert {r["status"] for r in detail["ranks"]} == {"exited"}
    assert all(r["host"] and r["pid"] and r["device"] == "cpu" for r in detail["ranks"])
    groups = {g["name"]: g for g in detail["groups"]}
    assert groups["0"]["ranks"] == list(range(world))
    assert groups["0"]["desc"] == "default_pg"
    assert groups["1"]["ranks"] == [0, 1]
    assert set(groups) == {"0", "1"}

    rows = server.api(f"/api/jobs/{job['id']}/collectives")["collectives"]
    got = {(r["group"], r["op"], r["rank"]): r["count"] for r in rows}
    assert got == expected_counts(world)
    for r in rows:
        assert 0 < r["p50_us"] <= r["p99_us"] <= r["max_us"]
    by_key = {(r["group"], r["op"], r["rank"]): r for r in rows}
    assert by_key[("0", "all_reduce", 0)]["bytes"] == 9 * 16  # float32 x 4 elements

    one_rank = server.api(f"/api/jobs/{job['id']}/collectives?rank=1")["collectives"]
    assert {r["rank"] for r in one_rank} == {1} and len(one_rank) == sum(
        1 for k in expected_counts(world) if k[2] == 1)
    assert server.api(f"/api/jobs/{job['id']}/findings") == {"findings": []}


def test_server_killed_and_restarted_mid_job_keeps_counts_exact(tmp_path):
    db = f"sqlite:///{tmp_path / 'pgdash.db'}"
    srv = ServerProcess(db, log_path=tmp_path / "server.log").start()
    steps = 400
    procs = launch_job("loop_job.py", 2, srv.url, "restart", tmp_path,
                       env={"PGDASH_FLUSH_TIMEOUT_S": "30"}, args=[str(steps), "0.02"])
    try:
        # Let some summaries land, then kill the server without warning.
        wait_for(lambda: (j := job_by_name(srv, "restart")) and srv.api(
            f"/api/jobs/{j['id']}/collectives")["collectives"], 60, "first collectives stored")
        before = srv.api(f"/api/jobs/{job_by_name(srv, 'restart')['id']}/collectives")
        srv.kill()
        assert all(p.poll() is None for p in procs), "training must go on without the server"
        time.sleep(1.5)  # the ranks keep training with nobody listening
        srv = ServerProcess(db, port=srv.port, log_path=tmp_path / "server.log").start()
        assert wait_job(procs, 120, tmp_path) == [0, 0]
        job = wait_for(lambda: (j := job_by_name(srv, "restart")) and j["status"] == "finished"
                       and j, 30, "the job to be finished after the restart")
        rows = srv.api(f"/api/jobs/{job['id']}/collectives")["collectives"]
        counts = collections.Counter({(r["group"], r["op"], r["rank"]): r["count"] for r in rows})
        assert counts == {("0", "all_reduce", 0): steps, ("0", "all_reduce", 1): steps,
                          ("0", "barrier", 0): 1, ("0", "barrier", 1): 1}
        assert sum(r["count"] for r in before["collectives"]) < 2 * steps
        assert len(srv.api("/api/jobs")["jobs"]) == 1, "a reconnect must not split the job"
        ranks = srv.api(f"/api/jobs/{job['id']}")["ranks"]
        assert all(not r["dropped"] for r in ranks), ranks
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        srv.stop()
