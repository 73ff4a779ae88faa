"""A crash's traceback and a stuck rank's stack as evidence: the user's frames only (pgdash_agent.frames),
bounded, the training code's line named first; real gloo jobs under ``python -m pgdash_agent`` and
with ``attach()``."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pgdash_agent import frames
from tests.helpers.procs import JOBS, ROOT, free_port, job_by_name, stored_events, wait_for

AGENT_FILE = os.path.join(frames.AGENT_DIR, "collectives.py")  # a frame "of the agent"


def _agent_wrapper():
    """A function whose code says it is the agent's, as the collective wrappers are."""
    scope: dict = {}
    exec(compile("def wrapper(fn):\n    return fn()\n", AGENT_FILE, "exec"), scope)
    return scope["wrapper"]


def divide(n):
    return 1 / n


def user_step():
    return _agent_wrapper()(lambda: divide(0))


def test_a_traceback_keeps_the_users_frames_and_ends_at_the_raising_line():
    try:
        user_step()
    except ZeroDivisionError as exc:
        got, omitted = frames.traceback_frames(exc.__traceback__)
    assert omitted == 0
    assert [f["function"] for f in got] == [
        "test_a_traceback_keeps_the_users_frames_and_ends_at_the_raising_line", "user_step",
        "<lambda>", "divide"]
    assert all(not f["file"].startswith(frames.AGENT_DIR) for f in got)
    assert got[-1]["code"] == "return 1 / n" and got[-1]["file"] == __file__
    assert not any(f.get("library") for f in got)


def test_a_deep_traceback_is_bounded_and_says_how_much_was_left_out():
    def down(n):
        return down(n - 1) if n else 1 / 0

    try:
        down(100)
    except ZeroDivisionError as exc:
        got, omitted = frames.traceback_frames(exc.__traceback__)
    assert len(got) == frames.MAX_FRAMES and omitted == 102 - frames.MAX_FRAMES
    assert got[0]["function"] == "test_a_deep_traceback_is_bounded_and_says_how_much_was_left_out"
    assert got[-1]["code"] == "return down(n - 1) if n else 1 / 0"


def test_a_library_frame_is_marked_and_a_stack_hides_the_agent():
    import json

    try:
        json.loads("{")
    except ValueError as exc:
        got, _ = frames.traceback_frames(exc.__traceback__)
    assert got[0]["file"] == __file__ and "library" not in got[0]
    assert got[-1]["library"] is True and got[-1]["file"].endswith("decoder.py")
    seen = {}
    ready, done = threading.Event(), threading.Event()

    def park():
        ready.set()
        done.wait(10)

    thread = threading.Thread(target=lambda: _agent_wrapper()(park))
    thread.start()
    ready.wait(10)
    seen["stack"] = frames.format_stack(sys._current_frames()[thread.ident])
    done.set()
    thread.join()
    assert "in park" in seen["stack"] and frames.AGENT_DIR not in seen["stack"]


def _launch(tmp_path: Path, server_url: str, job: str, script: list[str], extra=None):
    """A real 2-rank gloo job, each rank ``python *script`` with torchrun's variables."""
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, PGDASH_SERVER=server_url,
                   PGDASH_JOB=job, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT),
                   PGDASH_FLUSH_TIMEOUT_S="30", **(extra or {}))
        with open(tmp_path / f"{job}-rank{rank}.log", "wb") as out:
            procs.append(subprocess.Popen([sys.executable, *script], env=env, stdout=out,
                                          stderr=subprocess.STDOUT, cwd=ROOT))
    return procs


