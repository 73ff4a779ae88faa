"""`pgdash demo` as a newcomer runs it: a server, real ranks, the URL, findings printed."""

import subprocess
import sys

from conftest import ROOT


def demo(tmp_path, *args, timeout=180):
    out = subprocess.run([sys.executable, "-m", "dashboard", "demo", "--port", "0", "--db",
                          f"sqlite:///{tmp_path / 'demo.db'}", *args],
                         capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return out.returncode, out.stdout + out.stderr


def test_healthy_demo_shows_a_live_job_and_ends_cleanly(tmp_path):
    code, out = demo(tmp_path, "--ranks", "4", "--steps", "30")
    assert code == 0, out
    assert "live job page: http://127.0.0.1:" in out and "training ended cleanly" in out
    assert "CRITICAL" not in out and "WARNING straggler" not in out


def test_crash_scenario_prints_the_culprit(tmp_path):
    code, out = demo(tmp_path, "--ranks", "3", "--steps", "60", "--scenario", "crash",
                     timeout=240)
    assert code == 1, out
    assert "CRITICAL rank_failed: Rank 1 failed" in out, out
    assert "injected failure on rank 1" in out
    assert "rank_failed: Rank 0" not in out and "rank_failed: Rank 2" not in out
