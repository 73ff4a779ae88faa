"""Rules for the training code people run, on hand-made event logs: pipelines' point-to-point
waits, a rank that leaves early, a hung job that is stopped, and a rank that calls a Python
collective where its peers are inside DDP's C++ one. Real jobs of each:
tests/integration/test_corpus.py."""

import os

from dashboard.diagnosis import Settings, diagnose
from tests.helpers.events import hello, kinds, progress, running

S = Settings()  # the server's defaults: stall floor 10 s, hang at 60 s


def p2p_row(group, posted, wait=None, entered=0):
    """A progress row with point-to-point counts {"send:1:0": n} and the op it waits in:
    wait = (op, peer, tag, n, since)."""
    row = {"group": group, "entered": entered, "completed": entered, "inflight_op": None,
           "inflight_since": None, "p2p_posted": posted}
    if wait is not None:
        op, peer, tag, n, since = wait
        row.update(p2p_op=op, p2p_peer=peer, p2p_tag=tag, p2p_n=n, p2p_since=since)
    return row


def history(log, world, t=101.0, n=40, us=2000.0):
    """n short operations per rank on group 0 (so the stall floor decides)."""
    rows = [{"group": "0", "op": "recv", "count": n, "bytes": 16 * n, "sum_us": us * n,
             "max_us": us, "hist": [[int(8 * 11), n]]}]
    for r in range(world):
        log.add(f"s{r}", "coll_stats", {"start": t - 1, "end": t, "rows": rows}, t=t)


def frozen_pipeline(log, t, since):
    """4 stages; stage 2 froze in its forward after it received micro-batch 50 from stage 1.
    Stage 3 waits for 2's activations, stage 1 for 2's gradients, stage 0 for 1's."""
    log.add("s0", "heartbeat", {"groups": [p2p_row("0", {"send:1:0": 51, "recv:1:0": 49},
                                                   ("irecv", 1, 0, 50, since))]}, t=t)
    log.add("s1", "heartbeat", {"groups": [p2p_row(
        "0", {"recv:0:0": 51, "send:2:0": 51, "recv:2:0": 49, "send:0:0": 49},
        ("irecv", 2, 0, 50, since + 0.01))]}, t=t)
    log.add("s2", "heartbeat", {"groups": [p2p_row(
        "0", {"recv:1:0": 51, "send:3:0": 50, "recv:3:0": 49, "send:1:0": 49})]}, t=t)
    log.add("s3", "heartbeat", {"groups": [p2p_row(
        "0", {"recv:2:0": 51, "send:2:0": 50}, ("irecv", 2, 0, 51, since + 0.02))]}, t=t)


def test_a_frozen_pipeline_stage_is_the_culprit_of_a_stall_then_a_hang_with_its_chain():
    log = running(4)
    history(log, 4)
    frozen_pipeline(log, t=111.0, since=100.5)
    assert diagnose(log.state(), 110.0, S) == []
    (f,) = diagnose(log.state(), 111.0, S)
    assert (f["kind"], f["severity"], f["ranks"]) == ("stall", "warning", [2])
    assert f["summary"].startswith("Rank 2 has not sent or received")
    assert f["evidence"]["waiting"] == [0, 1, 3] and f["first_seen"] == 110.5
    hops = {c["rank"]: c["for"] for c in f["evidence"]["chain"]}
    assert hops == {0: [1], 1: [2], 3: [2]}  # 0 -> 1 -> 2 and 3 -> 2, along the pipeline
    frozen_pipeline(log, t=161.0, since=100.5)  # heartbeats go on, nobody moves
    (f,) = diagnose(log.state(), 161.0, S)
    assert (f["kind"], f["severity"], f["ranks"]) == ("hang", "critical", [2])


def test_a_pipeline_in_its_bubble_is_no_stall():
    log = running(4)
    history(log, 4)
    frozen_pipeline(log, t=103.0, since=102.5)  # waits of half a second: a bubble
    assert diagnose(log.state(), 103.0, S) == []
    # The peer posted its send (stage 2 moved on): nothing to blame however long it took.
    log.add("s2", "heartbeat", {"groups": [p2p_row(
        "0", {"recv:1:0": 51, "send:3:0": 51, "recv:3:0": 50, "send:1:0": 50})]}, t=104.0)
    log.add("s3", "heartbeat", {"groups": [p2p_row(
        "0", {"recv:2:0": 51, "send:2:0": 50}, ("irecv", 2, 0, 51, 90.0))]}, t=104.0)
    assert [f for f in diagnose(log.state(), 104.0, S) if f["ranks"] == [3]] == []


def leave(log, rank, t, entered, fr=0, how="left", alive_after=0.6):
    """The rank's last collectives, then it destroys its group ("left": its heartbeat goes on
    ``alive_after`` later, None for none) or exits cleanly ("exit")."""
    def heartbeat(at):
        log.add(f"s{rank}", "heartbeat", {"groups": [
            {"group": "0", "entered": entered, "completed": entered, "inflight_op": None,
             "inflight_since": None, "fr_enqueued": fr, "fr_completed": fr}]}, t=at)
    heartbeat(t)
    if how == "left":
        log.add(f"s{rank}", "left", {"group": None, "reason": "destroy_process_group"}, t=t)
        if alive_after is not None:
            heartbeat(t + alive_after)
    else:
        log.add(f"s{rank}", "exit", {"clean": True, "reason": "exit", "exitcode": 0}, t=t)


CLOSED = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
          "peer [127.0.0.1]:13221")


def test_a_rank_that_leaves_early_is_named_and_its_peers_errors_are_its_evidence():
    log = running(3)
    leave(log, 2, 105.0, entered=40)
    for r in (0, 1):  # the others go on: their next all_reduce
        log.add(f"s{r}", "heartbeat", {"groups": [
            {"group": "0", "entered": 41, "completed": 40, "inflight_op": "all_reduce",
             "inflight_since": 105.5}]}, t=105.6)
    (f,) = diagnose(log.state(), 105.6, S)
    assert (f["kind"], f["severity"], f["ranks"]) == ("rank_exited_early", "critical", [2])
    assert f["summary"].startswith("Rank 2 left the job early")
    assert f["evidence"]["ahead"] == {"0": [0, 1]} and f["first_seen"] == 105.0
    assert "Join" in f["hint"] and "drop_last" in f["hint"]
    # Their collective fails on the closed connection; they exit non-zero; torchrun stops.
    for r in (0, 1):
        log.add(f"s{r}", "error", {"where": "collective", "error_type": "RuntimeError",
                                   "error": CLOSED, "group": "0", "op": "all_reduce",
                                   "seq": 41}, t=105.7)
        log.add(f"s{r}", "exit", {"clean": False, "reason": "uncaught exception"}, t=105.8)
    log.add("s2", "exit", {"clean": True, "reason": "exit", "exitcode": 0}, t=106.0)
    found = diagnose(log.state(), 120.0, S)
    assert kinds(found) == [("rank_exited_early", [2])], found
    assert set(found[0]["evidence"]["victims"]) == {"0", "1"}


def test_ranks_that_swallow_the_error_of_an_early_leaver_and_leave_are_its_victims():
    """``try: step() except Exception: continue``: rank 2 skipped one all_reduce and ran out of
    steps first; the others' last all_reduce raises on its closed connection, they swallow it,
    end their loop and destroy their group too. Only rank 2 left by itself."""
    log = running(3)
    leave(log, 2, 105.0, entered=40, how="exit")
    for r in (0, 1):
        log.add(f"s{r}", "heartbeat", {"groups": [
            {"group": "0", "entered": 41, "completed": 40, "inflight_op": "all_reduce",
             "inflight_since": 104.9}]}, t=104.95)
        log.add(f"s{r}", "error", {"where": "collective", "error_type": "RuntimeError",
                                   "error": CLOSED, "group": "0", "op": "all_reduce",
                                   "seq": 41}, t=105.1)
    leave(log, 0, 105.3, entered=41, how="exit")
    leave(log, 1, 105.35, entered=41, how="exit")
    found = diagnose(log.state(), 110.0, S)
    assert kinds(found) == [("rank_exited_early", [2])], found
    assert set(found[0]["evidence"]["victims"]) == {"0", "1"}


def test_a_rank_that_goes_on_to_a_barrier_the_others_never_call_is_odd_not_those_that_left():
    """rank 0 alone registers an ``atexit`` barrier; ranks 1 and 2 finish the same 200
    collectives, destroy their group and exit 0. Rank 0's barrier then fails on their closed
    connections (corpus: atexit_barrier_rank0). Two that left together outvote one that went
    on: rank 0 is named, not an early leaver."""
    log = running(3)
    log.add("s0", "heartbeat", {"groups": [
        {"group": "0", "entered": 201, "completed": 200, "inflight_op": "barrier",
         "inflight_since": 104.9}]}, t=104.95)
    leave(log, 1, 105.0, entered=200)
    leave(log, 2, 105.02, entered=200)
    (f,) = diagnose(log.state(), 105.7, S)
    assert (f["kind"], f["severity"], f["ranks"]) == ("desync", "critical", [0])
    assert f["summary"].startswith("Rank 0 called collective #201 (barrier) on group 0 after "
                                   "ranks 1, 2 had finished")
    assert "atexit" in f["hint"] and f["first_seen"] == 105.02
    log.add("s0", "error", {"where": "collective", "error_type": "RuntimeError",
                            "error": CLOSED, "group": "0", "op": "barrier", "seq": 201},
            t=105.8)
    for r in (1, 2):
        log.add(f"s{r}", "exit", {"clean": True, "reason": "exit", "exitcode": 0}, t=105.9)
    log.add("s0", "exit", {"clean": True, "reason": "exit", "exitcode": 0}, t=106.0)
    found = diagnose(log.state(), 110.0, S)
    assert kinds(found) == [("desync", [0])], found
    assert CLOSED in found[0]["evidence"]["errors"]["0"]


def test_one_rank_that_leaves_where_one_goes_on_is_still_the_early_leaver():
    """Two ranks: one leaves, one goes on. No majority: the leaver is named, as before."""
    log = running(2)
    leave(log, 1, 105.0, entered=40)
    log.add("s0", "heartbeat", {"groups": [
        {"group": "0", "entered": 41, "completed": 40, "inflight_op": "all_reduce",
         "inflight_since": 105.5}]}, t=105.6)
    assert kinds(diagnose(log.state(), 105.7, S)) == [("rank_exited_early", [1])]


def crash_in_a_collective(log, at=105.0):
    """Rank 1 raises in its loop; its ``finally: destroy_process_group()`` closes its
    connections; rank 0's and rank 2's next all_reduce fails on them."""
    leave(log, 1, at, entered=40, alive_after=None)
    for r in (0, 2):
        log.add(f"s{r}", "heartbeat", {"groups": [
            {"group": "0", "entered": 41, "completed": 40, "inflight_op": "all_reduce",
             "inflight_since": at - 0.2}]}, t=at - 0.1)
    return {"where": "uncaught", "error_type": "RuntimeError",
            "error": "RuntimeError: injected failure on rank 1"}


def test_a_victim_that_leaves_on_its_way_out_of_the_error_is_not_blamed_while_it_reports():
    """The crash demo on a loaded machine: rank 0's finally destroyed its group before its
    error reached the agent, and before rank 1's error came in. Nobody may be named for that
    moment but the rank that crashed, and it only once its error is in."""
    log = running(3)
    error = crash_in_a_collective(log)
    leave(log, 0, 105.2, entered=41, alive_after=None)  # its error is still on its way
    log.add("s2", "error", {"where": "collective", "error_type": "RuntimeError",
                            "error": CLOSED, "group": "0", "op": "all_reduce", "seq": 41},
            t=105.2)
    log.add("s2", "exit", {"clean": False, "reason": "uncaught exception"}, t=105.3)
    for now in (105.3, 106.0, 110.0):
        assert diagnose(log.state(), now, S) == [], now
    log.add("s1", "error", error, t=105.4)
    log.add("s1", "exit", {"clean": False, "reason": "uncaught exception"}, t=105.5)
    assert kinds(diagnose(log.state(), 110.0, S)) == [("rank_failed", [1])]
    log.add("s0", "error", {"where": "uncaught", "error_type": "RuntimeError",
                            "error": CLOSED}, t=105.6)
    log.add("s0", "exit", {"clean": False, "reason": "uncaught exception"}, t=105.7)
    (f,) = diagnose(log.state(), 110.0, S)
    assert (f["kind"], f["ranks"]) == ("rank_failed", [1])
    assert set(f["evidence"]["victims"]) == {"0", "2"}, f["evidence"]


