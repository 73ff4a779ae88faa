"""bench/capacity.py --processes 2 runs end to end on a real PostgreSQL and Redis, and reports
every process's figures; it refuses what the servers would refuse, saying what to do.

Short on purpose (a handful of ranks, a few seconds measured: about 30 s with the servers'
start-up). It checks what the bench reports, never how fast anything was.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

from tests.helpers.procs import ROOT
from tests.helpers.realservers import pg_url, postgres_server, redis_url  # noqa: F401  (fixtures)


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.capacity", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_two_processes_report_each_ones_figures(pg_url, redis_url, tmp_path):
    rows_file = tmp_path / "rows.json"
    run = bench("--processes", "2", "--ranks", "6", "--seconds", "4", "--settle", "2",
                "--probe", "1", "--db", pg_url, "--queue", redis_url,
                "--json", str(rows_file), "--keep", str(tmp_path / "keep"))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    [row] = json.loads(rows_file.read_text())
    assert (row["processes"], row["ranks"], row["connected"]) == (2, 6, True)
    per = row["per_process"]
    assert [p["process"] for p in per] == [1, 2]
    # Round robin: ranks 0, 2, 4 on the first process, 1, 3, 5 on the second.
    assert [p["ranks_connected_here"] for p in per] == [3, 3]
    for p in per:
        assert p["acks"] > 0, p  # batches acknowledged through this process
        # Its API showed every rank, also those connected to the other process (a rank it
        # did not show would be an infinite age).
        assert p["fresh_p50"] is not None and math.isfinite(p["fresh_p50"]), p
        assert p["cpu_core"] > 0 and p["rss_mb"] > 0 and p["runq_wait"] >= 0, p
    # One owner diagnoses the job; the other only stores and serves.
    assert sorted(p["owns_job"] for p in per) == [False, True], per
    assert row["findings"] == [], row  # a healthy job raises nothing
    assert row["cpu_core"] == sum(p["cpu_core"] for p in per)
    assert "| 2 | 6 | #1 | 3 |" in run.stdout and "| 2 | 6 | #2 | 3 |" in run.stdout


def test_hosts_relayed_to_two_processes_show_every_rank_on_each(pg_url, redis_url, tmp_path):
    """--wire relay: each host's ranks on one relay connection (pgdash_agent.relay), the hosts
    spread over the processes; each process's API shows all six ranks, none found at fault."""
    rows_file = tmp_path / "rows.json"
    run = bench("--processes", "2", "--ranks", "6", "--wire", "relay", "--per-host", "3",
                "--seconds", "4", "--settle", "2", "--probe", "1", "--db", pg_url, "--queue",
                redis_url, "--json", str(rows_file))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    [row] = json.loads(rows_file.read_text())
    assert (row["server"], row["connected"], row["findings"]) == ("", True, []), row
    # Two hosts of three: the first host's relay on the first process, the second's on the
    # second; every rank fresh on both.
    assert [p["ranks_connected_here"] for p in row["per_process"]] == [3, 3]
    for p in row["per_process"]:
        assert p["acks"] > 0 and math.isfinite(p["fresh_p95"]), p
    assert row["up_bytes_rank_s"] > 0 and row["reconnects"] == 0, row


def test_several_processes_without_a_queue_are_refused_with_what_to_do():
    run = bench("--processes", "1,2", "--ranks", "4",
                "--db", "postgresql+psycopg://pgdash@127.0.0.1:1/none", timeout=60)
    assert run.returncode != 0
    assert "--processes 2 needs --queue redis://" in run.stderr
    assert "leave out --db" in run.stderr
    run = bench("--processes", "2", "--db", "sqlite:///x.db", "--queue", "redis://127.0.0.1:1/0",
                timeout=60)
    assert run.returncode != 0 and "--db must be a PostgreSQL URL" in run.stderr
