"""Every finding's and incident's texts, rendered for one rank, two ranks and many, on gloo
and on NCCL, with py-spy installed on the hosts or not: the verbs agree with the ranks they
follow ("rank 0 waits", "ranks 0, 1 wait"), no placeholder or None is left, sentences end with
a full stop, and the next step fits the backend and the tools the agent reported."""

from __future__ import annotations

import re

import pytest

from pgdash_agent.wire import hist_bucket
from dashboard.diagnosis import errors, known_errors
from dashboard.diagnosis import Settings, diagnose
from dashboard.diagnosis.incidents import incidents
from dashboard.diagnosis.text import ranks_label
from dashboard.state import JobState

S = Settings()  # the server's defaults: hang after 60 s, stall floor 10 s
PY_SPY = "/opt/venv/bin/py-spy"

# A rank named alone with a plural verb, or ranks with a singular one.
SINGULAR_WRONG = re.compile(
    r"\brank \d+ (wait|have|were|are|hang|hold|do|use|reach|fail|never posted their)\b",
    re.IGNORECASE)
PLURAL_WRONG = re.compile(
    r"\branks \d[\d, -]*(?: and \d+ more)? (waits|has|was|is|hangs|holds|does|uses|reaches|"
    r"fails)\b", re.IGNORECASE)


class Log:
    def __init__(self):
        self.events = []

    def add(self, session, kind, body, t):
        self.events.append({"id": len(self.events) + 1, "session": session, "seq": None,
                            "t": t, "received_at": t, "kind": kind, "body": body})

    def state(self):
        return JobState(1, "job").apply_all(self.events)


def job(world, backend, py_spy, groups=(("0", None),), t=100.0):
    log = Log()
    for r in range(world):
        s = f"s{r}"
        log.add(s, "hello", {"job": "job", "rank": r, "world_size": world,
                             "host": f"node{r // 4}", "pid": 1000 + r, "local_rank": r % 4,
                             "device": "cpu" if backend == "gloo" else f"cuda:{r % 4}",
                             "versions": {"torch": "2.13.0", "py-spy": PY_SPY if py_spy
                                          else None}}, t=t)
        log.add(s, "init_start", {"rank": r, "world_size": world, "backend": backend}, t=t)
        log.add(s, "init_done", {"rank": r, "world_size": world, "backend": backend,
                                 "duration_s": 0.1}, t=t)
        for name, members in groups:
            members = list(range(world)) if members is None else members
            if r in members:
                log.add(s, "group", {"name": name, "ranks": members, "backend": backend}, t=t)
    return log


def inflight(log, rank, t, group="0", entered=5, op="all_reduce", since=100.0):
    log.add(f"s{rank}", "heartbeat", {"groups": [
        {"group": group, "entered": entered, "completed": entered - 1, "inflight_op": op,
         "inflight_since": since, "inflight_dtype": "float32", "inflight_bytes": 16}]}, t=t)


def idle(log, rank, t, group="0", entered=4):
    log.add(f"s{rank}", "heartbeat", {"groups": [
        {"group": group, "entered": entered, "completed": entered, "inflight_op": None,
         "inflight_since": None}]}, t=t)


def stack(log, rank, group="0", seq=5):
    log.add(f"s{rank}", "stack", {"group": group, "seq": seq, "op": "all_reduce",
                                  "since": 100.0, "stack": '  File "train.py", line 7, in step\n'},
            t=103.0)


def intervals(log, rank, waits_ms, start=101.0, per=20):
    for i, ms in enumerate(waits_ms):
        us = ms * 1000
        log.add(f"s{rank}", "coll_stats", {"start": start + i - 1, "end": start + i, "rows": [
            {"group": "0", "op": "all_reduce", "count": per, "bytes": 16 * per,
             "sum_us": us * per, "max_us": us, "hist": [[hist_bucket(us), per]]}]},
            t=start + i)


def p2p(log, rank, t, posted, wait=None):
    row = {"group": "0", "entered": 0, "completed": 0, "inflight_op": None,
           "inflight_since": None, "p2p_posted": posted}
    if wait is not None:
        op, peer, n = wait
        row.update(p2p_op=op, p2p_peer=peer, p2p_tag=0, p2p_n=n, p2p_since=100.0)
    log.add(f"s{rank}", "heartbeat", {"groups": [row]}, t=t)