def test_a_rank_that_catches_a_peers_crash_and_exits_cleanly_did_not_leave_early():
    """``except Exception: log it`` then a clean exit: rank 0 left after rank 1 crashed."""
    log = running(3)
    error = crash_in_a_collective(log)
    log.add("s1", "error", error, t=105.1)
    log.add("s1", "exit", {"clean": False, "reason": "uncaught exception"}, t=105.2)
    leave(log, 0, 105.3, entered=41, how="exit")
    log.add("s2", "error", {"where": "collective", "error_type": "RuntimeError",
                            "error": CLOSED, "group": "0", "op": "all_reduce", "seq": 41},
            t=105.3)
    found = diagnose(log.state(), 110.0, S)
    assert kinds(found) == [("rank_failed", [1])], found


def test_ranks_that_all_finish_together_are_not_early():
    log = running(3)
    for r in range(3):
        leave(log, r, 200.0 + r, entered=40, fr=12, how=("left", "exit", "left")[r])
    assert diagnose(log.state(), 210.0, S) == []


def test_a_hung_job_that_is_stopped_keeps_its_hang_and_blames_no_one_else():
    log = running(4)
    for r in (0, 1, 3):  # rank 2 never comes to all_reduce #41
        log.add(f"s{r}", "heartbeat", {"groups": [
            {"group": "0", "entered": 41, "completed": 40, "inflight_op": "all_reduce",
             "inflight_since": 100.0}]}, t=170.0)
    log.add("s2", "heartbeat", {"groups": [
        {"group": "0", "entered": 40, "completed": 40, "inflight_op": None,
         "inflight_since": None}]}, t=170.0)
    (hang,) = diagnose(log.state(), 170.0, S)
    assert (hang["kind"], hang["ranks"]) == ("hang", [2])
    # Ctrl-C on torchrun: SIGTERM to every worker, their connections close within a second.
    for r, t in ((0, 171.0), (1, 171.2), (2, 171.3), (3, 171.9)):
        log.add(f"s{r}", "disconnect", {}, t=t)
    for now in (172.0, 180.0, 400.0):
        found = diagnose(log.state(), now, S)
        assert kinds(found) == [("hang", [2])], (now, found)
        assert found[0]["evidence"]["stopped"] == {"at": 171.0, "ranks": [0, 1, 2, 3]}
        assert found[0]["id"] == hang["id"]  # the same verdict, not a new one


def test_ranks_that_time_out_in_a_hung_collective_are_victims_of_the_hang():
    log = running(3)
    history(log, 3)
    for r in (0, 1):
        log.add(f"s{r}", "heartbeat", {"groups": [
            {"group": "0", "entered": 41, "completed": 40, "inflight_op": "all_reduce",
             "inflight_since": 100.0}]}, t=111.0)
    log.add("s2", "heartbeat", {"groups": [
        {"group": "0", "entered": 40, "completed": 40, "inflight_op": None,
         "inflight_since": None}]}, t=111.0)
    assert kinds(diagnose(log.state(), 111.0, S)) == [("stall", [2])]
    timeout = ("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
               "waiting 15000ms for recv operation to complete")
    for r in (0, 1):  # the collective's own timeout (15 s) ends them
        log.add(f"s{r}", "error", {"where": "collective", "error_type": "RuntimeError",
                                   "error": timeout, "group": "0", "op": "all_reduce",
                                   "seq": 41}, t=115.0)
        log.add(f"s{r}", "exit", {"clean": False, "reason": "uncaught exception"}, t=115.1)
    log.add("s2", "disconnect", {}, t=115.5)  # torchrun terminates the rest
    found = diagnose(log.state(), 130.0, S)
    assert kinds(found) == [("stall", [2])], found


def waiting_for_rank_2(log, op, since, t):
    """Ranks 0 and 1 inside ``op`` #41 since ``since``; rank 2 never entered it."""
    for r in (0, 1):
        log.add(f"s{r}", "heartbeat", {"groups": [
            {"group": "0", "entered": 41, "completed": 40, "inflight_op": op,
             "inflight_since": since}]}, t=t)
    log.add("s2", "heartbeat", {"groups": [
        {"group": "0", "entered": 40, "completed": 40, "inflight_op": None,
         "inflight_since": None}]}, t=t)


def test_a_collective_timeout_shorter_than_the_stall_floor_is_the_hang_of_the_rank_missing():
    """init_process_group(timeout=5 s): the others' gloo gives up before a stall could form
    (10 s); the rank that never entered is the hang, not a victim's error or its kill."""
    log = running(3)
    history(log, 3)
    waiting_for_rank_2(log, "all_reduce", 101.0, 104.0)
    assert diagnose(log.state(), 104.0, S) == []
    timeout = ("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
               "waiting 5000ms for recv operation to complete")
    log.add("s0", "error", {"where": "collective", "error_type": "RuntimeError",
                            "error": timeout, "group": "0", "op": "all_reduce", "seq": 41},
            t=106.0)
    log.add("s0", "exit", {"clean": False, "reason": "uncaught exception"}, t=106.1)
    (f,) = diagnose(log.state(), 106.5, S)
    assert (f["kind"], f["severity"], f["ranks"]) == ("hang", "critical", [2])
    assert f["evidence"]["stopped"]["timed_out"] == {
        "0": "gloo collective timed out waiting for a peer"}
    assert "Rank 0's own timeout ended the wait" in f["summary"], f["summary"]
    log.add("s1", "error", {"where": "collective", "error_type": "RuntimeError",
                            "error": timeout, "group": "0", "op": "all_reduce", "seq": 41},
            t=106.05)
    log.add("s1", "exit", {"clean": False, "reason": "uncaught exception"}, t=106.2)
    log.add("s2", "disconnect", {}, t=106.6)  # torchrun terminates the rest
    assert kinds(diagnose(log.state(), 120.0, S)) == [("hang", [2])]


def test_a_monitored_barrier_that_names_a_rank_is_the_hang_of_that_rank():
    """monitored_barrier(timeout=5 s): rank 1's error (about rank 0, which runs the barrier)
    comes in first, then rank 0's, which names rank 2; torchrun then kills rank 2."""
    log = running(3)
    history(log, 3)
    waiting_for_rank_2(log, "monitored_barrier", 101.0, 105.5)
    log.add("s1", "error", {"where": "uncaught", "error_type": "RuntimeError", "error": (
        "Rank 1 successfully reached monitoredBarrier, but received errors while waiting for "
        "send/recv from rank 0. Please check rank 0 logs for faulty rank.\n Original "
        "exception: \n" + CLOSED)}, t=106.02)
    log.add("s1", "exit", {"clean": False, "reason": "uncaught exception"}, t=106.1)
    assert kinds(diagnose(log.state(), 106.5, S)) == [("hang", [2])]
    log.add("s0", "error", {"where": "uncaught", "error_type": "RuntimeError",
                            "error": "[Rank 0]: Ranks 2 failed to pass monitoredBarrier in "
                                     "5000 ms"}, t=106.01)
    log.add("s0", "exit", {"clean": False, "reason": "uncaught exception"}, t=106.15)
    log.add("s2", "disconnect", {}, t=106.6)
    (f,) = diagnose(log.state(), 120.0, S)
    assert (f["kind"], f["ranks"]) == ("hang", [2]) and f["evidence"]["waiting"] == [0, 1]


def test_a_collective_timeout_while_every_peer_is_inside_blames_no_missing_rank():
    """A timeout that is not about a missing rank (all ranks were in the collective) makes no
    hang at once: the crash rules speak for it."""
    log = running(2)
    history(log, 2)
    for r in (0, 1):
        log.add(f"s{r}", "heartbeat", {"groups": [
            {"group": "0", "entered": 41, "completed": 41, "inflight_op": None,
             "inflight_since": None}]}, t=104.0)
    timeout = "Timed out waiting 5000ms for recv operation to complete"
    log.add("s0", "error", {"where": "collective", "error_type": "RuntimeError",
                            "error": timeout, "group": "0", "op": "all_reduce", "seq": 42},
            t=106.0)
    log.add("s0", "exit", {"clean": False, "reason": "uncaught exception"}, t=106.1)
    assert "hang" not in {f["kind"] for f in diagnose(log.state(), 110.0, S)}


def test_a_python_barrier_where_the_others_are_inside_ddp_is_a_desync_of_that_rank():
    log = running(4)

    def heartbeats(t):
        for r in (0, 1, 2):  # inside DDP's bucket all-reduce: the Flight Recorder's #301
            log.add(f"s{r}", "heartbeat", {"groups": [
                {"group": "0", "entered": 10, "completed": 10, "inflight_op": None,
                 "inflight_since": None, "fr_enqueued": 301, "fr_completed": 300,
                 "fr_inflight_since": 150.0}]}, t=t)
        # Rank 3's data ran out: it went on to the end-of-epoch barrier, also #301 there.
        log.add("s3", "heartbeat", {"groups": [
            {"group": "0", "entered": 11, "completed": 10, "inflight_op": "barrier",
             "inflight_since": 150.0, "inflight_fr": 301, "fr_enqueued": 301,
             "fr_completed": 300, "fr_inflight_since": 150.0}]}, t=t)

    heartbeats(151.0)
    assert diagnose(log.state(), 151.0, S) == []  # held two heartbeats: both are snapshots
    for now in (152.0, 175.0, 230.0):  # and no stall or hang blames the ranks in DDP
        heartbeats(now)
        found = diagnose(log.state(), now, S)
        assert kinds(found) == [("desync", [3])], (now, found)
    assert "barrier" in found[0]["summary"] and "Join" in found[0]["hint"]


def test_ranks_the_launcher_terminates_after_a_kill_are_not_blamed():
    log = running(4)
    log.add("s1", "disconnect", {}, t=110.0)  # SIGKILL: the OOM killer
    for r, t in ((0, 110.12), (2, 110.13), (3, 110.2)):  # torchrun stops the rest
        log.add(f"s{r}", "disconnect", {}, t=t)
    assert kinds(diagnose(log.state(), 112.0, S)) == [("rank_lost", [1])]


def test_a_job_whose_ranks_all_vanish_at_once_was_stopped_from_outside_and_blames_no_one():
    """``scancel`` (or a preemption, a time limit) sends SIGTERM to every rank at once; with no
    handler each dies of it, and no rank reports anything."""
    log = running(3)
    for r, t in ((2, 110.0), (1, 110.0001), (0, 110.0116)):
        log.add(f"s{r}", "disconnect", {}, t=t)
    assert diagnose(log.state(), 110.5, S) == []  # they may still reconnect
    (f,) = diagnose(log.state(), 112.0, S)
    assert (f["kind"], f["severity"], f["ranks"]) == ("rank_lost", "info", [])
    assert f["summary"].startswith("All 3 ranks vanished within 12 ms"), f["summary"]
    assert set(f["evidence"]["lost"]) == {"0", "1", "2"} and "scancel" in f["hint"]
    for spaced in ((0.0, 0.0005, 0.0009), (0.0, 0.015, 0.0275)):  # corpus healthy_scancel,
        log = running(3)  # quiet and beside a CPU hog: spaced evenly, one burst
        for r, t in zip((1, 2, 0), spaced):
            log.add(f"s{r}", "disconnect", {}, t=110.0 + t)
        assert kinds(diagnose(log.state(), 112.0, S)) == [("rank_lost", [])], spaced
    log = running(3)  # one rank first, the launcher's stop of the others 60 ms later
    log.add("s1", "disconnect", {}, t=110.0)
    for r in (0, 2):
        log.add(f"s{r}", "disconnect", {}, t=110.06)
    assert kinds(diagnose(log.state(), 112.0, S)) == [("rank_lost", [1])]
    log = running(3)  # mp.spawn's parent stops the others 18 ms after rank 1 was killed
    for r, t in ((1, 110.0), (0, 110.0178), (2, 110.0197)):
        log.add(f"s{r}", "disconnect", {}, t=t)
    assert kinds(diagnose(log.state(), 112.0, S)) == [("rank_lost", [1])]


