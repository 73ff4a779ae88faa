"""A job whose every rank stopped issuing collectives, none inside one (rules.idle): the
stall and the hang no wait in a collective shows. Real jobs of it:
bench/corpus/all_ranks_stuck_shared_lock.py and store_wait_rank0_hangs.py
(tests/integration/test_corpus.py)."""

from dashboard.diagnosis import Settings, diagnose
from tests.helpers.events import kinds, running

S = Settings()  # the server's defaults: a stall in a barrier after 30 s, hang at 60 s


def beat(log, rank, t, n, cores=0.02, io_bps=2000.0):
    """A heartbeat: ``n`` collectives done on group 0, the process's CPU seconds and I/O bytes
    as if it used ``cores`` of a core and moved ``io_bps`` bytes a second since t = 100 (None:
    an older agent, which says neither)."""
    body = {"groups": [{"group": "0", "entered": n, "completed": n, "inflight_op": None,
                        "inflight_since": None}]}
    if cores is not None:
        body["cpu_s"] = round((t - 100.0) * cores, 3)
        body["io_b"] = int((t - 100.0) * io_bps)
    log.add(f"s{rank}", "heartbeat", body, t=t)


def steps(log, world, start, end, every=1.0, first=1):
    """Heartbeats of ``world`` ranks from ``start`` to ``end``, a collective done each; the
    count it reached (then heartbeats go on without it moving)."""
    n, t = first, start
    while t <= end:
        for r in range(world):
            beat(log, r, t, n, cores=1.0)
        n, t = n + 1, t + every
    return n - 1


def still(log, world, start, end, n, cores=0.02, io_bps=2000.0):
    t = start
    while t <= end:
        for r in range(world):
            beat(log, r, t, n, cores, io_bps)
        t += 1.0


def snapshot(log, rank, t, line, code):
    log.add(f"s{rank}", "snapshot", {"ask": "a1", "threads": [
        {"name": "MainThread", "training": True, "frames": [
            {"file": "/usr/lib/python3.11/runpy.py", "line": 88, "function": "_run_code",
             "library": True},
            {"file": "train.py", "line": line, "function": "<module>", "code": code}]}]}, t=t)


def test_every_rank_still_outside_collectives_is_a_stall_then_a_hang():
    log = running(3)
    n = steps(log, 3, 101.0, 130.0)
    still(log, 3, 131.0, 200.0, n)
    # No rank works (no CPU, no I/O): nothing is on its way, so --stall-after, 10 s.
    assert diagnose(log.state(), 139.0, S) == []  # 9 s after the last move: not yet
    still(log, 3, 201.0, 440.0, n)
    (f,) = diagnose(log.state(), 141.0, S)
    assert (f["kind"], f["severity"], f["ranks"]) == ("stall", "warning", [])  # asked first
    assert f["summary"].startswith("No rank has entered a collective for 11 s")
    assert f["first_seen"] == 140.0 and "NFS" in f["hint"]
    (f,) = diagnose(log.state(), 156.0, S)  # no snapshot came: every rank
    assert (f["kind"], f["severity"], f["ranks"]) == ("stall", "warning", [0, 1, 2])
    (f,) = diagnose(log.state(), 431.0, S)  # five minutes: critical
    assert (f["kind"], f["severity"], f["first_seen"]) == ("hang", "critical", 430.0)


def test_a_job_that_paused_before_is_given_three_times_that_pause():
    log = running(2)
    n = steps(log, 2, 101.0, 110.0)
    still(log, 2, 111.0, 149.0, n)  # a 40 s evaluation without collectives
    n = steps(log, 2, 150.0, 160.0, first=n + 1)
    still(log, 2, 161.0, 300.0, n)
    assert diagnose(log.state(), 160.0 + 119.0, S) == []
    assert kinds(diagnose(log.state(), 160.0 + 121.0, S)) == [("stall", [])]