def fail(log, rank, t, error_type, error, where="uncaught", traceback=None):
    body = {"where": where, "error_type": error_type, "error": error}
    if traceback:
        body["traceback"] = traceback
    log.add(f"s{rank}", "error", body, t=t)
    log.add(f"s{rank}", "exit", {"clean": False, "reason": "uncaught exception"}, t=t + 0.01)


USER_TRACEBACK = [
    {"file": "/home/me/train.py", "line": 50, "function": "<module>", "code": "main()"},
    {"file": "/home/me/train.py", "line": 42, "function": "step", "code": "loss = x / n"},
]
LIBRARY_TRACEBACK = [
    {"file": "/home/me/model.py", "line": 30, "function": "forward", "code": "y = self.fc(x)"},
    {"file": "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", "line": 125,
     "function": "forward", "code": "return F.linear(input, self.weight, self.bias)",
     "library": True},
]
COLLECTIVE_TRACEBACK = [
    {"file": "/home/me/train.py", "line": 12, "function": "step", "code": "dist.all_reduce(t)"},
    {"file": "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
     "line": 2800, "function": "all_reduce", "code": "work.wait()", "library": True},
]


# -- scenarios: (log, moment) for n blamed ranks ----------------------------------------------

def hang(n, backend, py_spy, waiting=2, stacks=True):
    log = job(n + waiting, backend, py_spy)
    for r in range(waiting):
        inflight(log, r, 170.0)
        if stacks:
            stack(log, r)
    for r in range(waiting, waiting + n):
        idle(log, r, 170.0)
    return log, 170.0


def hang_all_inside(n, backend, py_spy):
    log = job(n, backend, py_spy)
    for r in range(n):
        inflight(log, r, 170.0)
    stack(log, 0)
    return log, 170.0


def hang_chain(n, backend, py_spy):
    """Rank 0 (and more) wait in group 0 for the middle rank, which waits in group 1 for the
    last n ranks."""
    world = 2 + n
    mid, last = 1, list(range(2, world))
    log = job(world, backend, py_spy, groups=(("0", None), ("1", [mid, *last])))
    inflight(log, 0, 170.0)
    log.add(f"s{mid}", "heartbeat", {"groups": [
        {"group": "0", "entered": 4, "completed": 4, "inflight_op": None,
         "inflight_since": None},
        {"group": "1", "entered": 3, "completed": 2, "inflight_op": "broadcast",
         "inflight_since": 100.5}]}, t=170.0)
    for r in last:
        log.add(f"s{r}", "heartbeat", {"groups": [
            {"group": "0", "entered": 4, "completed": 4, "inflight_op": None,
             "inflight_since": None},
            {"group": "1", "entered": 2, "completed": 2, "inflight_op": None,
             "inflight_since": None}]}, t=170.0)
    return log, 170.0


def one_waiter_two_groups(n, backend, py_spy):
    """Rank 0 waits (async) in two groups for the same n ranks: one incident of two hangs."""
    world = 1 + n
    log = job(world, backend, py_spy, groups=(("0", None), ("1", None)))
    log.add("s0", "heartbeat", {"groups": [
        {"group": g, "entered": 5, "completed": 4, "inflight_op": "all_reduce",
         "inflight_since": 100.0} for g in ("0", "1")]}, t=170.0)
    for r in range(1, world):
        log.add(f"s{r}", "heartbeat", {"groups": [
            {"group": g, "entered": 4, "completed": 4, "inflight_op": None,
             "inflight_since": None} for g in ("0", "1")]}, t=170.0)
    return log, 170.0


def stall(n, backend, py_spy, waiting=2):
    log = job(n + waiting, backend, py_spy)
    for r in range(waiting):
        inflight(log, r, 135.0)
    for r in range(waiting, waiting + n):
        idle(log, r, 135.0)
    return log, 135.0


def p2p_hang(n, backend, py_spy):
    """Rank 0 waits to receive from rank 1, which never sent (n = 1), or ranks 0..n-1 each
    wait for rank n's send (n > 1: many waiters, one culprit)."""
    world = n + 1
    log = job(world, backend, py_spy)
    for r in range(n):
        p2p(log, r, 170.0, {}, ("irecv", n, 1))
    p2p(log, n, 170.0, {})
    return log, 170.0