def ended_boards(log, t, ended):
    """The host reader's last words with how each rank's process ended (no groups)."""
    log.add("s0", "boards", {"t": t, "reader_pid": 77, "boards": [
        {"rank": r, "pid": 100 + r, "alive": False, "groups": [],
         **({"ended": how} if how else {})} for r, how in ended.items()]}, t=t)


def failed_on_peer(log, r, t):
    """Rank ``r``'s all_reduce fails on a peer's closed connection at ``t``; it exits so."""
    log.add(f"s{r}", "error", {"where": "collective", "error_type": "RuntimeError",
                               "error": RESET, "group": "0", "op": "all_reduce", "seq": 9}, t=t)
    log.add(f"s{r}", "exit", {"clean": False, "reason": "uncaught exception"}, t=t + 0.01)
    log.add(f"s{r}", "disconnect", {}, t=t + 0.02)


def test_how_each_rank_ended_tells_a_cancelled_job_from_a_crash_and_the_launchers_stop():
    """Corpus: healthy_moe_scancel. Three ranks SIGTERMed together on a loaded host died 0,
    24.9 and 36.1 ms apart: by timing alone the first went alone and the launcher stopped the
    rest (a critical rank_lost on a cancelled healthy job). The host reader saw each end by
    SIGTERM (each a zombie until torchrun reaped it): a stop from outside."""
    spaced = ((1, 110.0), (0, 110.0249), (2, 110.0361))
    log = running(3)
    for r, t in spaced:
        log.add(f"s{r}", "disconnect", {}, t=t)
    assert kinds(diagnose(log.state(), 112.0, S)) == [("rank_lost", [1])]  # (timing alone)
    ended_boards(log, 110.3, {r: {"signal": "SIGTERM"} for r in range(3)})
    (f,) = diagnose(log.state(), 112.0, S)
    assert (f["kind"], f["severity"], f["ranks"]) == ("rank_lost", "info", []), f
    assert f["summary"] == ("All 3 ranks vanished within 36 ms, none with an exit or an error "
                            "of its own (their host's reader saw each end by SIGTERM), rank 1 "
                            "first, 25 ms before the others: the job was stopped from "
                            "outside."), f["summary"]
    assert f["evidence"]["lost"]["1"]["ended"] == "SIGTERM"
    # judged after the first death's grace, before the last one's: nobody named meanwhile
    assert diagnose(log.state(), 110.0 + S.reconnect_grace + 0.01, S) == []
    # one of them reaped before its reader looked (unknown): the first's SIGTERM still says
    # it was stopped, not crashed
    log = running(3)
    for r, t in spaced:
        log.add(f"s{r}", "disconnect", {}, t=t)
    ended_boards(log, 110.3, {0: None, 1: {"signal": "SIGTERM"}, 2: {"signal": "SIGTERM"}})
    assert kinds(diagnose(log.state(), 112.0, S)) == [("rank_lost", [])]
    # a crash, then the launcher's SIGTERM to the rest within a millisecond: by timing a
    # burst, but rank 1's reader saw it abort: it is named, with what SIGABRT means
    log = running(3)
    for r, t in ((1, 110.0), (0, 110.0004), (2, 110.0008)):
        log.add(f"s{r}", "disconnect", {}, t=t)
    assert kinds(diagnose(log.state(), 112.0, S)) == [("rank_lost", [])]  # (timing alone)
    ended_boards(log, 110.3, {0: {"signal": "SIGTERM"}, 1: {"signal": "SIGABRT"},
                              2: {"signal": "SIGTERM"}})
    (f,) = diagnose(log.state(), 112.0, S)
    assert (f["kind"], f["severity"], f["ranks"]) == ("rank_lost", "critical", [1]), f
    assert f["evidence"]["ended"] == "SIGABRT" and "it ended by SIGABRT" in f["summary"]
    assert "C++ abort" in f["hint"] and "process 101" in f["hint"]


def test_a_rank_that_failed_on_its_cancelled_peers_before_its_own_sigterm_is_no_culprit():
    """scancel signals one process after another: on a loaded host rank 2 read its peers'
    closed connections (gloo's error, reported) before its own SIGTERM came. Ranks 0 and 1
    were seen to end by SIGTERM: the job was stopped, and rank 2's error is a consequence."""
    log = running(3)
    for r, t in ((0, 110.0), (1, 110.004)):
        log.add(f"s{r}", "disconnect", {}, t=t)
    failed_on_peer(log, 2, 110.01)
    assert [f["severity"] for f in diagnose(log.state(), 112.0, S)] == ["critical"]  # no boards
    ended_boards(log, 110.3, {0: {"signal": "SIGTERM"}, 1: {"signal": "SIGTERM"},
                              2: {"code": 1}})
    (f,) = diagnose(log.state(), 112.0, S)
    assert (f["kind"], f["severity"], f["ranks"]) == ("rank_lost", "info", []), f
    assert f["summary"] == ("Ranks 0, 1 vanished within 4 ms (their host's reader saw each end "
                            "by SIGTERM), and rank 2 failed on their closed connections before "
                            "its own stop came: the job was stopped from outside."), f["summary"]
    assert f["evidence"]["failed_on_peers"] == [2]
    # one rank SIGTERMed (``kill``), the others failing on it, not stopped themselves: lost
    log = running(3)
    log.add("s0", "disconnect", {}, t=110.0)
    for r in (1, 2):
        failed_on_peer(log, r, 110.01)
    ended_boards(log, 110.3, {0: {"signal": "SIGTERM"}, 1: {"code": 1}, 2: {"code": 1}})
    assert kinds(diagnose(log.state(), 112.0, S)) == [("rank_lost", [0])]
    ended_boards(log, 110.4, {1: {"signal": "SIGTERM"}})  # ... unless one of them was
    assert kinds(diagnose(log.state(), 112.0, S)) == [("rank_lost", [])]
    # a node preempted (its ranks SIGTERMed), the other node's ranks failing on it: that
    # node's ranks are named, with how they ended
    log = running(4)
    for r in range(4):
        log.add(f"s{r}", "hello", hello(r, world=4, host=f"node{r // 2}"), t=100.5)
        progress(log, r, 109.5, ("0", 5, 5, None, None))
    for r, t in ((2, 110.0), (3, 110.003)):
        log.add(f"s{r}", "disconnect", {}, t=t)
    for r in (0, 1):
        failed_on_peer(log, r, 110.01)
    log.add("s2", "boards", {"t": 110.3, "reader_pid": 78, "boards": [
        {"rank": r, "pid": 100 + r, "alive": False, "groups": [],
         "ended": {"signal": "SIGTERM"}} for r in (2, 3)]}, t=110.3)
    (f,) = diagnose(log.state(), 112.0, S)
    assert (f["kind"], f["severity"], f["ranks"]) == ("rank_lost", "critical", [2, 3]), f
    assert "node1" in f["summary"] and "saw each end by SIGTERM" in f["hint"], f


def test_a_rank_killed_then_the_launchers_sigterm_to_the_rest_is_named_however_spaced():
    """Corpus: ddp_kill9 on a loaded host. Rank 3 SIGKILLed, torchrun SIGTERMs the rest: the
    deaths came 0, 13.4, 31.4 and 38.3 ms apart, one burst by timing (the job stopped from
    outside). Rank 3's SIGTERM mark stayed empty (torchrun had reaped it: how, not known)
    while the others' say SIGTERM: it went otherwise, first, and the rest because of it."""
    log = running(4)
    for r, t in ((3, 110.0), (0, 110.0134), (1, 110.0314), (2, 110.0383)):
        log.add(f"s{r}", "disconnect", {}, t=t)
    assert kinds(diagnose(log.state(), 112.0, S)) == [("rank_lost", [])]  # (timing alone)
    ended_boards(log, 110.1, {0: {"signal": "SIGTERM"}, 1: {"signal": "SIGTERM"},
                              2: {"signal": "SIGTERM"}, 3: {"not_sigterm": True}})
    (f,) = diagnose(log.state(), 112.0, S)
    assert (f["kind"], f["severity"], f["ranks"]) == ("rank_lost", "critical", [3]), f
    assert "ended" not in f["evidence"], f["evidence"]  # (how, nobody saw)


def test_a_rank_killed_alone_says_what_its_signal_means():
    log = running(3)
    log.add("s1", "disconnect", {}, t=110.0)  # the OOM killer
    for r in (0, 2):  # torchrun's stop, 80 ms later
        log.add(f"s{r}", "disconnect", {}, t=110.08)
    ended_boards(log, 110.3, {0: {"signal": "SIGTERM"}, 1: {"signal": "SIGKILL"},
                              2: {"signal": "SIGTERM"}})
    (f,) = diagnose(log.state(), 112.0, S)
    assert (f["kind"], f["ranks"], f["evidence"]["ended"]) == ("rank_lost", [1], "SIGKILL")
    assert "OOM killer" in f["hint"] and "kill -9" in f["hint"]
    log = running(3)  # exited with a status, its agent silent (os._exit)
    log.add("s1", "disconnect", {}, t=110.0)
    ended_boards(log, 110.3, {1: {"code": 7}})
    for r in (0, 2):  # the others still report
        progress(log, r, 112.0, ("0", 5, 5, None, None))
    (f,) = diagnose(log.state(), 112.0, S)
    assert f["ranks"] == [1] and "exited with status 7" in f["hint"], f


def test_ranks_of_one_host_killed_together_are_one_finding():
    # a node that loses power takes all its ranks at once: one critical, not one per rank
    log = running(4)
    for r in (1, 2):
        log.add(f"s{r}", "hello", hello(r, world=4, host="node1"), t=100.5)
        log.add(f"s{r}", "disconnect", {}, t=110.0)
    for r in (0, 3):  # the others still report
        progress(log, r, 112.0, ("0", 5, 5, None, None))
    (f,) = diagnose(log.state(), 112.0, S)
    assert (f["kind"], f["ranks"], f["id"]) == ("rank_lost", [1, 2], "rank_lost:-:r1")
    assert f["summary"].startswith("Ranks 1, 2 vanished together on node1"), f["summary"]
    assert f["evidence"]["lost"]["2"]["pid"] == 102 and "`last -x`" in f["hint"]
    assert f["hint"].startswith("Every rank of node1 went at the same moment")


def test_ranks_of_one_host_killed_apart_by_a_crowded_scheduler_went_together_with_no_launcher():
    """Corpus: node_lost_two_ranks (processes started by hand). Both ranks of node1 killed
    at one step, 18 ms apart on a loaded host: no launcher stops a job's other processes
    there, so the second went with the first, not because of it. Under torchrun the same
    timing is its stop of the rest after it saw the first die."""
    for launcher, named in (("python", [[2, 3]]), ("torchrun", [[2]])):
        log = running(4)
        for r in range(4):
            log.add(f"s{r}", "hello", {**hello(r, world=4, host="node1" if r > 1 else "node0"),
                                       "launcher": launcher}, t=100.5)
        log.add("s2", "disconnect", {}, t=110.0)
        log.add("s3", "disconnect", {}, t=110.018)
        for r in (0, 1):
            progress(log, r, 112.0, ("0", 5, 5, None, None))
        found = diagnose(log.state(), 112.0, S)
        assert [f["ranks"] for f in found if f["kind"] == "rank_lost"] == named, launcher


def test_ranks_of_a_host_whose_other_ranks_still_report_are_not_blamed_on_the_host():
    log = running(4)
    for r in (1, 2):
        log.add(f"s{r}", "disconnect", {}, t=110.0)
    for r in (0, 3):  # node0's other ranks
        progress(log, r, 112.0, ("0", 5, 5, None, None))
    (f,) = diagnose(log.state(), 112.0, S)
    assert f["ranks"] == [1, 2] and "while its ranks 0, 3 still report: not the host" in f["hint"]


