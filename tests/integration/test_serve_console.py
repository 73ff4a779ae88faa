"""What `pgdash serve` prints on its console: one line per incident event, and one line per
refused agent followed by counts (not a line per retry)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.helpers.procs import ROOT, ServerProcess, get_body, launch_job, wait_for, wait_job
from dashboard.console import RefusalLog, agent_identity, incident_line

TOKEN = "console-test-token-0123456789"
REPORT_S = 2.0  # PGDASH_REFUSAL_REPORT_S of the test server: counts come quickly


# -- pure: the lines -------------------------------------------------------------------------

class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def auth(session="s1", **over):
    return {"v": 1, "session": session, "job": "train", "rank": 3, "host": "node7", "pid": 42,
            "token": "secret-guess", **over}


WRONG = "pgdash refused the agent: wrong or missing token; set PGDASH_TOKEN on the hosts"


def test_a_refused_agent_is_told_once_then_counted_at_most_once_per_period():
    clock, lines = Clock(), []
    refusals = RefusalLog(every_s=60, emit=lines.append, clock=clock, wall=lambda: 0.0)
    for _ in range(9):  # an agent retrying every 2 s
        refusals.refused(auth(), "10.0.0.7", WRONG)
        clock.now += 2
    assert len(lines) == 1, lines
    assert "refused the agent of rank 3 of job 'train' (host node7, pid 42, from 10.0.0.7): " \
           "wrong or missing token; set PGDASH_TOKEN on the hosts" in lines[0]
    assert "secret-guess" not in lines[0]  # the token offered is never echoed
    refusals.tick()
    assert len(lines) == 1  # nothing due before the period is over
    clock.now = 1000 + 60
    refusals.tick()
    assert len(lines) == 2 and "refused the agent of rank 3" in lines[1]
    assert "8 times more (the last one 44 s ago)" in lines[1], lines[1]
    refusals.tick()
    assert len(lines) == 2  # each refusal is counted once
    clock.now += 61
    refusals.tick()  # quiet for a period: forgotten, so a later refusal is a new first line
    refusals.refused(auth(), "10.0.0.7", WRONG)
    assert len(lines) == 3 and "further refusals of it are counted" in lines[2]


def test_refusals_are_per_agent_session_and_a_new_reason_is_told_once():
    clock, lines = Clock(), []
    refusals = RefusalLog(every_s=60, emit=lines.append, clock=clock, wall=lambda: 0.0)
    refusals.refused(auth("a"), None, WRONG)
    refusals.refused(auth("b", rank=4), None, WRONG)
    assert len(lines) == 2 and "rank 4" in lines[1]
    locked = ("pgdash refused the agent: too many failed token attempts from 10.0.0.7: at "
              "most 30 per 300 s; try again in {} s")
    refusals.refused(auth("a"), None, locked.format(41))
    assert len(lines) == 3 and "1 time more" in lines[2] and "now: too many" in lines[2]
    for wait in (40, 39, 38):  # the same reason with another number: counted, not told
        refusals.refused(auth("a"), None, locked.format(wait))
    assert len(lines) == 3
    refusals.close()  # the server stops: what is pending is told
    assert len(lines) == 4 and "3 times more" in lines[3]


def test_refused_agents_remembered_are_bounded():
    lines = []
    refusals = RefusalLog(every_s=60, max_agents=2, emit=lines.append, clock=Clock())
    for session in ("a", "b", "c"):
        refusals.refused(auth(session), None, WRONG)
    refusals.refused(auth("a"), None, WRONG)  # forgotten: told again
    assert len(lines) == 4 and refusals.counters["forgotten"] == 2


def test_a_malformed_hello_is_named_by_what_can_be_read_of_it():
    assert agent_identity("garbage", "10.0.0.1") == "an agent (from 10.0.0.1)"
    assert agent_identity({"rank": "x", "job": 5, "pid": True}, None) == "an agent"
    assert agent_identity({"rank": 0, "job": "j"}, None) == "the agent of rank 0 of job 'j'"


@pytest.mark.parametrize("ranks, fault", [([1], ", at fault: rank 1: "),
                                          ([0, 2], ", at fault: ranks 0, 2: "),
                                          ([], ": ")])
def test_incident_line_has_time_job_severity_summary_and_ranks_at_fault(ranks, fault):
    incident = {"id": "crash:1", "kind": "rank_failed", "severity": "critical", "ranks": ranks,
                "summary": "Rank 1 failed: RuntimeError: boom.", "hint": "Read its traceback."}
    job = {"id": 7, "name": "train-2026"}
    opened = incident_line("new", job, incident, 0.0)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d pgdash: job train-2026 \(id 7\): "
                        r"incident opened: CRITICAL crash \(rank_failed\)"
                        + re.escape(fault) + r"Rank 1 failed: RuntimeError: boom\. "
                        r"Next step: Read its traceback\.", opened), opened
    resolved = incident_line("resolved", job, incident, 0.0)
    assert "incident resolved: CRITICAL crash (rank_failed)" in resolved
    assert "Next step" not in resolved
    assert "incident now critical" in incident_line("escalated", job, incident, 0.0)


def test_a_multi_line_error_or_name_stays_one_console_line():
    incident = {"id": "crash:1", "kind": "rank_failed", "severity": "critical", "ranks": [1],
                "summary": "Rank 1 failed: ValueError: bad\n  shape\n", "hint": "Look."}
    line = incident_line("new", {"id": 1, "name": "a\nb"}, incident, 0.0)
    assert "\n" not in line and "job a b (id 1)" in line
    assert line.endswith("ValueError: bad shape Next step: Look.")
    lines = []
    RefusalLog(emit=lines.append, clock=Clock()).refused(auth(host="x\ny"), None, WRONG)
    assert len(lines) == 1 and "\n" not in lines[0] and "host x y" in lines[0]


# -- a real server, real ranks ---------------------------------------------------------------

@pytest.fixture(scope="module")
def console_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console")
    # No guessing limit: the wrong-token agent must not lock 127.0.0.1 out for the job.
    srv = ServerProcess(f"sqlite:///{tmp / 'pgdash.db'}", log_path=tmp / "server.log",
                        extra=["--token", TOKEN, "--hang-after", "30"],
                        env={"PGDASH_REFUSAL_REPORT_S": str(REPORT_S),
                             "PGDASH_LOGIN_MAX_FAILURES": "0"}).start()
    yield srv, tmp
    srv.stop()


def log_lines(tmp) -> list[str]:
    return (tmp / "server.log").read_text(errors="replace").splitlines()


def test_serve_logs_the_crash_incident_once_naming_the_crashing_rank(console_server):
    srv, tmp = console_server
    job = "console-crash"
    procs = launch_job("fault_job.py", 2, srv.url, job, tmp, args=["crash"],
                       env={"PGDASH_TOKEN": TOKEN})
    wait_job(procs, 120, tmp)

    def opened():
        return [line for line in log_lines(tmp)
                if f"pgdash: job {job} " in line and "incident opened" in line]

    wait_for(opened, 30, "the incident's line on the server's console")
    lines = opened()
    assert len(lines) == 1, "\n".join(log_lines(tmp))
    assert re.search(r"incident opened: CRITICAL crash \(rank_failed\), at fault: rank 1: "
                     r"Rank 1 failed", lines[0]), lines[0]
    assert "Traceback" not in (tmp / "server.log").read_text()


def test_a_wrong_token_agent_retrying_gives_one_line_and_counts(console_server):
    srv, tmp = console_server
    script = ("import time\nfrom agent import attach, detach\nattach()\ntime.sleep(8)\n"
              "detach()\nprint('training went on')\n")
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "PGDASH_SERVER": srv.url,
             "PGDASH_TOKEN": "not-the-token-at-all", "PGDASH_JOB": "wrong-token",
             "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "PGDASH_RECONNECT_MAX_S": "0.5",
             "PGDASH_FLUSH_TIMEOUT_S": "1"})
    assert done.returncode == 0 and "training went on" in done.stdout, done.stderr
    metrics = get_body(srv.url + "/metrics", token=TOKEN).decode()
    refused = int(float(re.search(r'pgdash_ingest_refused_total\{what="connection"\} (\S+)',
                                  metrics).group(1)))
    assert refused >= 5, "the agent should have retried several times"

    def mine():
        return [line for line in log_lines(tmp) if "of job 'wrong-token'" in line]

    def counted():
        lines = mine()
        return 1 + sum(int(m.group(1)) for line in lines
                       if (m := re.search(r" (\d+) times? more ", line))) == refused and lines

    lines = wait_for(counted, 4 * REPORT_S + 10, "the count of further refusals")
    firsts = [line for line in lines if "wrong or missing token" in line]
    assert len(firsts) == 1, "\n".join(lines)
    assert "rank 0 of job 'wrong-token'" in firsts[0]
    assert len(lines) - 1 <= 8 / REPORT_S + 2, "\n".join(lines)  # not one line per attempt
    assert "not-the-token-at-all" not in (tmp / "server.log").read_text()