def p2p_cycle(n, backend, py_spy):
    log = job(2, backend, py_spy)
    p2p(log, 0, 170.0, {"recv:1:0": 1}, ("recv", 1, 1))
    p2p(log, 1, 170.0, {"recv:0:0": 1}, ("recv", 0, 1))
    return log, 170.0


def desync(n, backend, py_spy):
    world = n + 3
    log = job(world, backend, py_spy)
    for r in range(world):
        op = "broadcast" if r >= 3 else "all_reduce"
        inflight(log, r, 101.0, op=op)
    return log, 101.0


def desync_roots(n, backend, py_spy):
    """Rank 0 broadcasts from itself; n ranks pass src=n+2; n+1 ranks finished it (src 0)."""
    log = job(2 * n + 2, backend, py_spy)
    for r in range(2 * n + 2):
        row = {"group": "0", "entered": 5, "completed": 4, "inflight_op": "broadcast",
               "inflight_since": 100.0, "inflight_dtype": "float32", "inflight_bytes": 16,
               "inflight_root": 0 if r == 0 else n + 2}
        if 1 <= r <= n + 1:  # finished it, in the next all_reduce
            row.update(entered=6, completed=5, inflight_op="all_reduce", done_root=0)
            del row["inflight_root"]
        log.add(f"s{r}", "heartbeat", {"groups": [row]}, t=101.0)
    return log, 101.0


def hang_timed_out(n, backend, py_spy):
    """Ranks 0 and 1 wait in all_reduce #5 for n ranks; rank 0's 5 s collective timeout ends
    the wait before a stall could be said."""
    log = job(n + 2, backend, py_spy)
    for r in range(2):
        inflight(log, r, 104.0)
    for r in range(2, n + 2):
        idle(log, r, 104.0)
    text = ("Timed out waiting 5000ms for recv operation to complete" if backend == "gloo" else
            "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, "
            "OpType=ALLREDUCE, NumelIn=4, NumelOut=4, Timeout(ms)=5000) ran for 5003 "
            "milliseconds before timing out.")
    fail(log, 0, 105.0, "RuntimeError", text)
    return log, 106.0


def crash(kind):
    def scenario(n, backend, py_spy):
        log = job(n + 2, backend, py_spy)
        for r in range(2, n + 2):
            if kind == "bug":
                fail(log, r, 105.0, "ZeroDivisionError", "division by zero",
                     traceback=USER_TRACEBACK)
            elif kind == "bug_in_library":
                fail(log, r, 105.0, "RuntimeError", "mat1 and mat2 shapes cannot be "
                     "multiplied (4x3 and 5x2)", traceback=LIBRARY_TRACEBACK)
            elif kind == "bug_no_traceback":
                fail(log, r, 105.0, "KeyError", "'labels'")
            elif kind == "oom":
                fail(log, r, 105.0, "OutOfMemoryError", "CUDA out of memory. Tried to "
                     "allocate 2.00 GiB")
            elif kind == "unknown_collective":
                fail(log, r, 105.0, "RuntimeError", "something odd in the backend",
                     traceback=COLLECTIVE_TRACEBACK)
            elif kind == "exit":
                fail(log, r, 105.0, "SystemExit", "the program exited with status 3",
                     where="exit")
        for r in (0, 1):  # the victims
            fail(log, r, 105.5, "RuntimeError", "[../gloo/transport/tcp/pair.cc:553] "
                 "Connection closed by peer [127.0.0.1]:13221")
        return log, 106.0
    return scenario


def lost(n, backend, py_spy):
    log = job(n + 1, backend, py_spy)
    for r in range(1, n + 1):
        log.add(f"s{r}", "disconnect", {}, t=105.0)
    idle(log, 0, 110.0)  # rank 0 still reports
    return log, 110.0


def exited_early(n, backend, py_spy):
    world = n + 2
    log = job(world, backend, py_spy)
    for r in range(world):
        inflight(log, r, 104.0, entered=40)
    log.add("s0", "heartbeat", {"groups": [
        {"group": "0", "entered": 40, "completed": 40, "inflight_op": None,
         "inflight_since": None}]}, t=105.0)
    log.add("s0", "left", {"group": None, "reason": "destroy_process_group"}, t=105.0)
    for r in range(1, world):
        inflight(log, r, 105.6, entered=41, since=105.5)
    log.add("s0", "heartbeat", {"groups": []}, t=105.6)  # alive after it left: it left
    return log, 106.0