def test_ranks_of_one_host_silent_together_are_one_finding():
    """A host that panics or loses power closes no connection: its ranks' heartbeats stop
    together, and they are named together once silent for lost_after."""
    log = running(4)
    for r in (2, 3):
        log.add(f"s{r}", "hello", hello(r, world=4, host="node1"), t=100.5)
        progress(log, r, 110.0 + r * 0.4, ("0", 5, 5, None, None))
    for t in range(110, 131):  # node0's ranks go on
        for r in (0, 1):
            progress(log, r, float(t), ("0", 5, 5, None, None))
    assert diagnose(log.state(), 125.5, S) == []
    (f,) = diagnose(log.state(), 127.0, S)
    assert (f["kind"], f["severity"], f["ranks"]) == ("rank_lost", "critical", [2, 3])
    assert f["summary"].startswith("Ranks 2, 3 went silent together on node1"), f["summary"]
    assert "`ping node1`" in f["hint"] and f["first_seen"] == 110.8 + S.lost_after


def test_ranks_of_different_hosts_killed_together_are_each_named():
    log = running(4)
    log.add("s2", "hello", hello(2, world=4, host="node1"), t=100.5)
    for r in (1, 2):
        log.add(f"s{r}", "disconnect", {}, t=110.0)
    for r in (0, 3):
        progress(log, r, 112.0, ("0", 5, 5, None, None))
    assert sorted(kinds(diagnose(log.state(), 112.0, S))) == [("rank_lost", [1]),
                                                              ("rank_lost", [2])]


def test_ranks_interrupted_by_ctrl_c_are_not_blamed():
    """Ctrl-C in torchrun's terminal reaches every worker: they fail with KeyboardInterrupt
    out of their collective. Someone stopped the job; no rank is at fault."""
    log = running(2)
    for r in (0, 1):
        log.add(f"s{r}", "error", {"where": "collective", "error_type": "KeyboardInterrupt",
                                   "error": "KeyboardInterrupt()", "group": "0",
                                   "op": "all_reduce", "seq": 7}, t=105.0)
        log.add(f"s{r}", "exit", {"clean": False, "reason": "exit"}, t=105.1)
    assert diagnose(log.state(), 110.0, S) == []


def test_a_straggler_that_the_others_wait_for_once_a_step_among_many_collectives():
    """FSDP: six collectives a step (all-gathers, reduce-scatters); the others wait 60 ms for
    rank 2 at the step's first one only, one in six: never nine in ten."""
    from tests.helpers.events import half_seconds

    step_others = [60.0] + [0.5] * 5
    step_slow = [0.4] * 6
    log = running(3)
    for r in (0, 1):
        half_seconds(log, r, [step_others * 4] * 3)
    half_seconds(log, 2, [step_slow * 4] * 3)
    (f,) = diagnose(log.state(), 102.0, S)
    assert (f["kind"], f["ranks"]) == ("straggler", [2])
    assert f["summary"].startswith("Rank 2 is a straggler") and "17%" in f["summary"]


def test_a_crowded_hosts_few_extra_late_arrivals_of_one_rank_of_a_pair_are_no_straggler():
    """A healthy 2x2 mesh beside a CPU hog: the scheduler made rank 1 late at 1 or 2 more
    collectives a second than rank 0 (5 long waits of rank 0 against 1 of rank 1 in 48). At
    one in ten and a quarter of it, that passed the shares; the counts are too few to mean
    anything (a sign test: p 0.11 on 48 collectives, 0.02 on 96), so nobody is named."""
    from tests.helpers.events import half_seconds

    def interval(long):
        return [40.0] * long + ([4.0, 5.0, 6.0] * 8)[:24 - long]

    log = running(2)
    half_seconds(log, 0, [interval(n) for n in (3, 2, 3, 2)])
    half_seconds(log, 1, [interval(n) for n in (0, 1, 0, 1)])
    assert diagnose(log.state(), 102.5, S) == []
    # The same shares from a rank late at every step stay a straggler (12 against 0).
    log = running(2)
    half_seconds(log, 0, [interval(n) for n in (3, 3, 3, 3)])
    half_seconds(log, 1, [interval(0)] * 4)
    (f,) = diagnose(log.state(), 102.5, S)
    assert (f["kind"], f["ranks"]) == ("straggler", [1])


def test_one_crowded_half_second_of_a_busy_group_is_no_straggler_until_the_next_says_so():
    """CI, a healthy 2-rank FSDP job beside other tests: for one summary the scheduler kept
    rank 1 off its core, so rank 0 waited 7 ms for it at one in five of 120 collectives, the
    sparse straggler's picture. A window of one summary is confirmed by the one before."""
    from tests.helpers.events import half_seconds

    calm = [0.6, 0.8, 1.0, 1.2] * 30
    late = ([7.0] + [0.6, 0.8, 1.0, 1.2]) * 24
    log = running(2)
    half_seconds(log, 0, [calm, calm, calm, late])
    half_seconds(log, 1, [calm, calm, calm, [0.7] * 120])
    assert diagnose(log.state(), 102.5, S) == []
    # The next summary late too: a straggler that persists is named one summary later.
    half_seconds(log, 0, [late], start=103.0)
    half_seconds(log, 1, [[0.7] * 120], start=103.0)
    (f,) = diagnose(log.state(), 103.0, S)
    assert (f["kind"], f["ranks"]) == ("straggler", [1])


def test_a_victim_whose_newest_summaries_are_not_in_yet_is_not_the_straggler():
    """The corpus's plain all_reduce loop, 3 ranks: rank 1 became 60 ms late a step. Ranks 0
    and 2 wait for it, but rank 2's summaries of those steps are not in yet: judged on an
    older stretch of time than the others, it waited least and was named. The ranks are
    compared over the time all of them have reported."""
    from tests.helpers.events import half_seconds

    healthy = [1.0, 1.5, 2.0, 2.5] * 6
    for late in (1, 2):
        log = running(3)
        half_seconds(log, 0, [healthy] * 4 + [[60.0] * 7] * late)
        half_seconds(log, 1, [healthy] * 4 + [[0.5] * 7] * late)
        half_seconds(log, 2, [[0.8, 1.2, 1.6, 2.0] * 6] * 4)
        now = 101.0 + 0.5 * (3 + late)
        assert diagnose(log.state(), now, S) == [], late
        # Rank 2's summaries come in: the straggler is named, not its victim.
        half_seconds(log, 2, [[60.0] * 7] * late, start=103.0)
        (f,) = diagnose(log.state(), now, S)
        assert (f["kind"], f["ranks"]) == ("straggler", [1]), (late, f)


def test_the_victim_of_a_young_straggler_in_another_group_is_not_named():
    """pgdash demo --scenario straggler: a 2x2 mesh (tp "tp0" = [0, 1], "tp1" = [2, 3]; dp
    "dp0" = [0, 2], "dp1" = [1, 3]), where rank 3 became 30 ms slower a step 1.5 s ago. Rank
    1 waits for it in dp1 (DDP's all-reduce, whose waits spread to 7 ms when healthy) and
    so arrives 30 ms late in tp0. Twelve late steps in 48 are the sparse case; dp1's newest
    summary is not in yet, and its 8 long waits are too few for a verdict there, yet they
    tell whom rank 1 waited for. Named before: rank 1, in tp0."""
    from tests.helpers.events import half_seconds

    log = running(4, groups=(("tp0", [0, 1]), ("tp1", [2, 3]), ("dp0", [0, 2]),
                              ("dp1", [1, 3])))

    def waits(healthy, late, young=3):  # half seconds of 4 steps each
        return [healthy] * (12 - young) + [[late] * 4] * young

    for rank, late in ((0, 30.0), (1, 1.0)):
        half_seconds(log, rank, waits([1.0, 2.0] * 2, late), group="tp0")
    for rank, late in ((2, 30.0), (3, 1.0)):
        half_seconds(log, rank, waits([1.0, 2.0] * 2, late), group="tp1")
    for rank, late in ((1, 30.0), (3, 2.5)):  # one summary behind
        half_seconds(log, rank, waits([2.5, 3.0, 5.0, 7.0], late, young=2)[:-1],
                     group="dp1")
    for rank in (0, 2):
        half_seconds(log, rank, [[2.5, 3.0, 5.0, 7.0]] * 11, group="dp0")
    found = diagnose(log.state(), 107.0, S)
    assert {f["group"]: f["ranks"] for f in found} == {"tp0": [3], "tp1": [3]}
    tp0 = next(f for f in found if f["group"] == "tp0")
    assert [(h["waits"], h["rank"], h["group"]) for h in tp0["evidence"]["chain"]] == [
        (1, 3, "dp1")]
    assert "rank 1 waits for rank 3 inside" in tp0["summary"]


def test_one_pause_among_many_collectives_is_no_straggler():
    """Rank 0 checkpoints for 5 s once: the others wait once, long; nothing else differs."""
    from tests.helpers.events import half_seconds

    log = running(3)
    calm = [0.5] * 24
    for r in (1, 2):
        half_seconds(log, r, [calm, [5000.0] + [0.5] * 23, calm])
    half_seconds(log, 0, [calm, [0.4] * 24, calm])
    assert diagnose(log.state(), 102.0, S) == []


def test_two_ranks_that_both_receive_first_deadlock_and_are_both_named():
    log = running(2)
    history(log, 2)
    log.add("s0", "heartbeat", {"groups": [p2p_row("0", {"recv:1:0": 1},
                                                   ("recv", 1, 0, 1, 100.0))]}, t=111.0)
    log.add("s1", "heartbeat", {"groups": [p2p_row("0", {"recv:0:0": 1},
                                                   ("recv", 0, 0, 1, 100.0))]}, t=111.0)
    (f,) = diagnose(log.state(), 111.0, S)
    assert (f["kind"], f["ranks"]) == ("stall", [0, 1])
    assert "wait for each other" in f["summary"] and "batch_isend_irecv" in f["hint"]


def test_a_stage_that_receives_from_the_wrong_peer_is_named_not_the_stages_behind_it():
    """A 3-stage pipeline (0 -> 1 -> 2); stage 2 receives once from src=0: rank 0 never sent to
    it, so rank 1's send to 2 and rank 0's send to 1 block behind it, closing a cycle. Only
    the wait on a channel never used is the fault (corpus: p2p_wrong_src)."""
    log = running(3)
    history(log, 3)
    log.add("s0", "heartbeat", {"groups": [p2p_row("0", {"send:1:0": 55},
                                                   ("send", 1, 0, 55, 100.0))]}, t=111.0)
    log.add("s1", "heartbeat", {"groups": [p2p_row("0", {"recv:0:0": 54, "send:2:0": 54},
                                                   ("send", 2, 0, 54, 100.0))]}, t=111.0)
    log.add("s2", "heartbeat", {"groups": [p2p_row("0", {"recv:1:0": 53, "recv:0:0": 1},
                                                   ("recv", 0, 0, 1, 100.0))]}, t=111.0)
    (f,) = diagnose(log.state(), 111.0, S)
    assert (f["kind"], f["ranks"]) == ("stall", [2])
    assert "rank 0 has never sent to it" in f["summary"] and "wrong `src`" in f["hint"]


def test_an_entry_left_open_by_a_python_call_that_raised_is_no_cpp_collective():
    """After a mismatch, a rank's all_reduce raised: the Flight Recorder keeps its entry open
    (#301) while the wrappers say it ended (fr_wrapped 301). A peer in a Python collective at
    #301 is not 'odd' against it."""
    log = running(2)

    def heartbeats(t):
        log.add("s0", "heartbeat", {"groups": [
            {"group": "0", "entered": 11, "completed": 11, "inflight_op": None,
             "inflight_since": None, "fr_enqueued": 301, "fr_completed": 300,
             "fr_inflight_since": 150.0, "fr_wrapped": 301}]}, t=t)
        log.add("s1", "heartbeat", {"groups": [
            {"group": "0", "entered": 11, "completed": 10, "inflight_op": "all_gather",
             "inflight_since": 150.0, "inflight_fr": 301, "fr_enqueued": 301,
             "fr_completed": 300, "fr_inflight_since": 150.0, "fr_wrapped": 301}]}, t=t)

    for now in (151.0, 160.0):
        heartbeats(now)
        assert [f for f in diagnose(log.state(), now, S) if f["kind"] == "desync"] == []


def test_a_desync_seen_on_two_of_four_ranks_waits_for_the_others_to_say_who_is_odd():
    log = running(4)

    def inflight(rank, op, t):
        log.add(f"s{rank}", "heartbeat", {"groups": [
            {"group": "0", "entered": 103, "completed": 102, "inflight_op": op,
             "inflight_since": 150.0, "inflight_dtype": "float32", "inflight_bytes": 4}]}, t=t)

    inflight(0, "all_gather", 150.2)
    inflight(1, "all_reduce", 150.3)
    assert [f for f in diagnose(log.state(), 150.5, S) if f["kind"] == "desync"] == []
    inflight(2, "all_reduce", 150.6)
    (f,) = [f for f in diagnose(log.state(), 151.0, S) if f["kind"] == "desync"]
    assert f["ranks"] == [0]