def test_ranks_that_work_without_collectives_are_not_still():
    """Every rank evaluating on its own shard (no collective for minutes): its CPU says it
    works. An agent that does not say its CPU is judged at the hang's threshold."""
    log = running(3)
    n = steps(log, 3, 101.0, 130.0)
    t = 131.0
    while t <= 600.0:
        for r in range(3):
            beat(log, r, t, n, cores=1.0)
        t += 1.0
    assert diagnose(log.state(), 600.0, S) == []
    log = running(2)  # every rank writing a checkpoint to slow storage: little CPU, 20 MB/s
    n = steps(log, 2, 101.0, 130.0)
    still(log, 2, 131.0, 300.0, n, cores=0.05, io_bps=20e6)
    assert diagnose(log.state(), 300.0, S) == []
    log = running(2)
    n = steps(log, 2, 101.0, 130.0)
    still(log, 2, 131.0, 200.0, n, cores=None)
    assert diagnose(log.state(), 189.0, S) == []
    assert kinds(diagnose(log.state(), 191.0, S)) == [("stall", [])]


def test_a_job_where_one_rank_works_gives_it_the_barriers_30_s():
    """Rank 0 writes a checkpoint (a core busy) while ranks 1 and 2 wait for it in
    store.get: as long as a barrier would give it (corpus: store_wait_rank0_spins, and rank
    0's checkpoint when it is healthy)."""
    log = running(3)
    n = steps(log, 3, 101.0, 130.0)
    t = 131.0
    while t <= 200.0:
        beat(log, 0, t, n, cores=1.0)
        for r in (1, 2):
            beat(log, r, t, n)
        t += 1.0
    assert diagnose(log.state(), 159.0, S) == []
    assert kinds(diagnose(log.state(), 161.0, S)) == [("stall", [])]


def test_a_rank_inside_a_collective_is_the_hang_rules_ground():
    log = running(3)
    n = steps(log, 3, 101.0, 130.0)
    t = 131.0
    while t <= 200.0:
        for r in (0, 1):
            log.add(f"s{r}", "heartbeat", {"groups": [
                {"group": "0", "entered": n + 1, "completed": n, "inflight_op": "all_reduce",
                 "inflight_since": 130.5}], "cpu_s": t * 0.01}, t=t)
        beat(log, 2, t, n)
        t += 1.0
    assert [f for f in diagnose(log.state(), 200.0, S) if f["id"].endswith(":idle")] == []


def test_a_silent_rank_is_not_still():
    log = running(2)
    n = steps(log, 2, 101.0, 130.0)
    t = 131.0
    while t <= 200.0:  # rank 1's heartbeats stopped: rank_lost's ground
        beat(log, 0, t, n)
        t += 1.0
    assert kinds(diagnose(log.state(), 200.0, S)) == [("rank_lost", [1])]


def test_snapshots_name_the_rank_away_from_where_the_others_wait():
    log = running(3)
    n = steps(log, 3, 101.0, 130.0)
    still(log, 3, 131.0, 195.0, n)
    assert kinds(diagnose(log.state(), 141.0, S)) == [("stall", [])]
    for r in (1, 2):
        snapshot(log, r, 192.0, 33, "shards = store.get(f'shards/{epoch}')")
    snapshot(log, 0, 192.1, 29, "time.sleep(1)")
    (f,) = diagnose(log.state(), 195.0, S)
    assert (f["kind"], f["ranks"]) == ("stall", [0])
    assert "ranks 1, 2 wait at train.py:33 in <module>: shards = store.get" in f["summary"]
    assert "rank 0 is at train.py:29" in f["summary"] and "store" in f["hint"]


def test_snapshots_that_show_every_rank_at_one_place_name_them_all():
    log = running(3)
    n = steps(log, 3, 101.0, 130.0)
    still(log, 3, 131.0, 195.0, n)
    for r in range(3):
        snapshot(log, r, 192.0, 53, "fcntl.lockf(f, fcntl.LOCK_EX)")
    (f,) = diagnose(log.state(), 195.0, S)
    assert f["ranks"] == [0, 1, 2]
    assert "every rank stands at train.py:53 in <module>: fcntl.lockf" in f["summary"]