def init_incomplete(n, backend, py_spy):
    log = Log()
    world = n + 2
    for r in range(2):
        log.add(f"s{r}", "hello", {"job": "job", "rank": r, "world_size": world,
                                   "host": "node0", "pid": 1000 + r,
                                   "versions": {"py-spy": PY_SPY if py_spy else None}},
                t=100.0)
        log.add(f"s{r}", "init_start", {"rank": r, "world_size": world, "backend": backend,
                                        "master_addr": "10.0.0.1", "master_port": "29500"},
                t=100.0)
    return log, 120.0


def init_failed(n, backend, py_spy):
    log = Log()
    for r in range(n):
        log.add(f"s{r}", "hello", {"job": "job", "rank": r, "world_size": n + 1,
                                   "host": "node0", "pid": 1000 + r}, t=100.0)
        log.add(f"s{r}", "init_start", {"rank": r, "world_size": n + 1}, t=100.0)
        log.add(f"s{r}", "init_failed", {"error_type": "ValueError", "error":
                                         "Error initializing torch.distributed using env:// "
                                         "rendezvous: environment variable MASTER_ADDR expected, "
                                         "but not set", "duration_s": 0.1}, t=100.1)
    return log, 110.0


def init_gave_up(n, backend, py_spy):
    """n ranks gave up waiting (the store's timeout) for the last, which came too late."""
    log = Log()
    for r in range(n + 1):
        log.add(f"s{r}", "hello", {"job": "job", "rank": r, "world_size": n + 1,
                                   "host": "node0", "pid": 1000 + r,
                                   "versions": {"py-spy": PY_SPY if py_spy else None}}, t=100.0)
    for r in range(n):
        log.add(f"s{r}", "init_start", {"rank": r, "world_size": n + 1, "timeout_s": 5.0},
                t=100.0)
        log.add(f"s{r}", "init_failed", {"error_type": "DistStoreError", "error":
                                         "Timed out after 5 seconds waiting for clients. "
                                         f"{n}/{n + 1} clients joined.", "duration_s": 5.0},
                t=105.0)
    log.add(f"s{n}", "init_start", {"rank": n, "world_size": n + 1, "timeout_s": 5.0}, t=108.0)
    return log, 110.0


def init_claimed_twice(n, backend, py_spy):
    """The process started as rank n asks for rank 0 too."""
    log = Log()
    for r in range(n + 1):
        log.add(f"s{r}", "hello", {"job": "job", "rank": r, "world_size": n + 1,
                                   "host": "node0", "pid": 1000 + r}, t=100.0)
        log.add(f"s{r}", "init_start", {"rank": r if r < n else 0, "world_size": n + 1},
                t=100.0)
    return log, 101.0


def config_mismatch(n, backend, py_spy):
    log = job(n * 2 + 1, backend, py_spy)
    for r in range(n):  # the minority: n of 2n + 1
        log.add(f"s{r}", "hello", {"job": "job", "rank": r, "world_size": n * 2 + 1,
                                   "host": "node0", "pid": 1000 + r,
                                   "env": {"NCCL_IB_DISABLE": "1"}}, t=101.0)
    return log, 110.0


def straggler(n, backend, py_spy):
    log = job(4, backend, py_spy)
    for r in range(3):
        intervals(log, r, [12, 11, 13, 12, 12])
    intervals(log, 3, [0.3, 0.4, 0.3, 0.3, 0.2])
    return log, 106.0


def slow(n, backend, py_spy):
    log = job(2, backend, py_spy)
    for r in range(2):
        intervals(log, r, [0.5] * 11 + [40, 38, 41])
    return log, 115.0


def gpu(n, backend, py_spy):
    log = job(n, backend, py_spy)
    for r in range(n):
        log.add(f"s{r}", "gpu", {"uuid": f"GPU-{r}", "lost": False, "name": "H100",
                                 "values": {"temp_c": 90.0, "power_w": 700.0,
                                            "sm_clock_mhz": 900.0,
                                            "sm_clock_max_mhz": 1980.0},
                                 "reasons": ["hw_thermal_slowdown"], "xids": [79]}, t=101.0)
        log.add(f"s{r}", "gpu", {"uuid": f"GPU-{r}", "lost": False, "name": "H100",
                                 "values": {"temp_c": 90.0}, "reasons": ["hw_thermal_slowdown"],
                                 "xids": []}, t=110.0)
    return log, 110.0