def test_others_waiting_at_a_barrier_for_rank_0s_checkpoint_is_no_stall_for_30_s():
    """Rank 0 saves a checkpoint (20 s) while the others wait at the barrier after it; the
    Flight Recorder shows the barrier in flight too (it numbers Python's collectives): it is
    the wrappers' view that judges it, with the barrier's own floor."""
    log = running(3)
    history(log, 3)

    def heartbeats(t):
        for r in (1, 2):
            log.add(f"s{r}", "heartbeat", {"groups": [
                {"group": "0", "entered": 41, "completed": 40, "inflight_op": "barrier",
                 "inflight_since": 100.0, "inflight_fr": 41, "fr_enqueued": 41,
                 "fr_completed": 40, "fr_inflight_since": 100.2, "fr_wrapped": 40}]}, t=t)
        log.add("s0", "heartbeat", {"groups": [
            {"group": "0", "entered": 40, "completed": 40, "inflight_op": None,
             "inflight_since": None, "fr_enqueued": 40, "fr_completed": 40,
             "fr_wrapped": 40}]}, t=t)

    for now in (111.0, 120.0, 129.0):
        heartbeats(now)
        assert diagnose(log.state(), now, S) == [], now
    heartbeats(131.0)
    (f,) = diagnose(log.state(), 131.0, S)
    assert (f["kind"], f["ranks"], f["evidence"]["source"]) == ("stall", [0], "python")
    assert f["evidence"]["barrier"] is True and f["evidence"]["threshold_s"] == 30.0


def _rank_0_alone_at_work(log, t, cores):
    """Ranks 1 and 2 wait at a barrier since t = 100 while rank 0, out of collectives since
    then, uses ``cores`` of a core (its agent's cpu_s)."""
    for r in (1, 2):
        log.add(f"s{r}", "heartbeat", {"groups": [
            {"group": "0", "entered": 41, "completed": 40, "inflight_op": "barrier",
             "inflight_since": 100.0}], "cpu_s": 5.0 + 0.01 * (t - 100.0)}, t=t)
    log.add("s0", "heartbeat", {"groups": [
        {"group": "0", "entered": 40, "completed": 40, "inflight_op": None,
         "inflight_since": None}], "cpu_s": 5.0 + cores * (t - 100.0)}, t=t)


def test_others_waiting_for_rank_0_at_work_is_a_stall_until_five_times_hang_after():
    """Rank 0 evaluates alone for minutes (bench/corpus/healthy_rank0_long_eval_barrier.py: a
    critical hang at 60 s on a healthy job before): while it works, the others' wait stays a
    stall, which says so, until 5 x --hang-after; a loop that never ends is named all along."""
    log = running(3)
    history(log, 3)

    def at(t):
        for beat in range(100, int(t), 10):
            if beat > at.last:
                _rank_0_alone_at_work(log, float(beat), 0.95)
                at.last = beat
        _rank_0_alone_at_work(log, t, 0.95)
        return diagnose(log.state(), t, S)
    at.last = 0

    (f,) = at(131.0)
    assert (f["kind"], f["severity"], f["ranks"]) == ("stall", "warning", [0])
    assert f["evidence"]["working"] == {"0": 0.95}, f["evidence"]
    assert "95% of a core" in f["hint"] and "after 300 s" in f["hint"], f["hint"]
    (f,) = at(250.0)
    assert (f["kind"], f["severity"], f["ranks"]) == ("stall", "warning", [0])
    (f,) = at(401.0)
    assert (f["kind"], f["severity"], f["ranks"]) == ("hang", "critical", [0])
    assert "Rank 0 has worked all along (the hang waited 300 s" in f["hint"], f["hint"]
    assert f["first_seen"] == 400.0


def test_others_waiting_for_rank_0_blocked_is_a_hang_at_hang_after():
    """The same wait where rank 0 uses no CPU (blocked: a lock, a dead filesystem): a hang at
    --hang-after, as before."""
    log = running(3)
    history(log, 3)
    for t in (100.0, 120.0, 140.0, 161.0):
        _rank_0_alone_at_work(log, t, 0.01)
    (f,) = diagnose(log.state(), 161.0, S)
    assert (f["kind"], f["severity"], f["ranks"]) == ("hang", "critical", [0])
    assert f["first_seen"] == 160.0


# torch/csrc/distributed/c10d/reducer.cpp's check at DDP's construction, as each rank of a real
# 3-rank job raised it when rank 2 built one more layer (bench/corpus/ddp_model_mismatch.py).
def _ddp_counts(rank, params, peer, peer_params):
    return (f"DDP expects same model across all ranks, but Rank {rank} has {params} params, "
            f"while rank {peer} has inconsistent {peer_params} params.")


def _every_rank_raises(log, texts, t=101.0):
    for r, text in enumerate(texts):
        log.add(f"s{r}", "error", {"where": "uncaught", "error_type": "RuntimeError",
                                   "error": text}, t=t + 0.01 * r)
        log.add(f"s{r}", "exit", {"clean": False, "reason": "uncaught exception"}, t=t + 0.1)


def test_a_model_built_differently_on_one_rank_blames_that_rank_though_every_rank_raises():
    log = running(3)
    _every_rank_raises(log, [_ddp_counts(0, 4, 2, 6), _ddp_counts(1, 4, 2, 6),
                             _ddp_counts(2, 6, 0, 4)])
    (f,) = diagnose(log.state(), 105.0, S)
    assert (f["kind"], f["ranks"]) == ("rank_failed", [2]), f
    assert f["evidence"]["cause"] == "ddp_model_mismatch"
    assert set(f["evidence"]["victims"]) == {"0", "1"}
    assert "[p.shape for p in model.parameters()]" in f["hint"]


def test_the_first_rank_to_report_the_model_check_is_not_named_before_the_others_vote():
    """Rank 0's error came first: alone it is a tie of two counts (its own and rank 2's)."""
    log = running(3)
    log.add("s0", "error", {"where": "uncaught", "error_type": "RuntimeError",
                            "error": _ddp_counts(0, 4, 2, 6)}, t=101.0)
    log.add("s0", "exit", {"clean": False, "reason": "uncaught exception"}, t=101.1)
    assert diagnose(log.state(), 101.5, S) == []
    log.add("s2", "error", {"where": "uncaught", "error_type": "RuntimeError",
                            "error": _ddp_counts(2, 6, 0, 4)}, t=101.6)
    log.add("s2", "exit", {"clean": False, "reason": "uncaught exception"}, t=101.7)
    assert diagnose(log.state(), 101.8, S) == []  # still a tie: 4 against 6
    log.add("s1", "error", {"where": "uncaught", "error_type": "RuntimeError",
                            "error": _ddp_counts(1, 4, 2, 6)}, t=101.8)
    log.add("s1", "exit", {"clean": False, "reason": "uncaught exception"}, t=101.9)
    assert kinds(diagnose(log.state(), 101.9, S)) == [("rank_failed", [2])]
    # A vote that never closes (a rank died before it could raise) names after 2 s.
    log = running(3)
    log.add("s0", "error", {"where": "uncaught", "error_type": "RuntimeError",
                            "error": _ddp_counts(0, 4, 2, 6)}, t=101.0)
    log.add("s0", "exit", {"clean": False, "reason": "uncaught exception"}, t=101.1)
    assert kinds(diagnose(log.state(), 103.1, S)) == [("rank_failed", [0])]


def test_two_ranks_with_different_models_are_both_named():
    """Each names the other: no count is held by more ranks, so neither is singled out."""
    log = running(2)
    _every_rank_raises(log, [_ddp_counts(0, 4, 1, 6), _ddp_counts(1, 6, 0, 4)])
    assert sorted(kinds(diagnose(log.state(), 105.0, S))) == [("rank_failed", [0]),
                                                              ("rank_failed", [1])]


def test_a_rank_started_with_another_world_size_is_the_verdict_not_the_ranks_stuck_in_init():
    """Rank 2 sets WORLD_SIZE=4 before init_process_group (its process started with 3, as the
    others): it waits for a fourth rank; rank 0 waits in init for rank 2's gloo connection;
    rank 1 finished init and waits in its first all_reduce for both."""
    log = running(0)
    for r in range(3):
        log.add(f"s{r}", "hello", hello(r, world=3), t=100.0)
        log.add(f"s{r}", "init_start", {"rank": r, "world_size": 4 if r == 2 else 3}, t=100.0)
    log.add("s1", "init_done", {"rank": 1, "world_size": 3, "backend": "gloo",
                                "duration_s": 0.2}, t=100.2)
    log.add("s1", "group", {"name": "0", "ranks": [0, 1, 2]}, t=100.2)
    progress(log, 1, 145.0, ("0", 1, 0, "all_reduce", 100.3))
    for r in (0, 2):  # alive, in init_process_group: their agents' heartbeats hold no group
        log.add(f"s{r}", "heartbeat", {"groups": []}, t=145.0)
    found = diagnose(log.state(), 145.0, S)
    assert kinds(found) == [("config_mismatch", [2])], found
    assert found[0]["evidence"]["values"] == {"0": 3, "1": 3, "2": 4}


def test_a_send_where_the_peers_all_reduce_blames_the_sender_not_nobody():
    """Rank 0 sends to rank 1 (a hand-off left in `if rank == 0:`) where ranks 1 and 2 call
    the step's all_reduce: 1 and 2 wait for 0 there, 0 waits for 1's recv, a cycle. The
    ranks the collective waits for are named (bench/corpus/send_vs_allreduce.py; it raised
    in the stall's text before, and the server refused the job's events)."""
    log = running(3)
    history(log, 3)
    for r in (1, 2):
        log.add(f"s{r}", "heartbeat", {"groups": [
            {"group": "0", "entered": 41, "completed": 40, "inflight_op": "all_reduce",
             "inflight_since": 100.0}]}, t=116.0)
    log.add("s0", "heartbeat", {"groups": [p2p_row("0", {"send:1:0": 1},
                                                   ("send", 1, 0, 1, 100.0), entered=40)]},
            t=116.0)
    (f,) = diagnose(log.state(), 116.0, S)
    assert (f["kind"], f["ranks"]) == ("stall", [0]), f
    assert f["evidence"]["waiting"] == [1, 2]
    assert [hop["rank"] for hop in f["evidence"]["chain"]] == [0, 1]
    assert "rank 0 waits in send to rank 1 (tag 0, #1) for rank 1, who waits for it" in \
        f["hint"] and "`if rank == ...`" in f["hint"]
    for r in range(3):  # still there, a minute on: the hang says the same
        log.add(f"s{r}", "heartbeat", {"groups": []}, t=161.0)
    (f,) = diagnose(log.state(), 161.0, S)
    assert (f["kind"], f["ranks"]) == ("hang", [0]) and "close a cycle" in f["hint"]


def test_a_rank_that_takes_two_groups_in_another_order_is_named_not_the_ones_it_holds_up():
    """Two groups over all 3 ranks (gradients, metrics); rank 2 logs its metrics before its
    gradient all_reduce once: ranks 0 and 1 wait for it in group 0, it waits for them in
    group 1. Both groups' waits close one cycle; the side fewer ranks took is the odd one
    (bench/corpus/group_order_swapped.py)."""
    log = running(3, groups=(("0", None), ("1", None)))
    history(log, 3)
    for r in (0, 1):
        log.add(f"s{r}", "heartbeat", {"groups": [
            {"group": "0", "entered": 41, "completed": 40, "inflight_op": "all_reduce",
             "inflight_since": 100.0},
            {"group": "1", "entered": 40, "completed": 40, "inflight_op": None,
             "inflight_since": None}]}, t=131.0)
    log.add("s2", "heartbeat", {"groups": [
        {"group": "0", "entered": 40, "completed": 40, "inflight_op": None,
         "inflight_since": None},
        {"group": "1", "entered": 41, "completed": 40, "inflight_op": "all_reduce",
         "inflight_since": 100.0}]}, t=131.0)
    found = diagnose(log.state(), 131.0, S)
    assert kinds(found) == [("stall", [2])], found
    assert found[0]["group"] == "0" and "close a cycle" in found[0]["hint"]
    for r in range(3):
        log.add(f"s{r}", "heartbeat", {"groups": []}, t=161.0)
    assert kinds(diagnose(log.state(), 161.0, S)) == [("hang", [2])]