def _stop(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


@pytest.mark.parametrize("how", ["python -m pgdash_agent", "attach"])
def test_a_plain_python_bug_on_rank_1_names_its_line_with_the_users_traceback(
        server, tmp_path, how):
    script = JOBS / "bug_job.py"
    line = next(i for i, text in enumerate(script.read_text().splitlines(), 1)
                if "return total / count" in text)
    job = f"bug-{how.split()[-1]}"
    procs = _launch(tmp_path, server.url, job,
                    ["-m", "pgdash_agent", str(script)] if how != "attach" else [str(script)],
                    {"BUG_JOB_ATTACH": "1"} if how == "attach" else None)
    try:
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        _stop(procs)
    assert codes[1] == 1, (tmp_path / f"{job}-rank1.log").read_text()[-3000:]
    def critical():
        j = job_by_name(server, job)
        return j and [f for f in server.api(f"/api/jobs/{j['id']}/findings")["findings"]
                      if f["severity"] == "critical"]

    wait_for(critical, 60, "the crash's finding")
    # Rank 0's error (the crash's consequence) may be folded after the finding first shows;
    # the finding then names it among its victims.
    found = wait_for(lambda: (c := critical()) and "0" in c[0]["evidence"]["victims"] and c,
                     30, "rank 0's error among the crash's victims")
    (f,) = found
    assert (f["kind"], f["ranks"]) == ("rank_failed", [1])
    at = f"bug_job.py:{line} in average()"
    assert f["summary"].startswith(f"Rank 1 failed (pid ") and \
        f"ZeroDivisionError at {at}: float division by zero." in f["summary"]
    assert f["evidence"]["at"] == at and list(f["evidence"])[0] == "at"
    assert f"{script}:{line} in average() (`return total / count`)" in f["hint"]
    assert "no rule" not in f["hint"] and "TORCH_DISTRIBUTED_DEBUG" not in f["hint"]
    tb = f["evidence"]["traceback"]
    assert (tb[-1]["file"], tb[-1]["line"], tb[-1]["function"]) == (str(script), line,
                                                                    "average")
    assert [fr["function"] for fr in tb] == ["<module>", "main", "step", "average"]
    assert not any(fr["file"].startswith(frames.AGENT_DIR) or "runpy" in fr["file"]
                   for fr in tb)


def test_an_error_raised_from_a_full_disk_is_named_by_the_disk_not_as_a_code_bug(
        server, tmp_path):
    """The training code wraps the OSError in its own RuntimeError: the agent sends the chain,
    and the exception it was raised from names the cause."""
    job = "bug-disk"
    procs = _launch(tmp_path, server.url, job, ["-m", "pgdash_agent", str(JOBS / "bug_job.py")],
                    {"BUG_JOB_DISK": "1"})
    try:
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        _stop(procs)
    assert codes[1] == 1, (tmp_path / f"{job}-rank1.log").read_text()[-3000:]

    def crash():
        j = job_by_name(server, job)
        return j and [f for f in server.api(f"/api/jobs/{j['id']}/findings")["findings"]
                      if f["kind"] == "rank_failed" and f["ranks"] == [1]]

    (f,) = wait_for(crash, 60, "the crash's finding")
    assert f["evidence"]["cause"] == "disk_full"
    assert f["evidence"]["error"] == "could not save the checkpoint of step 3"
    assert f["evidence"]["causes"] == [{"error_type": "OSError",
                                        "error": "[Errno 28] No space left on device"}]
    assert ("the disk (or the quota) is full (RuntimeError raised from OSError: [Errno 28] No "
            "space left on device)") in f["summary"]
    assert "df -h" in f["hint"] and "bug in the training code" not in f["hint"]


def test_a_stuck_ranks_stack_has_no_pgdash_frames(server, tmp_path):
    procs = _launch(tmp_path, server.url, "stuck",
                    ["-m", "pgdash_agent", str(JOBS / "fault_job.py"), "hang"])
    try:
        stack = wait_for(lambda: next((e["body"]["stack"] for e in stored_events(server.db_url)
                                       if e["kind"] == "stack"), None), 90, "a stack")
    finally:
        _stop(procs)
    assert "fault_job.py" in stack and "dist.all_reduce(t)" in stack
    assert frames.AGENT_DIR not in stack and "runpy" not in stack, stack