SCENARIOS = {
    "hang": (hang, {"hang"}), "hang_no_stacks": (lambda n, b, p: hang(n, b, p, stacks=False),
                                                 {"hang"}),
    "hang_one_waiter": (lambda n, b, p: hang(n, b, p, waiting=1), {"hang"}),
    "hang_many_waiters": (lambda n, b, p: hang(n, b, p, waiting=9), {"hang"}),
    "hang_all_inside": (hang_all_inside, {"hang"}), "hang_chain": (hang_chain, {"hang"}),
    "one_waiter_two_groups": (one_waiter_two_groups, {"hang"}),
    "stall": (stall, {"stall"}), "stall_one_waiter": (lambda n, b, p: stall(n, b, p, 1),
                                                      {"stall"}),
    "p2p_hang": (p2p_hang, {"hang"}), "p2p_cycle": (p2p_cycle, {"hang"}),
    "desync": (desync, {"desync"}), "desync_roots": (desync_roots, {"desync"}),
    "hang_timed_out": (hang_timed_out, {"hang"}),
    "bug": (crash("bug"), {"rank_failed"}),
    "bug_in_library": (crash("bug_in_library"), {"rank_failed"}),
    "bug_no_traceback": (crash("bug_no_traceback"), {"rank_failed"}),
    "oom": (crash("oom"), {"rank_failed"}),
    "unknown_collective": (crash("unknown_collective"), {"rank_failed"}),
    "exit": (crash("exit"), {"rank_failed"}),
    "lost": (lost, {"rank_lost"}), "exited_early": (exited_early, {"rank_exited_early"}),
    "init_incomplete": (init_incomplete, {"init_incomplete"}),
    "init_failed": (init_failed, {"init_failed"}),
    "init_gave_up": (init_gave_up, {"init_incomplete"}),
    "init_claimed_twice": (init_claimed_twice, {"init_incomplete"}),
    "config_mismatch": (config_mismatch, {"config_mismatch"}),
    "straggler": (straggler, {"straggler"}), "slow": (slow, {"slow_collective"}),
    "gpu": (gpu, {"gpu_fault", "gpu_throttle"}),
}


def check_text(text, what):
    """The rules every text a person reads keeps."""
    assert isinstance(text, str) and text.strip(), what
    for bad in ("None", "{", "}", "  ", " ,", "\n"):
        assert bad not in text, f"{what}: {bad!r} in {text!r}"
    assert not re.search(r" \.(?!\.)", text), f"{what}: ' .' in {text!r}"
    assert not re.search(r"(?<!\.)\.\.(?!\.)", text), f"{what}: '..' in {text!r}"
    assert text.endswith("."), f"{what}: no full stop at the end of {text!r}"
    for wrong in (SINGULAR_WRONG, PLURAL_WRONG):
        match = wrong.search(text)
        assert match is None, f"{what}: {match.group(0)!r} in {text!r}"
    assert text.count("`") % 2 == 0, f"{what}: an unclosed code span in {text!r}"


def check_next_step(text, what, backend, py_spy):
    if backend == "gloo":
        for nccl in ("watchdog", "TORCH_NCCL", "NCCL_DEBUG"):
            assert nccl not in text, f"{what}: {nccl!r} on a gloo job: {text!r}"
    if "py-spy" in text:
        if py_spy:
            assert "pip install py-spy" not in text and PY_SPY in text, f"{what}: {text!r}"
        else:
            assert "`pip install py-spy`" in text and PY_SPY not in text, f"{what}: {text!r}"
            assert text.index("pip install py-spy") < text.index("py-spy dump"), what