def test_a_checkpoint_that_fails_on_one_rank_blames_that_rank_though_dcp_raises_it_on_all():
    """dcp.save gathers rank 1's OSError and raises CheckpointException naming rank 1 on every
    rank (bench/corpus/dcp_save_one_rank_fails.py)."""
    from tests.unit.test_errors import DCP_FAILED

    log = running(3)
    _every_rank_raises(log, [DCP_FAILED] * 3)
    (f,) = diagnose(log.state(), 105.0, S)
    assert (f["kind"], f["ranks"]) == ("rank_failed", [1]), f
    assert "the disk (or the quota) is full" in f["summary"]
    assert set(f["evidence"]["victims"]) == {"0", "2"}


def test_ctrl_c_outside_any_collective_blames_no_rank_though_some_are_cut_off():
    """Ctrl-C in torchrun's terminal while the ranks compute: two report KeyboardInterrupt
    from their training loop, one's agent is cut off before its report (torchrun's second
    SIGINT), one exits unclean with nothing said (bench/corpus/healthy_ctrl_c.py: rank_lost
    and rank_failed criticals before)."""
    log = running(4)
    for r in (0, 1):
        log.add(f"s{r}", "error", {"where": "uncaught", "error_type": "KeyboardInterrupt",
                                   "error": "KeyboardInterrupt()"}, t=105.2)
        log.add(f"s{r}", "exit", {"clean": False, "reason": "uncaught exception"}, t=105.3)
    log.add("s2", "disconnect", {}, t=104.6)
    log.add("s3", "exit", {"clean": False, "reason": "uncaught exception"}, t=105.4)
    assert diagnose(log.state(), 120.0, S) == []
    # One whose second SIGINT cut its excepthook short reports a clean exit, while its peers
    # still wait in a collective it never joined: not a rank that left early either.
    log = running(3)
    progress(log, 1, 104.9, ("0", 41, 40, "all_reduce", 104.5))
    log.add("s2", "exit", {"clean": True, "reason": "exit"}, t=105.1)
    for r in (0, 1):
        log.add(f"s{r}", "error", {"where": "uncaught", "error_type": "KeyboardInterrupt",
                                   "error": "KeyboardInterrupt()"}, t=105.5)
        log.add(f"s{r}", "exit", {"clean": False, "reason": "uncaught exception"}, t=105.6)
    assert diagnose(log.state(), 120.0, S) == []
    # A rank lost well before anyone was interrupted is still named.
    log = running(3)
    log.add("s2", "disconnect", {}, t=101.0)
    log.add("s0", "error", {"where": "uncaught", "error_type": "KeyboardInterrupt",
                            "error": "KeyboardInterrupt()"}, t=105.2)
    progress(log, 1, 105.2, ("0", 5, 5, None, None))
    assert kinds(diagnose(log.state(), 106.0, S)) == [("rank_lost", [2])]


def test_the_agent_reports_an_interrupt_as_an_error_of_its_own_kind():
    from pgdash_agent.failures import FailureReports
    from pgdash_agent.outbox import Outbox

    outbox = Outbox(16)
    reports = FailureReports(outbox, os.getpid(), lambda **kw: True)
    reports.note_uncaught(KeyboardInterrupt, KeyboardInterrupt())
    (event,) = outbox.take(16)
    assert event["kind"] == "error" and reports.failed
    assert event["body"]["error_type"] == "KeyboardInterrupt"


def _raises_at(log, rank, text, line, t):
    log.add(f"s{rank}", "error", {
        "where": "uncaught", "error_type": "RuntimeError", "error": text,
        "traceback": [{"file": "/job/train.py", "line": line, "function": "step",
                       "code": "x = torch.randn(batch * 64).view(16, 64)"}]}, t=t)
    log.add(f"s{rank}", "exit", {"clean": False, "reason": "uncaught exception"}, t=t + 0.1)


def test_ranks_that_raise_the_same_error_at_the_same_line_are_one_finding():
    # the epoch's last, smaller batch meets a hard-coded reshape on every rank: one bug, so
    # one finding naming them all (not 1,024 criticals), led by the first to fail
    log = running(4)
    for rank in (2, 0, 1):
        _raises_at(log, rank, f"shape '[16, 64]' is invalid for input of size {320 + rank}",
                   31, 101.0 + 0.01 * rank)
    _raises_at(log, 3, "shape '[16, 64]' is invalid for input of size 320", 40, 101.2)
    found = diagnose(log.state(), 105.0, S)
    assert sorted(kinds(found)) == [("rank_failed", [0, 1, 2]), ("rank_failed", [3])]
    (alike,) = [f for f in found if len(f["ranks"]) == 3]
    assert alike["summary"].startswith("Ranks 0-2 failed the same way: RuntimeError at "
                                       "train.py:31"), alike["summary"]
    assert "ranks 0-2 raised RuntimeError at /job/train.py:31" in alike["hint"]
    assert alike["id"].endswith(":r0") and alike["first_seen"] == 101.0


def test_ranks_that_fail_at_one_instant_while_a_rank_runs_wait_for_its_report():
    """Corpus: broadcast_object_list_len_mismatch. Ranks 1 and 2 receive rank 0's object list
    of another length and fail at once, each on the garbage sizes it read, both with a
    RuntimeError; rank 0 still runs, and its report may name it. Held TOGETHER_WAIT_S, then
    named if none came."""
    log = running(3)
    _raises_at(log, 1, "DefaultCPUAllocator: can't allocate memory: you tried to allocate "
               "4287808591550398870 bytes.", 51, 101.0)
    _raises_at(log, 2, "SymIntArrayRef expected to contain only concrete integers", 51, 101.02)
    assert diagnose(log.state(), 101.5, S) == []
    assert {r for f in diagnose(log.state(), 102.5, S) for r in f["ranks"]} == {1, 2}


MESH = (("0", None), ("1", [0, 1]), ("2", [2, 3]), ("3", [0, 2]), ("4", [1, 3]))
TP, DP = {0: "1", 1: "1", 2: "2", 3: "2"}, {0: "3", 1: "4", 2: "3", 3: "4"}


def mesh_row(group, entered, completed, since=None):
    return (group, entered, completed, "all_reduce" if entered > completed else None, since)


def test_a_cycle_of_waits_across_a_mesh_names_the_rank_that_called_the_wrong_group():
    """2x2 mesh, a tensor-parallel then a data-parallel all_reduce a step; once, rank 3 reduces
    over its tensor-parallel group instead: from then on every rank waits for the next one
    around the mesh, each group's stall naming the rank it waits for."""
    log = running(4, groups=MESH)
    for k in range(1, 61):  # the steps before: heartbeats at either point of a step
        for r in range(4):
            tp, dp = (k, k) if (k + r) % 2 else (k + 1, k)
            progress(log, r, 100.0 + k * 0.5, mesh_row("0", 0, 0), mesh_row(TP[r], tp, tp),
                     mesh_row(DP[r], dp, dp))
    since = 131.0
    stuck = {0: ((147, 146), (146, 146)), 1: ((146, 146), (146, 145)),
             2: ((147, 147), (147, 146)), 3: ((148, 147), (145, 145))}
    for t in (131.5, 195.0):
        for r, ((tp_in, tp_done), (dp_in, dp_done)) in stuck.items():
            progress(log, r, t, mesh_row("0", 0, 0), mesh_row(TP[r], tp_in, tp_done, since),
                     mesh_row(DP[r], dp_in, dp_done, since))
    (f,) = diagnose(log.state(), 195.0, S)
    assert (f["kind"], f["ranks"], f["group"]) == ("hang", [3], "4"), f
    assert f["evidence"]["out_of_step"] == [3] and "out of step" in f["hint"]


def test_a_barrier_called_on_a_subgroup_where_the_others_call_the_jobs_names_that_rank_soon():
    """Corpus: barrier_wrong_group_one_rank. Ranks 0, 2 wait in the job's barrier #68 for
    rank 1; rank 1 waits in subgroup [0, 1]'s barrier #2 for rank 0. Most of the cycle waits
    in the job's barrier: rank 1 is named, and at the stall's 10 s, not the 30 s a barrier
    gets for a rank busy with a checkpoint (in a cycle nobody is busy)."""
    log = running(3, groups=(("0", None), ("1", [0, 1])))
    for r in range(3):
        rows = [{"group": "0", "op": "all_reduce", "count": 67, "bytes": 4096 * 67,
                 "sum_us": 500.0 * 67, "max_us": 900.0, "hist": [[64, 67]]}]
        if r < 2:
            rows.append({"group": "1", "op": "all_reduce", "count": 30, "bytes": 16 * 30,
                         "sum_us": 500.0 * 30, "max_us": 900.0, "hist": [[64, 30]]})
        log.add(f"s{r}", "coll_stats", {"start": 100.0, "end": 101.0, "rows": rows}, t=101.0)
    since = 102.0
    for t in (102.5, 112.0):
        progress(log, 0, t, ("0", 68, 67, "barrier", since), ("1", 1, 1, None, None))
        progress(log, 1, t, ("0", 67, 67, None, None), ("1", 2, 1, "barrier", since + 0.01))
        progress(log, 2, t, ("0", 68, 67, "barrier", since))
    assert diagnose(log.state(), 111.9, S) == []
    (f,) = diagnose(log.state(), 112.2, S)
    assert (f["kind"], f["ranks"], f["group"]) == ("stall", [1], "0"), f
    assert f["evidence"]["outvoted"] == [1] and "in another group's instead" in f["hint"]


def fingerprint_beat(log, rank, t, seq, fp):
    log.add(f"s{rank}", "heartbeat", {"groups": [
        {"group": "0", "entered": seq + 3, "completed": seq + 3, "inflight_op": None,
         "inflight_since": None, "fp": [[seq, fp]]}]}, t=t)


def test_a_rank_whose_calls_differ_though_each_completed_is_named_by_its_fingerprint():
    """Rank 1 all-reduces with MAX where the others SUM (corpus: allreduce_op_mismatch): every
    call completes; the fingerprints at collective #320 differ on rank 1 alone. Reported at
    different heartbeats, they are compared at the same number."""
    log = running(3)
    fingerprint_beat(log, 0, 110.0, 304, 7)
    fingerprint_beat(log, 1, 110.2, 320, 9)
    assert [f for f in diagnose(log.state(), 110.5, S) if f["kind"] == "desync"] == []
    fingerprint_beat(log, 0, 111.0, 320, 5)
    assert [f for f in diagnose(log.state(), 111.1, S) if f["kind"] == "desync"] == []  # 1:1
    fingerprint_beat(log, 2, 111.3, 320, 5)
    (f,) = diagnose(log.state(), 111.4, S)
    assert (f["kind"], f["severity"], f["ranks"]) == ("desync", "critical", [1])
    assert f["summary"].startswith("Rank 1 called different collectives on group 0 from what "
                                   "ranks 0, 2 called, by collective #320")
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in f["hint"] and f["first_seen"] == 111.3
    for t, seq in ((112.0, 336), (113.0, 352), (114.0, 368)):  # later marks differ too
        for r in range(3):
            fingerprint_beat(log, r, t + r * 0.1, seq, 9 if r == 1 else 5)
    (g,) = diagnose(log.state(), 114.5, S)
    assert (g["id"], g["ranks"]) == (f["id"], [1])  # one finding, not one per number


def test_two_ranks_whose_fingerprints_differ_are_a_warning_that_names_neither():
    log = running(2)
    fingerprint_beat(log, 0, 110.0, 64, 5)
    fingerprint_beat(log, 1, 110.2, 64, 9)
    (f,) = diagnose(log.state(), 110.5, S)
    assert (f["kind"], f["severity"], f["ranks"]) == ("desync", "warning", [])
    assert f["summary"].startswith("Ranks 0, 1 called different collectives on group 0 from "
                                   "one another")