def test_the_agent_reads_its_io_bytes_where_linux_has_them(tmp_path):
    from pgdash_agent.reports import io_bytes

    before = io_bytes()
    assert before is not None and before > 0  # (Linux: /proc/self/io)
    (tmp_path / "f").write_bytes(b"x" * 100_000)
    assert io_bytes() >= before + 100_000
    (tmp_path / "io").write_text("rchar: 7\nwchar: 5\nsyscr: 1\n")
    assert io_bytes(str(tmp_path / "io")) == 12
    assert io_bytes(str(tmp_path / "missing")) is None
    (tmp_path / "io").write_text("rchar: 7\n")
    assert io_bytes(str(tmp_path / "io")) is None


# Burns 0.4 s of its own CPU once a line comes on stdin, says so, then idles until stdin
# closes (0.4 s however loaded the machine: it burns until its own clock says so).
_BURN = ("import sys, time\n"
         "sys.stdin.readline()\n"
         "t = time.process_time()\n"
         "while time.process_time() - t < 0.4: pass\n"
         "print('burnt', flush=True)\n"
         "sys.stdin.read()\n")


def _cpu_around_a_burn(script: str) -> tuple[float, float]:
    """cpu_seconds() before and after a child process running ``script`` (a _BURN, or one
    that runs a _BURN on its own stdin and stdout) burnt; the child has ended and been
    reaped on return."""
    import subprocess
    import sys

    from pgdash_agent.reports import cpu_seconds

    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        before = cpu_seconds()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "burnt\n"
        return before, cpu_seconds()
    finally:
        child.stdin.close()
        child.wait(30)
        child.stdout.close()


def test_the_agents_cpu_counts_its_child_processes_live_and_ended():
    """A validation loop whose DataLoader workers do the decoding waits on them in its main
    thread: its own CPU is small, its workers' is the work (bench/corpus/
    healthy_long_validation_no_collectives.py was a stall before)."""
    from pgdash_agent.reports import cpu_seconds

    before, live = _cpu_around_a_burn(_BURN)
    # (less a clock tick each side)
    assert live - before >= 0.4 - 0.02, (before, live)
    assert cpu_seconds() >= live - 0.02  # ended and reaped: counted still (os.times)


def test_cpu_seconds_count_the_work_of_a_workers_own_processes():
    """A DataLoader worker that hands its decoding to a process of its own (a decoder's
    pool, ffmpeg) idles itself: the rank is working all the same, in its grandchild."""
    # The child starts the burner with its own stdin and stdout and waits for it, idle.
    worker = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {_BURN!r}])\n"
    before, live = _cpu_around_a_burn(worker)
    assert live - before >= 0.4 - 0.02, (before, live)


def test_cpu_seconds_without_proc_is_the_process_and_its_reaped_children(tmp_path):
    import os

    from pgdash_agent.reports import cpu_seconds

    t = os.times()
    assert cpu_seconds(str(tmp_path)) >= t.user + t.system + t.children_user + t.children_system


def test_a_still_job_that_is_stopped_keeps_its_verdict_and_blames_no_one_for_the_stop():
    """The user kills the job that stood still (scancel; torchrun's teardown after a kill):
    its ranks vanish one after another, and the stall stays the verdict, not a rank_lost."""
    log = running(3)
    n = steps(log, 3, 101.0, 130.0)
    still(log, 3, 131.0, 195.0, n)
    for r in (1, 2):
        snapshot(log, r, 192.0, 33, "shards = store.get(f'shards/{epoch}')")
    snapshot(log, 0, 192.1, 29, "time.sleep(1)")
    assert kinds(diagnose(log.state(), 195.0, S)) == [("stall", [0])]
    for r, t in ((2, 196.0), (0, 196.03), (1, 196.04)):
        log.add(f"s{r}", "disconnect", {}, t=t)
    assert kinds(diagnose(log.state(), 200.0, S)) == [("stall", [0])]


