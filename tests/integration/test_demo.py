"""`pgdash demo` as a newcomer runs it: a server, real ranks, the URL, incidents printed."""

import re
import subprocess
import sys

from tests.helpers.procs import ROOT


def pgdash(tmp_path, *args, timeout=60):
    out = subprocess.run([sys.executable, "-m", "dashboard", *args],
                         capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return out.returncode, out.stdout + out.stderr


def demo(tmp_path, *args, timeout=180):
    return pgdash(tmp_path, "demo", "--port", "0", "--db", f"sqlite:///{tmp_path / 'demo.db'}",
                  *args, timeout=timeout)


def test_healthy_demo_shows_a_live_job_and_ends_cleanly(tmp_path):
    code, out = demo(tmp_path, "--ranks", "4", "--steps", "30")
    assert code == 0, out
    assert "live job page: http://127.0.0.1:" in out and "training ended cleanly" in out
    assert "CRITICAL" not in out and "WARNING" not in out, out


def test_crash_scenario_prints_the_culprit(tmp_path):
    code, out = demo(tmp_path, "--ranks", "3", "--steps", "60", "--scenario", "crash",
                     timeout=240)
    assert code == 1, out
    # One incident, as the page leads with it: severity, class (root-cause kind), blamed
    # rank, summary, next step, how many findings are its evidence.
    told = [line for line in out.splitlines() if line.startswith("pgdash demo: CRITICAL")]
    assert len(told) == 1, out
    assert told[0].startswith("pgdash demo: CRITICAL crash (rank_failed) on rank 1: Rank 1 "
                              "failed"), out
    assert "injected failure on rank 1" in told[0]
    assert re.search(r" Next step: .+ \[\d+ findings?\]$", told[0]), told[0]
    assert "on rank 0" not in out and "on rank 2" not in out and "WARNING" not in out

    # After the job: export it, replay the file, import it elsewhere, replay that.
    code, out = pgdash(tmp_path, "export", "1", "-o", "crash.jsonl", "--db",
                       f"sqlite:///{tmp_path / 'demo.db'}")
    assert code == 0 and "wrote job 1 to crash.jsonl" in out, out
    code, replayed = pgdash(tmp_path, "replay", "crash.jsonl", "--hang-after", "10")
    assert code == 0, replayed
    assert "CRITICAL rank_failed: Rank 1 failed" in replayed, replayed
    assert "job failed with 3 rank(s)" in replayed
    other = f"sqlite:///{tmp_path / 'other.db'}"
    code, out = pgdash(tmp_path, "import", "crash.jsonl", "--db", other)
    assert code == 0 and "as job 1" in out, out
    code, again = pgdash(tmp_path, "replay", "1", "--hang-after", "10", "--db", other)
    assert code == 0 and again.splitlines()[1:] == replayed.splitlines()[1:], again


def test_a_stop_while_the_ranks_start_waits_until_each_started_rank_is_known():
    """Ctrl-C during launch_ranks must not cut a Popen between its fork and its return (that
    rank ran on, orphaned, unknown to stop_ranks): it is raised once the block ends."""
    import os
    import signal

    import pytest

    from dashboard.demo.run import _deferred_interrupts

    reached = []
    handler = signal.getsignal(signal.SIGINT)  # pytest-xdist's worker has its own
    with pytest.raises(KeyboardInterrupt):
        with _deferred_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            reached.append("after the signal")
    assert reached == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is handler  # put back as it was