def test_ranks_with_the_same_fingerprints_are_quiet():
    log = running(3)
    for t, seq in ((110.0, 16), (111.0, 32)):
        for r in range(3):
            fingerprint_beat(log, r, t + r * 0.1, seq, seq * 11)
    assert diagnose(log.state(), 112.0, S) == []


def test_a_rank_that_skipped_a_new_group_call_is_named_by_the_group_names_it_gave():
    """Corpus: new_group_skipped_one_rank. Ranks 0, 1 make group "1" of ranks 0, 1; rank 2
    skips that new_group call, so its next group, of all three, is its "1": one name, two
    groups. Named when rank 2 reports it, before the hang it leads to forms."""
    log = running(3)
    for r in (0, 1):
        log.add(f"s{r}", "group", {"name": "1", "ranks": [0, 1]}, t=105.0 + r * 0.1)
    assert diagnose(log.state(), 106.0, S) == []
    log.add("s2", "group", {"name": "1", "ranks": [0, 1, 2]}, t=107.0)
    (f,) = diagnose(log.state(), 107.1, S)
    assert (f["kind"], f["severity"], f["ranks"], f["group"]) == ("desync", "critical", [2], "1")
    assert f["summary"].startswith(
        "Rank 2 numbered its process groups apart from the others': group 1 is not the same "
        "group on every rank (ranks 0, 1 say it holds ranks 0, 1; rank 2 says it holds "
        "ranks 0-2)."), f["summary"]
    assert "use_local_synchronization=True" in f["hint"] and f["first_seen"] == 107.0
    assert f["evidence"]["views"] == {"0,1": [0, 1], "0,1,2": [2]}


def test_group_names_that_differ_with_no_majority_name_nobody_and_a_new_world_starts_afresh():
    log = running(2)
    log.add("s0", "group", {"name": "1", "ranks": [0]}, t=105.0)
    log.add("s1", "group", {"name": "1", "ranks": [1]}, t=105.2)
    (f,) = diagnose(log.state(), 105.5, S)
    assert (f["kind"], f["severity"], f["ranks"]) == ("desync", "warning", [])
    # each rank destroys its world and makes it again: its groups are numbered afresh
    for r in (0, 1):
        log.add(f"s{r}", "init_done", {"rank": r, "world_size": 2, "backend": "gloo",
                                       "duration_s": 0.1}, t=106.0)
        log.add(f"s{r}", "group", {"name": "1", "ranks": [0, 1]}, t=106.1)
    assert diagnose(log.state(), 106.5, S) == []


def made_beat(log, rank, t, count, marks):
    """A heartbeat saying the rank's process made ``count`` new_group calls, with the
    fingerprints after its newest (the last after call ``count``)."""
    log.add(f"s{rank}", "heartbeat", {"groups": [], "groups_made": count,
                                      "groups_made_fp": list(marks)}, t=t)


def test_a_rank_whose_new_group_call_differs_is_named_before_any_group_of_it_exists():
    """Corpus: new_group_skipped_one_rank (rank 2 skipped call #1 and hangs inside its next
    one, which the others make as their #2) and new_group_ranks_differ (rank 3 passes other
    ranks to call #2). Each agent counts a call before it is made; the ranks are compared at
    the numbers their fingerprints share."""
    log = running(3)
    made_beat(log, 0, 105.0, 2, [11, 12])
    made_beat(log, 1, 105.1, 1, [11])  # slower: call #2 not made yet, no disagreement
    assert diagnose(log.state(), 105.2, S) == []
    made_beat(log, 2, 105.3, 1, [13])
    (f,) = diagnose(log.state(), 105.4, S)
    assert (f["kind"], f["severity"], f["ranks"], f["group"]) == ("desync", "critical", [2], None)
    assert f["summary"].startswith(
        "The new_group call #1 of rank 2 is not the one ranks 0, 1 made at that number: rank "
        "2 skipped a new_group call before it, or passed other ranks."), f["summary"]
    assert "use_local_synchronization=True" in f["hint"] and f["first_seen"] == 105.3
    assert f["evidence"] == {"source": "new_group_calls", "call": 1, "views": [[0, 1], [2]]}

    log = running(4)
    for r in (0, 3):  # one each: the ranks not heard yet decide
        made_beat(log, r, 106.0 + r / 10, 4, [21, 22, 23 if r == 3 else 24, 25 + (r == 3)])
    assert diagnose(log.state(), 106.5, S) == []
    for r in (1, 2):
        made_beat(log, r, 106.0 + r / 10, 4, [21, 22, 23 if r == 3 else 24, 25 + (r == 3)])
    (f,) = diagnose(log.state(), 107.0, S)
    assert (f["ranks"], f["evidence"]["call"]) == ([3], 3)  # the first number they part at


def test_new_group_calls_apart_with_no_majority_name_nobody_and_a_new_world_starts_afresh():
    log = running(2)
    made_beat(log, 0, 105.0, 1, [11])
    made_beat(log, 1, 105.1, 1, [12])
    (f,) = diagnose(log.state(), 105.5, S)
    assert (f["kind"], f["severity"], f["ranks"]) == ("desync", "warning", [])
    assert f["summary"].startswith("The ranks made new_group call #1 apart: rank 0 one "
                                   "sequence, rank 1 another of calls up to it."), f["summary"]
    for r in (0, 1):  # each rank makes its world again: its calls are counted afresh
        make_world_again(log, r, 106.0)
    assert diagnose(log.state(), 106.5, S) == []
    made_beat(log, 0, 107.0, 1, [11])
    made_beat(log, 1, 107.1, 1, [11])
    assert diagnose(log.state(), 107.5, S) == []
    made_beat(log, 1, 108.0, 1, [14])  # the same number of calls, another call: seen
    assert [f["severity"] for f in diagnose(log.state(), 108.5, S)] == ["warning"]


def make_world_again(log, rank, t, world=2):
    """The rank's process destroys its world and makes it again, as the agent reports it."""
    log.add(f"s{rank}", "init_start", {"rank": rank, "world_size": world}, t=t)
    log.add(f"s{rank}", "init_done", {"rank": rank, "world_size": world, "backend": "gloo",
                                      "duration_s": 0.1}, t=t + 0.05)


def test_groups_of_a_world_made_again_are_not_compared_with_those_of_the_one_before():
    """Corpus: healthy_reinit_between_phases. Phase 1 makes group "2" of ranks 0, 1; phase 2,
    after destroy_process_group and init_process_group on every rank, makes its group "2"
    of ranks 1, 2: one name, two worlds, nothing wrong."""
    log = running(3)
    for r in (0, 1):
        log.add(f"s{r}", "group", {"name": "2", "ranks": [0, 1]}, t=105.0)
    for r in range(3):
        make_world_again(log, r, 106.0, world=3)
    for r in (1, 2):
        log.add(f"s{r}", "group", {"name": "2", "ranks": [1, 2]}, t=106.5)
    assert diagnose(log.state(), 107.0, S) == []


RESET = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
         "[127.0.0.1]:34007: Connection reset by peer.")


def size_mismatch(log, sizes, lost, at=105.0):
    """Rank ``lost`` vanishes (gloo's SIGABRT) inside reduce_scatter #80; the others' calls
    fail on its closed connection, each reported with its size and its call before."""
    log.add(f"s{lost}", "disconnect", {}, t=at)
    for r, nbytes in sizes.items():
        log.add(f"s{r}", "error", {
            "where": "collective", "error_type": "RuntimeError", "error": RESET,
            "group": "0", "op": "reduce_scatter_single", "seq": 80, "dtype": "float32",
            "bytes": nbytes, "before": ["reduce_scatter_single", "float32", 3072]},
            t=at + 0.001)
        log.add(f"s{r}", "exit", {"clean": False, "reason": "uncaught exception"}, t=at + 0.01)


def test_a_rank_whose_size_changed_is_named_not_the_rank_gloo_aborted_over_it():
    """Rank 0 pads its reduce_scatter input to 3,168 bytes; rank 2 receives its larger chunk
    and gloo aborts it (corpus: reduce_scatter_size_mismatch). Ranks 0 and 1 fail; rank 0's
    size changed from its call before, rank 1's did not."""
    log = running(3)
    size_mismatch(log, {0: 3168, 1: 3072}, lost=2)
    found = diagnose(log.state(), 108.0, S)
    assert kinds(found) == [("desync", [0])], found
    (f,) = found
    assert f["summary"].startswith("Rank 0 called reduce_scatter_single #80 on group 0 with "
                                   "3168 bytes (float32), where rank 1 called "
                                   "reduce_scatter_single with 3072 bytes (float32); ranks "
                                   "1, 2 then failed or vanished")
    assert f["evidence"]["consequences"] == [1, 2]


def test_a_rank_that_repeated_a_collective_is_named_by_the_heartbeats_of_ranks_inside_it():
    """Corpus: oom_retry_repeats_allreduce. Rank 1 repeats its step after an OOM: its
    #152 is the gradients' all_reduce (4,096 bytes) where ranks 0 and 2 all-reduce the loss
    (4 bytes). Gloo aborts rank 0 (no report), rank 2 fails on the closed connection (the
    one failure reported), and rank 1 waits inside #152 until the launcher kills it: the
    heartbeats of ranks 0 and 1 say what they called there."""
    log = running(3)
    for r, nbytes in ((0, 4), (1, 4096), (2, 4)):
        progress(log, r, 104.9, ("0", 152, 151, "all_reduce", 104.8, "float32", nbytes))
    log.add("s0", "disconnect", {}, t=105.0)
    log.add("s2", "error", {
        "where": "collective", "error_type": "RuntimeError", "error": RESET, "group": "0",
        "op": "all_reduce", "seq": 152, "dtype": "float32", "bytes": 4,
        "before": ["all_reduce", "float32", 4096]}, t=105.002)
    log.add("s2", "exit", {"clean": False, "reason": "uncaught exception"}, t=105.01)
    log.add("s1", "disconnect", {}, t=105.1)  # torchrun's SIGTERM
    found = diagnose(log.state(), 109.0, S)
    assert [f["ranks"] for f in found if f["severity"] == "critical"] == [[1]], found
    (f,) = [f for f in found if f["kind"] == "desync"]
    assert f["summary"].startswith("Rank 1 called all_reduce #152 on group 0 with 4096 bytes "
                                   "(float32), where ranks 0, 2 called all_reduce with 4 "
                                   "bytes"), f["summary"]
    assert f["evidence"]["consequences"] == [0, 2]


def test_the_boards_of_ranks_killed_without_a_word_name_the_one_in_another_collective():
    """Corpus: val_shard_empty_one_rank. Rank 3 skips validation and all-reduces its gradients
    (8,192 bytes) where the others all-reduce a loss (4 bytes): gloo aborts rank 2, torchrun
    SIGTERMs the rest, nobody reports, and every heartbeat predates the mismatch. The host
    reader's boards (read after the SIGTERM) say where each was."""
    log = running(4)
    for r in range(4):  # a second before: all inside gradients' all_reduce #120
        progress(log, r, 104.0, ("0", 120, 119, "all_reduce", 103.9, "float32", 8192))
    log.add("s2", "disconnect", {}, t=105.0)  # gloo's abort
    for r in (0, 1, 3):
        log.add(f"s{r}", "disconnect", {}, t=105.03)  # torchrun's SIGTERM
    assert kinds(diagnose(log.state(), 109.0, S)) == [("rank_lost", [2])]  # (without boards)

    def row(r, nbytes):
        return {"group": "0", "entered": 124, "completed": 123, "inflight_op": "all_reduce",
                "inflight_dtype": "float32", "inflight_bytes": nbytes, "inflight_since": 104.9}

    boards = [{"rank": r, "pid": 100 + r, "alive": r == 0, "groups": [row(r, 4)]}
              for r in range(3)]
    boards.append({"rank": 3, "pid": 103, "alive": False, "groups": [row(3, 8192)]})
    boards.append({"rank": 1, "pid": 999, "alive": False, "groups": [row(1, 8192)]})  # not its
    log.add("s0", "boards", {"t": 105.04, "boards": boards, "reader_pid": 77}, t=105.04)
    found = diagnose(log.state(), 109.0, S)
    assert kinds(found) == [("desync", [3])], found
    assert found[0]["summary"].startswith("Rank 3 called all_reduce (float32, 8192 bytes) as "
                                          "collective #124 on group 0"), found[0]["summary"]
    assert found[0]["evidence"]["consequences"] == [0, 1, 2]
    # an older board than the heartbeat changes nothing
    log = running(2)
    progress(log, 1, 104.0, ("0", 50, 49, "all_reduce", 103.9))
    log.add("s0", "boards", {"t": 104.5, "boards": [
        {"rank": 1, "pid": 101, "alive": True, "groups": [
            {"group": "0", "entered": 40, "completed": 40}]}]}, t=104.5)
    assert log.state().progress[("0", 1)]["entered"] == 50