@pytest.mark.parametrize("py_spy", [False, True], ids=["no-py-spy", "py-spy"])
@pytest.mark.parametrize("backend", ["gloo", "nccl"])
@pytest.mark.parametrize("n", [1, 2, 7], ids=["one", "two", "many"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_finding_and_incident_reads_well(name, n, backend, py_spy):
    build, kinds = SCENARIOS[name]
    log, now = build(n, backend, py_spy)
    found = diagnose(log.state(), now, S)
    assert {f["kind"] for f in found} >= kinds, (name, [f["summary"] for f in found])
    for f in found:
        what = f"{name}/{f['kind']} n={n} {backend} py-spy={py_spy}"
        check_text(f["summary"], what + " summary")
        check_text(f["hint"], what + " hint")
        check_next_step(f["hint"], what + " hint", backend, py_spy)
    for inc in incidents(found):
        what = f"{name}/incident n={n} {backend} py-spy={py_spy}"
        check_text(inc["summary"], what + " summary")
        for link in inc["chain"]:
            check_text(link["link"] + ".", what + " chain")


@pytest.mark.parametrize("n", [1, 2, 7])
def test_a_hang_says_it_or_them_and_what_its_evidence_holds(n):
    log, now = hang(n, "gloo", False)
    (f,) = diagnose(log.state(), now, S)
    assert f["summary"].endswith("for it.") if n == 1 else f["summary"].endswith("for them.")
    # Only the waiting ranks' stacks are there: the hint says so, and how to get the rest.
    assert sorted(f["evidence"]["stacks"]) == ["0", "1"]
    assert "The stacks of the waiting ranks (ranks 0, 1) are in the evidence" in f["hint"]
    assert "`pip install py-spy`, then `py-spy dump --pid 1002` on node0" in f["hint"]
    assert ("culprit's own stack comes with the incident, asked of its agent" if n == 1
            else "culprits' own stacks come with the incident, asked of their agents") \
        in f["hint"]
    assert "30 minutes by default" in f["hint"] and "NCCL" not in f["hint"]
    log, now = hang(n, "nccl", True)
    (f,) = diagnose(log.state(), now, S)
    assert "NCCL watchdog" in f["hint"] and f"`{PY_SPY} dump --pid 1002` on node0" in f["hint"]
    assert "pip install" not in f["hint"]


def test_a_plain_python_bug_names_the_line_and_no_distributed_debugging():
    log, now = crash("bug")(1, "gloo", False)
    (f,) = diagnose(log.state(), now, S)
    assert f["ranks"] == [2]
    assert f["summary"] == ("Rank 2 failed (pid 1002 on node0): ZeroDivisionError at "
                            "train.py:42 in step(): division by zero.")
    assert "bug in the training code" in f["hint"] and "/home/me/train.py:42 in step()" in f["hint"]
    assert "no rule" not in f["hint"] and "TORCH_DISTRIBUTED_DEBUG" not in f["hint"]
    assert list(f["evidence"])[0] == "at" and f["evidence"]["at"] == "train.py:42 in step()"
    assert f["evidence"]["traceback"] == USER_TRACEBACK and f["evidence"]["cause"] == "code_bug"
    # A shape error raised inside torch: the training code's line is named, torch's too.
    log, now = crash("bug_in_library")(1, "gloo", False)
    (f,) = diagnose(log.state(), now, S)
    assert f["evidence"]["at"] == "model.py:30 in forward()"
    assert "raised inside linear.py:125 in forward()" in f["hint"]
    # An error out of a collective no rule knows stays a distributed one.
    log, now = crash("unknown_collective")(1, "gloo", False)
    (f,) = diagnose(log.state(), now, S)
    assert "at" not in f["evidence"] and "TORCH_DISTRIBUTED_DEBUG=DETAIL" in f["hint"]


def test_rank_lists_of_many_ranks_stay_short():
    assert ranks_label([3]) == "rank 3"
    assert ranks_label([0, 1]) == "ranks 0, 1"
    assert ranks_label(range(1000)) == "ranks 0-999"
    assert ranks_label([0, 1, 2, 5, 7, 8]) == "ranks 0-2, 5, 7, 8"
    assert ranks_label(range(0, 100, 2)) == ("ranks 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22 "
                                            "and 38 more")


@pytest.mark.parametrize("rule", known_errors.RULES, ids=lambda r: r.cause)
def test_every_error_hint_template_reads_well(rule):
    values = errors._Fill({})  # every placeholder left unfilled reads "<name>"
    check_text(rule.hint.format_map(values), f"{rule.cause} hint")
    title = rule.title.format_map(values)
    assert title and "{" not in title and "  " not in title and "None" not in title
