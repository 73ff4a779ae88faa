"""The agent never hurts training: bad settings, no server, user errors, overflowing buffers."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from pgdash_agent.config import AgentConfig
from tests.helpers.procs import JOBS, ROOT, ServerProcess, free_port, job_by_name, wait_for


def run_single(steps: int, env: dict[str, str], *args: str, timeout: float = 60):
    import os

    penv = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **env)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(JOBS / "single_rank_job.py"), str(steps), *args],
                          env=penv, capture_output=True, text=True, timeout=timeout)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(l for l in proc.stdout.splitlines() if l.startswith("STATS "))
    return json.loads(line[6:]), proc, elapsed


def test_config_errors_name_the_variable():
    with pytest.raises(ValueError, match="PGDASH_INTERVAL_S must be a float, got 'soon'"):
        AgentConfig.from_env({"PGDASH_INTERVAL_S": "soon"})
    with pytest.raises(ValueError, match="PGDASH_MAX_RECORDS must be positive"):
        AgentConfig.from_env({"PGDASH_MAX_RECORDS": "0"})
    with pytest.raises(ValueError, match="unknown option"):
        AgentConfig.from_env({}, colour="blue")
    assert AgentConfig.from_env({"PGDASH_JOB": "x"}, interval_s=0.5).interval_s == 0.5
    # Latency summaries: every half second by default, never less often than heartbeats.
    assert AgentConfig.from_env({}).stats_interval_s == 0.5
    assert AgentConfig.from_env({"PGDASH_INTERVAL_S": "0.1"}).stats_interval_s == 0.1
    with pytest.raises(ValueError, match="PGDASH_STATS_INTERVAL_S \\(2\\) must be at most "
                                         "PGDASH_INTERVAL_S \\(1\\)"):
        AgentConfig.from_env({"PGDASH_STATS_INTERVAL_S": "2"})


def test_bad_setting_leaves_training_untouched():
    stats, proc, _ = run_single(20, {"PGDASH_INTERVAL_S": "soon"})
    assert stats == {"attached": False, "flushed": True}
    assert "PGDASH_INTERVAL_S must be a float" in proc.stderr
    assert "agent not started (training continues without it)" in proc.stderr


def test_unreachable_server_training_runs_and_keeps_a_bounded_buffer():
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens here
    stats, proc, elapsed = run_single(500, {"PGDASH_SERVER": url, "PGDASH_FLUSH_TIMEOUT_S": "1",
                                            "PGDASH_INTERVAL_S": "0.1",
                                            "PGDASH_RECONNECT_MAX_S": "0.2"})
    assert stats["attached"] and not stats["flushed"] and not stats["connected"]
    # It says so once, however often it tries again, with what to do; and never that it
    # reports anywhere.
    said = [line for line in proc.stderr.splitlines() if "pgdash:" in line]
    assert len(said) == 1, proc.stderr
    assert said[0].startswith(f"pgdash: cannot reach the pgdash server at {url} (")
    for words in ("training continues", "`pgdash serve`", "set PGDASH_SERVER"):
        assert words in said[0]
    assert said[0] == "pgdash: " + stats["last_error"]
    # attach() named the job after the script and the rendezvous address, as every rank would
    assert re.fullmatch(r"single_rank_job\.py \u00b7 127\.0\.0\.1:\d+", stats["job"])
    # hello, init_start, hello, init_done, group(s), the final summary, heartbeat and exit
    assert 5 <= stats["buffered"] <= 12
    assert elapsed < 30


def test_refused_agent_reports_the_servers_reason(tmp_path):
    srv = ServerProcess(f"sqlite:///{tmp_path / 'db.sqlite'}", extra=["--token", "right"]).start()
    try:
        stats, _, elapsed = run_single(5, {"PGDASH_SERVER": srv.url, "PGDASH_TOKEN": "wrong",
                                           "PGDASH_FLUSH_TIMEOUT_S": "120"}, timeout=180)
        assert "wrong or missing token; set PGDASH_TOKEN" in stats["last_error"]
        assert srv.api("/api/jobs") == {"jobs": []}
        # The exit does not wait out the flush timeout for a server that said no.
        assert not stats["flushed"] and elapsed < 90
    finally:
        srv.stop()


def test_user_errors_come_through_unchanged(server):
    stats, proc, _ = run_single(3, {"PGDASH_SERVER": server.url, "PGDASH_JOB": "user-error"},
                                "user-error")
    bare, wrapped = [l for l in proc.stdout.splitlines() if l.startswith("USER-ERROR")]
    assert bare == wrapped and "TypeError" in bare  # exactly what torch alone raises
    # The agent could not read that call, so it passed it through and counted it.
    assert stats["flushed"] and stats["internal_errors"] == 1


def test_every_dropped_collective_is_counted(server):
    steps = 3000
    stats, _, _ = run_single(steps, {"PGDASH_SERVER": server.url, "PGDASH_JOB": "drops",
                                     "PGDASH_MAX_RECORDS": "8"})
    dropped = stats["dropped"].get("collectives", 0)
    assert dropped > 0, "8 records cannot hold 3000 fast all_reduces between two drains"
    job = wait_for(lambda: (j := job_by_name(server, "drops")) and j["status"] == "finished"
                   and j, 20, "job finished")
    rows = server.api(f"/api/jobs/{job['id']}/collectives")["collectives"]
    counted = sum(r["count"] for r in rows if r["op"] == "all_reduce")
    assert counted + dropped == steps
    detail = server.api(f"/api/jobs/{job['id']}")
    assert detail["ranks"][0]["dropped"]["collectives"] == dropped  # reported to the server