def test_the_boards_of_ranks_past_a_collective_say_what_they_called_there():
    """Corpus: broadcast_state_extra_buffer. Rank 2's state_dict holds an extra buffer: its
    broadcast #505 sends 128 bytes where rank 0 (the root) broadcasts 4,096. Gloo aborts rank
    2 inside #505; ranks 0 and 1 got past it, and rank 0's next broadcast fails on the closed
    connection (the one failure reported, with its call before). Rank 1's board says what it
    completed as #505; rank 2's, what it died inside."""
    log = running(3)
    log.add("s2", "disconnect", {}, t=105.0)
    log.add("s0", "error", {
        "where": "collective", "error_type": "RuntimeError", "error": RESET, "group": "0",
        "op": "broadcast", "seq": 506, "dtype": "float32", "bytes": 128,
        "before": ["broadcast", "float32", 4096]}, t=105.02)
    log.add("s0", "exit", {"clean": False, "reason": "uncaught exception"}, t=105.03)
    log.add("s1", "disconnect", {}, t=105.1)  # torchrun's SIGTERM
    assert kinds(diagnose(log.state(), 109.0, S)) == [("rank_lost", [2])]  # (no boards)
    log.add("s0", "boards", {"t": 105.11, "boards": [
        {"rank": 1, "pid": 101, "alive": False, "groups": [
            {"group": "0", "entered": 506, "completed": 505, "inflight_op": "broadcast",
             "inflight_dtype": "float32", "inflight_bytes": 128, "inflight_since": 105.0,
             "done_op": "broadcast", "done_dtype": "float32", "done_bytes": 4096}]},
        {"rank": 2, "pid": 102, "alive": False, "groups": [
            {"group": "0", "entered": 505, "completed": 504, "inflight_op": "broadcast",
             "inflight_dtype": "float32", "inflight_bytes": 128, "inflight_since": 104.99,
             "done_op": "broadcast", "done_dtype": "float32", "done_bytes": 16}]}]},
        t=105.11)
    found = diagnose(log.state(), 109.0, S)
    assert kinds(found) == [("desync", [2])], found  # (not also "rank 2 vanished")
    assert found[0]["summary"].startswith("Rank 2 called broadcast #505 on group 0 with 128 "
                                          "bytes (float32), where ranks 0, 1 called broadcast "
                                          "with 4096 bytes"), found[0]["summary"]


def test_the_odd_rank_and_its_consequence_vanishing_together_are_the_desync_alone():
    """Corpus: allreduce_size_mismatch. Rank 2's gradient is smaller: gloo aborts rank 2 and
    then rank 1, 8 ms apart, both on node0 ("ranks 1, 2 vanished together"), while rank 0
    fails on their closed connections; their heartbeats had all three inside #98."""
    log = running(3)
    for r, nbytes in ((0, 4000), (1, 4000), (2, 2400)):
        progress(log, r, 104.9, ("0", 98, 97, "all_reduce", 104.8, "float32", nbytes))
    log.add("s2", "disconnect", {}, t=105.0)
    log.add("s1", "disconnect", {}, t=105.008)
    log.add("s0", "error", {"where": "collective", "error_type": "RuntimeError",
                            "error": RESET, "group": "0", "op": "all_reduce", "seq": 98,
                            "dtype": "float32", "bytes": 4000,
                            "before": ["all_reduce", "float32", 4000]}, t=105.01)
    log.add("s0", "exit", {"clean": False, "reason": "uncaught exception"}, t=105.02)
    found = diagnose(log.state(), 109.0, S)
    assert kinds(found) == [("desync", [2])], found


def test_uneven_all_to_alls_caught_in_flight_are_no_desync():
    """A MoE job's token exchange is uneven by design (corpus: healthy_moe_uneven_alltoall):
    ranks caught inside one all_to_all_single with different sizes (a scancel mid-step, read
    from their boards; or heartbeats that caught it) called the same collective. Only the
    sizes of collectives every rank's must match are compared."""
    log = running(3)
    for r, nbytes in ((0, 4096), (1, 1536), (2, 8192)):
        progress(log, r, 104.0, ("0", 60, 59, "all_to_all_single", 103.9, "float32", nbytes))
    assert diagnose(log.state(), 104.5, S) == []
    log = running(3)
    for r, nbytes in ((0, 4096), (1, 1536), (2, 4096)):  # all_reduce sizes must match
        progress(log, r, 104.0, ("0", 60, 59, "all_reduce", 103.9, "float32", nbytes))
    assert kinds(diagnose(log.state(), 104.5, S)) == [("desync", [1])]


def test_ranks_that_fail_on_what_the_odd_rank_broadcast_are_its_consequences():
    """Rank 0 broadcasts a list of 2 objects where ranks 1 and 2 expect 3 (corpus:
    broadcast_object_list_len_mismatch): gloo accepts the shorter size broadcast, ranks 1 and
    2 fail on the garbage sizes with errors of their own, rank 0's next broadcast fails on
    their closed connections. Their last collectives (#105) outvote rank 0's call before."""
    log = running(3)
    for r, error, last in ((1, "RuntimeError", [["0", 105, "broadcast", "int64", 24]]),
                           (2, "UnpicklingError", [["0", 106, "broadcast", "uint8", 171],
                                                   ["0", 105, "broadcast", "int64", 24]])):
        # (rank 2 got past the object broadcast, with a garbage size, before it failed)
        log.add(f"s{r}", "error", {"where": "uncaught", "error_type": error, "error": "x",
                                   "last": last}, t=105.0)
        log.add(f"s{r}", "exit", {"clean": False, "reason": "uncaught exception"}, t=105.01)
    # Two ranks failed at once with different errors while rank 0 runs: held a second for
    # its report, then named if none came.
    assert diagnose(log.state(), 105.3, S) == []
    assert kinds(diagnose(log.state(), 106.1, S)) == [("rank_failed", [1]),
                                                      ("rank_failed", [2])]
    log.add("s0", "error", {"where": "collective", "error_type": "RuntimeError",
                            "error": CLOSED, "group": "0", "op": "broadcast", "seq": 106,
                            "dtype": "uint8", "bytes": 91,
                            "before": ["broadcast", "int64", 16]}, t=105.4)
    log.add("s0", "exit", {"clean": False, "reason": "uncaught exception"}, t=105.5)
    found = diagnose(log.state(), 108.0, S)
    assert kinds(found) == [("desync", [0])], found
    assert found[0]["summary"].startswith("Rank 0 called broadcast #105 on group 0 with 16 "
                                          "bytes (int64), where ranks 1, 2 called broadcast "
                                          "with 24 bytes (int64)")
    assert found[0]["evidence"]["consequences"] == [1, 2]


def test_ranks_that_crash_alike_after_the_same_collectives_name_no_desync():
    log = running(3)
    for r in range(3):
        log.add(f"s{r}", "error", {"where": "uncaught", "error_type": "ValueError",
                                   "error": "bad config",
                                   "last": [["0", 7, "all_reduce", "float32", 4096]]}, t=105.0)
        log.add(f"s{r}", "exit", {"clean": False, "reason": "uncaught exception"}, t=105.01)
    found = diagnose(log.state(), 108.0, S)
    assert found and not [f for f in found if f["kind"] == "desync"], found


def test_a_rank_aborted_over_its_own_size_stays_the_lost_rank():
    """Rank 2's gradient is smaller and gloo aborts rank 2 itself (corpus:
    allreduce_size_mismatch): the others' sizes agree with their calls before, so no size
    names anyone else, and rank 2 is the lost rank."""
    log = running(3)
    size_mismatch(log, {0: 3072, 1: 3072}, lost=2)
    assert kinds(diagnose(log.state(), 108.0, S)) == [("rank_lost", [2])]


def test_a_victims_error_waits_a_moment_for_the_peer_whose_end_it_met():
    """Rank 0's all_to_all fails on a reset connection 24 ms before rank 1's (gloo's abort)
    closes (corpus: alltoall_split_mismatch): rank 1's loss, not rank 0, is the verdict."""
    log = running(3)
    log.add("s0", "error", {"where": "collective", "error_type": "RuntimeError",
                            "error": RESET, "group": "0", "op": "all_to_all_single",
                            "seq": 146}, t=105.0)
    log.add("s0", "exit", {"clean": False, "reason": "uncaught exception"}, t=105.01)
    assert diagnose(log.state(), 105.02, S) == []
    log.add("s1", "disconnect", {}, t=105.024)
    log.add("s2", "heartbeat", {"groups": []}, t=107.9)  # (the server hears on)
    assert kinds(diagnose(log.state(), 108.0, S)) == [("rank_lost", [1])]


def test_a_victim_whose_peer_never_reports_is_named_after_the_wait():
    log = running(3)
    log.add("s0", "error", {"where": "collective", "error_type": "RuntimeError",
                            "error": RESET, "group": "0", "op": "all_reduce", "seq": 9},
            t=105.0)
    log.add("s0", "exit", {"clean": False, "reason": "uncaught exception"}, t=105.01)
    assert diagnose(log.state(), 105.9, S) == []
    assert kinds(diagnose(log.state(), 106.1, S)) == [("rank_failed", [0])]


def test_ranks_that_end_in_their_own_sigterm_handler_are_a_stop_not_an_early_exit():
    """Preemption handled by the program (corpus: healthy_preempt_graceful): the scheduler's
    SIGTERM reaches every rank; rank 0 sees its flag one step before the others, saves and
    exits 0; their next all_reduce fails on its closed connection."""
    log = running(3)
    for r in range(3):
        log.add(f"s{r}", "error", {"where": "signal", "error_type": "SIGTERM",
                                   "error": "the process received SIGTERM"}, t=105.0 + r / 1e3)
    leave(log, 0, 105.02, entered=40, how="exit")
    for r in (1, 2):
        log.add(f"s{r}", "heartbeat", {"groups": [
            {"group": "0", "entered": 41, "completed": 40, "inflight_op": "all_reduce",
             "inflight_since": 105.01}]}, t=105.015)
        log.add(f"s{r}", "error", {"where": "collective", "error_type": "RuntimeError",
                                   "error": CLOSED, "group": "0", "op": "all_reduce",
                                   "seq": 41}, t=105.05)
        log.add(f"s{r}", "exit", {"clean": False, "reason": "uncaught exception"}, t=105.06)
    for now in (105.5, 110.0):
        assert diagnose(log.state(), now, S) == [], now


def test_ranks_that_exit_143_to_be_requeued_after_their_sigterm_handler_are_not_failures():
    """Corpus: healthy_preempt_requeue_exit_143. SLURM's requeue convention: the SIGTERM
    handler sets a flag, each rank saves at the next step and calls ``sys.exit(143)``: a
    status, not a failure (it was "Ranks 0-2 failed the same way", critical). A rank that
    exits so without being stopped still fails."""
    log = running(3)
    for r in range(3):
        log.add(f"s{r}", "error", {"where": "signal", "error_type": "SIGTERM",
                                   "error": "the process received SIGTERM"}, t=105.0 + r / 1e3)
    for r in range(3):
        log.add(f"s{r}", "error", {"where": "exit", "error_type": "SystemExit",
                                   "error": "the program exited with status 143"},
                t=105.2 + r / 1e2)
        log.add(f"s{r}", "exit", {"clean": False, "reason": "exit status 143"}, t=105.21 + r / 1e2)
    for now in (105.5, 110.0):
        assert diagnose(log.state(), now, S) == [], now
    log = running(3)
    log.add("s1", "error", {"where": "exit", "error_type": "SystemExit",
                            "error": "the program exited with status 3"}, t=105.2)
    log.add("s1", "exit", {"clean": False, "reason": "exit status 3"}, t=105.21)
    assert kinds(diagnose(log.state(), 110.0, S)) == [("rank_failed", [1])]