def ended(log, rank, t, n, holding=("metrics-uploader",), cores=0.0):
    """A heartbeat of a rank whose script ended (its main thread returned) at t = 150."""
    body = {"groups": [{"group": "0", "entered": n, "completed": n, "inflight_op": None,
                        "inflight_since": None}],
            "cpu_s": round(50.0 + (t - 150.0) * cores, 3), "io_b": 1000,
            "main_done": True, "holding": list(holding)}
    log.add(f"s{rank}", "heartbeat", body, t=t)


def test_a_rank_whose_script_ended_but_whose_process_lives_on_is_named():
    """Rank 1's non-daemon uploader thread keeps its process alive after training; the
    others exited (corpus: hang_at_exit_nondaemon_thread)."""
    log = running(3)
    n = steps(log, 3, 101.0, 149.0)
    for r in (0, 2):
        log.add(f"s{r}", "left", {"group": None, "reason": "destroy_process_group"}, t=149.5)
        log.add(f"s{r}", "exit", {"clean": True, "reason": "exit", "exitcode": 0}, t=150.0)
    log.add("s1", "left", {"group": None, "reason": "destroy_process_group"}, t=149.5)
    t = 150.0
    while t <= 460.0:
        ended(log, 1, t, n)
        t += 1.0
    assert diagnose(log.state(), 159.0, S) == []
    (f,) = diagnose(log.state(), 161.0, S)
    assert (f["kind"], f["severity"], f["ranks"]) == ("stall", "warning", [1])
    assert f["first_seen"] == 160.0
    assert f["summary"].startswith("Rank 1 finished its script 11 s ago (the main thread "
                                   "returned), but its process has not exited: Python waits "
                                   "for its non-daemon thread 'metrics-uploader'")
    assert "daemon=True" in f["hint"] and "join()" in f["hint"]
    (f,) = diagnose(log.state(), 451.0, S)
    assert (f["kind"], f["severity"]) == ("hang", "critical")


def test_a_process_that_works_after_its_script_ended_is_not_held():
    """A thread uploading the last checkpoint after the script returned: a core busy."""
    log = running(2)
    n = steps(log, 2, 101.0, 149.0)
    log.add("s0", "exit", {"clean": True, "reason": "exit", "exitcode": 0}, t=150.0)
    t = 150.0
    while t <= 260.0:
        ended(log, 1, t, n, holding=("checkpoint-upload",), cores=0.9)
        t += 1.0
    assert diagnose(log.state(), 250.0, S) == []


def test_the_agent_names_the_threads_that_keep_a_process_alive_after_its_script(tmp_path):
    """A real interpreter: its script returns while a non-daemon thread waits on a queue."""
    import subprocess
    import sys

    script = tmp_path / "held.py"
    script.write_text(
        "import queue, threading, time, os\n"
        "from pgdash_agent.reports import threads_holding_exit\n"
        "assert threads_holding_exit() is None\n"
        "def watch():\n"
        "    time.sleep(0.5)\n"
        "    print(threads_holding_exit(), flush=True)\n"
        "    os._exit(0)\n"
        "threading.Thread(target=watch, daemon=True).start()\n"
        "threading.Thread(target=queue.Queue().get, name='metrics-uploader').start()\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, cwd=str(__import__("pathlib").Path(__file__).parents[2]))
    assert out.stdout.strip() == "['metrics-uploader']", out


def test_an_exit_handler_that_runs_long_is_given_a_barriers_30_s():
    """No non-daemon thread: the interpreter runs its exit handlers (a logger uploading its
    last records, slowly): named only after 30 s."""
    log = running(2)
    n = steps(log, 2, 101.0, 149.0)
    log.add("s0", "exit", {"clean": True, "reason": "exit", "exitcode": 0}, t=150.0)
    t = 150.0
    while t <= 200.0:
        ended(log, 1, t, n, holding=())
        t += 1.0
    assert diagnose(log.state(), 179.0, S) == []
    (f,) = diagnose(log.state(), 181.0, S)
    assert (f["kind"], f["ranks"], f["first_seen"]) == ("stall", [1], 180.0)
    assert "no Python thread holds it" in f["summary"]
