"""Diagnosis rules on hand-made event logs: who is blamed, when, and silence when healthy."""

import dataclasses

from dashboard.diagnosis import Settings, diagnose
from tests.helpers.events import Log, half_seconds, hello, intervals, kinds, progress, running

S = Settings(hang_after=10.0, lost_after=15.0, init_grace=3.0)
DEFAULTS = Settings()  # the server's: a hang after 60 s


def test_healthy_job_is_silent():
    log = running(4)
    for now in (101, 105, 110):
        for r in range(4):
            progress(log, r, now, ("0", 50, 50, None, None))
        assert diagnose(log.state(), now + 0.5, S) == []


def test_hang_blames_the_rank_that_never_arrived_only_after_the_threshold():
    log = running(3)
    for r in (0, 1):
        progress(log, r, 112, ("0", 5, 4, "all_reduce", 101.0))
    progress(log, 2, 112, ("0", 4, 4, None, None))
    assert diagnose(log.state(), 110.9, S) == []
    (f,) = diagnose(log.state(), 112.0, S)
    assert f["kind"] == "hang" and f["ranks"] == [2] and f["group"] == "0"
    assert f["evidence"]["waiting"] == [0, 1] and f["evidence"]["seq"] == 5
    assert f["first_seen"] == 111.0 and f["summary"].startswith("Rank 2 ")
    assert "py-spy dump --pid 102" in f["hint"]


def test_a_hang_ends_when_the_late_rank_arrives_without_blaming_the_waiter_meanwhile():
    """The late rank reports the collective completed a moment before the waiting rank's next
    heartbeat says so too: between the two, the waiter is not "inside it with nobody missing"."""
    log = running(2)
    progress(log, 1, 112, ("0", 5, 4, "all_reduce", 101.0))
    progress(log, 0, 112, ("0", 4, 4, None, None))
    (f,) = diagnose(log.state(), 112.0, S)
    assert f["ranks"] == [0]
    progress(log, 0, 112.4, ("0", 5, 5, None, None))
    assert diagnose(log.state(), 112.5, S) == []
    # Its next heartbeat still in the collective that its peer completed: that is a hang.
    progress(log, 1, 113, ("0", 5, 4, "all_reduce", 101.0))
    (f,) = diagnose(log.state(), 113.0, S)
    assert f["ranks"] == [1] and "no rank is missing" in f["summary"]


def test_hang_follows_the_chain_across_groups_to_the_root():
    # Ranks 0 and 1 wait in group 0 for rank 2, which waits in group 1 for rank 3.
    log = running(4, groups=(("0", None), ("1", [2, 3])))
    for r in (0, 1):
        progress(log, r, 112, ("0", 5, 4, "all_reduce", 100.0))
    progress(log, 2, 112, ("0", 4, 4, None, None), ("1", 3, 2, "broadcast", 100.5))
    progress(log, 3, 112, ("0", 4, 4, None, None), ("1", 2, 2, None, None))
    log.add("s2", "stack", {"group": "1", "seq": 3, "op": "broadcast", "since": 100.5,
                            "stack": 'File "train.py", line 7, in step'}, t=103)
    found = diagnose(log.state(), 112.0, S)
    hangs = {f["group"]: f for f in found if f["kind"] == "hang"}
    assert hangs["0"]["ranks"] == [3]
    assert hangs["0"]["evidence"]["chain"] == [
        {"rank": 2, "waits_in": "1", "seq": 3, "op": "broadcast", "source": "python",
             "for": [3]}]
    assert hangs["0"]["evidence"]["stacks"] == {"2": 'File "train.py", line 7, in step'}
    assert hangs["1"]["ranks"] == [3]


def test_desync_blames_the_minority_and_replaces_the_hang():
    log = running(3)
    progress(log, 0, 101, ("0", 5, 4, "all_reduce", 100.0, "float32", 16))
    progress(log, 1, 101, ("0", 5, 4, "all_reduce", 100.1, "float32", 16))
    progress(log, 2, 101, ("0", 5, 4, "broadcast", 100.2, "float32", 16))
    (f,) = diagnose(log.state(), 101.0, S)
    assert f["kind"] == "desync" and f["ranks"] == [2] and f["first_seen"] == 100.2
    assert f["evidence"]["signatures"]["2"] == {"op": "broadcast", "dtype": "float32",
                                                "bytes": 16}
    assert kinds(diagnose(log.state(), 112.0, S)) == [("desync", [2])]  # past hang_after: no hang


def test_desync_on_shape_alone():
    log = running(2)
    progress(log, 0, 101, ("0", 9, 8, "all_reduce", 100.0, "float32", 16))
    progress(log, 1, 101, ("0", 9, 8, "all_reduce", 100.0, "float32", 32))
    (f,) = diagnose(log.state(), 101.0, S)
    assert f["kind"] == "desync" and f["ranks"] == [1]  # tie: the lowest rank's call wins


def rooted(log, rank, t, entered, completed, root=None, done_root=None, op="broadcast"):
    row = {"group": "0", "entered": entered, "completed": completed,
           "inflight_op": op if entered > completed else None,
           "inflight_since": 100.0 if entered > completed else None}
    if entered > completed:
        row.update(inflight_dtype="float32", inflight_bytes=16, inflight_root=root)
    if done_root is not None:
        row["done_root"] = done_root
    log.add(f"s{rank}", "heartbeat", {"groups": [row]}, t=t)


def test_a_broadcast_whose_src_differs_on_one_rank_is_its_desync_with_the_finished_ranks_vote():
    """Rank 1 broadcasts with src=1, the others with src=0: rank 0 (the root) and rank 1 are
    stuck in it, a tie; rank 2 received from rank 0, finished it and waits in the next
    all_reduce: its vote (done_root) names rank 1."""
    log = running(3)
    rooted(log, 0, 101, 6, 5, root=0)
    rooted(log, 1, 101, 6, 5, root=1)
    assert diagnose(log.state(), 101.0, S) == []  # a tie: rank 2 has not said yet
    log.add("s2", "heartbeat", {"groups": [
        {"group": "0", "entered": 7, "completed": 6, "inflight_op": "all_reduce",
         "inflight_since": 100.1, "inflight_dtype": "float32", "inflight_bytes": 16,
         "done_root": 0}]}, t=101)
    (f,) = diagnose(log.state(), 101.0, S)
    assert (f["kind"], f["ranks"]) == ("desync", [1])
    assert f["evidence"]["roots"] == {"0": 0, "1": 1, "2": 0}
    assert "with src=1, where the others used src=0" in f["summary"], f["summary"]
    rooted(log, 0, 169, 6, 5, root=0)  # a minute on, still so
    rooted(log, 1, 169, 6, 5, root=1)
    log.add("s2", "heartbeat", {"groups": [
        {"group": "0", "entered": 7, "completed": 6, "inflight_op": "all_reduce",
         "inflight_since": 100.1, "done_root": 0}]}, t=169)
    assert kinds(diagnose(log.state(), 170.0, S)) == [("desync", [1])]  # not a hang of 0, 1


def test_ranks_that_agree_on_the_root_are_no_desync():
    log = running(3)
    for r in range(3):
        rooted(log, r, 101, 6, 5, root=2, op="reduce")
    assert diagnose(log.state(), 101.0, S) == []
    log = running(2)  # an older agent says no root: nothing to compare
    rooted(log, 0, 101, 6, 5)
    rooted(log, 1, 101, 6, 5, root=1)
    assert diagnose(log.state(), 101.0, S) == []


def test_killed_rank_is_lost_and_its_peers_errors_are_evidence():
    log = running(2)
    log.add("s1", "disconnect", {}, t=105)
    log.add("s0", "error", {"where": "uncaught", "error_type": "RuntimeError", "error":
                            "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
                            "Connection closed by peer [127.0.0.1]:13221"}, t=105.2)
    log.add("s0", "exit", {"clean": False}, t=105.3)
    assert diagnose(log.state(), 106, S) == []  # it may still reconnect (a network blip)
    found = diagnose(log.state(), 105 + S.reconnect_grace, S)
    assert kinds(found) == [("rank_lost", [1])]
    assert "Connection closed by peer" in found[0]["evidence"]["victims"]["0"]["error"]
    assert found[0]["first_seen"] == 105


def test_failed_rank_is_blamed_not_its_victims():
    log = running(3)
    log.add("s2", "error", {"where": "uncaught", "error_type": "RuntimeError",
                            "error": "CUDA out of memory"}, t=105)
    log.add("s2", "exit", {"clean": False}, t=105.1)
    for r in (0, 1):
        log.add(f"s{r}", "error", {"where": "collective", "error_type": "RuntimeError",
                                   "error": "[../gloo/transport/tcp/pair.cc:537] Read error "
                                            "[127.0.0.1]:17549: Connection reset by peer"},
                t=105.5)
        log.add(f"s{r}", "error", {"where": "uncaught", "error_type": "RuntimeError",
                                   "error": "Connection reset by peer"}, t=105.6)
        log.add(f"s{r}", "exit", {"clean": False}, t=105.7)
    found = diagnose(log.state(), 106, S)
    assert kinds(found) == [("rank_failed", [2])]
    assert found[0]["evidence"]["error"] == "CUDA out of memory"
    assert set(found[0]["evidence"]["victims"]) == {"0", "1"}


def test_a_crashs_victims_that_fail_later_are_stored_with_its_finding():
    """The crash's finding shows before its victims' errors arrive; when they do, the book
    reports the finding again, so the stored one names them too (CI once read it without)."""
    from dashboard.diagnosis.book import Book, Change

    log = running(2)
    log.add("s1", "error", {"where": "uncaught", "error_type": "ZeroDivisionError",
                            "error": "float division by zero"}, t=105)
    log.add("s1", "exit", {"clean": False}, t=105.1)
    book = Book(S)
    book.record()
    book.start(100)
    (first,) = book.update(log.state(), 106).findings
    assert first[0] == Change.NEW and first[1]["evidence"]["victims"] == {}
    assert book.update(log.state(), 107).findings == []  # nothing new: nothing stored
    log.add("s0", "error", {"where": "collective", "error_type": "RuntimeError",
                            "error": "Connection closed by peer [127.0.0.1]:5"}, t=107.5)
    log.add("s0", "exit", {"clean": False}, t=107.6)
    ((change, again),) = book.update(log.state(), 108).findings
    assert change == Change.UPDATED and list(again["evidence"]["victims"]) == ["0"]
    assert again["id"] == first[1]["id"] and "consequences" in again["hint"]
    rows = [row.finding for row in book.take_log()[1] if row.finding]
    assert rows[-1]["evidence"]["victims"] == again["evidence"]["victims"]


def test_silent_rank_becomes_lost_after_the_threshold():
    log = running(2)
    progress(log, 0, 130, ("0", 5, 5, None, None))
    progress(log, 1, 110, ("0", 5, 5, None, None))
    assert diagnose(log.state(), 124.9, S) == []
    assert kinds(diagnose(log.state(), 125.1, S)) == [("rank_lost", [1])]


def test_a_rank_read_late_by_a_server_behind_is_not_lost_until_the_others_are_read_past_it():
    """A server behind its agents reads some ranks' reports later than others' (a rank that
    reconnected, or whose batches wait deeper in the backlog): silence is judged against what
    it has read of the others, not against the clock (a healthy 1,024-rank job got rank_lost
    criticals so)."""
    log = running(4)  # every rank reported at 100
    for r in range(3):
        progress(log, r, 110.0, ("0", 9, 9, None, None))
    assert diagnose(log.state(), 122.0, S) == []  # 22 s on the clock, 10 s behind the others
    for r in range(3):
        progress(log, r, 115.5, ("0", 12, 12, None, None))
    found = diagnose(log.state(), 122.0, S)
    assert kinds(found) == [("rank_lost", [3])]
    assert "nothing heard from it for 16 s" in found[0]["summary"]


def test_the_only_running_rank_silent_is_lost_on_the_clock():
    log = running(1)
    progress(log, 0, 110, ("0", 5, 5, None, None))
    assert diagnose(log.state(), 124.9, S) == []
    assert kinds(diagnose(log.state(), 125.1, S)) == [("rank_lost", [0])]


def test_ranks_all_silent_with_open_connections_are_lost_on_the_clock():
    """A frozen job or a partition: most ranks silent, none read past another."""
    log = running(3)
    for r in range(3):
        progress(log, r, 110, ("0", 5, 5, None, None))
    assert diagnose(log.state(), 124.9, S) == []
    # all three of one host, silent together: one finding, the host first
    (f,) = diagnose(log.state(), 125.1, S)
    assert (f["kind"], f["ranks"]) == ("rank_lost", [0, 1, 2])
    assert f["summary"].startswith("Ranks 0-2 went silent together on node0"), f["summary"]
    assert f["hint"].startswith("Every rank of node0 went at the same moment")


def test_a_dropped_connection_is_not_lost_before_the_others_are_read_past_its_grace():
    """An agent whose acks timed out behind a slow server reconnects at once, but the server
    reads its reconnection as late as everyone's reports: on the clock alone it looked lost."""
    log = running(3)
    for r in range(3):
        progress(log, r, 100.5, ("0", 5, 5, None, None))
    log.add("s1", "disconnect", {}, t=101.0)
    for r in (0, 2):  # what the server has read of the others: reports up to 101.5
        progress(log, r, 101.5, ("0", 6, 6, None, None))
    assert diagnose(log.state(), 110.0, S) == []
    log.add("s1", "connect", {"rank": 1, "host": "node0"}, t=101.4)  # read now
    for r in range(3):
        progress(log, r, 110.0, ("0", 9, 9, None, None))
    assert diagnose(log.state(), 110.0, S) == []
    # A rank that stays away is lost once the others are read past its grace.
    log.add("s2", "disconnect", {}, t=110.2)
    for r in (0, 1):
        progress(log, r, 111.0, ("0", 10, 10, None, None))
    assert diagnose(log.state(), 111.0, S) == []
    for r in (0, 1):
        progress(log, r, 112.0, ("0", 11, 11, None, None))
    assert kinds(diagnose(log.state(), 112.0, S)) == [("rank_lost", [2])]


def test_a_connection_that_gave_up_on_a_server_behind_gets_a_silent_ranks_patience():
    """A v1 agent whose acknowledgement the server had owed for 10 s reconnects, into a server
    so crowded that the reconnection takes seconds: not lost after the grace of a dropped
    connection, only after lost_after, as a silent rank; one that closed with nothing owed
    (a killed process) is named after the grace as before."""
    log = running(4)
    log.add("s1", "disconnect", {"owed_s": 10.2}, t=101.0)
    log.add("s2", "disconnect", {}, t=101.0)
    # An agent that closed its connection itself (its ack timed out before the server, too
    # busy to read the batch, knew it owed anything): alive then, patience too.
    log.add("s3", "disconnect", {"goodbye": True}, t=101.0)
    for t in (103.0, 110.0):
        progress(log, 0, t, ("0", 6, 6, None, None))
        assert kinds(diagnose(log.state(), t, S)) == [("rank_lost", [2])], t
    progress(log, 0, 116.5, ("0", 7, 7, None, None))
    found = diagnose(log.state(), 116.5, S)
    assert kinds(found) == [("rank_lost", [1]), ("rank_lost", [2]), ("rank_lost", [3])]
    assert "kept it waiting 10 s for an acknowledgement" in found[0]["summary"]
    assert "its agent closed its connection" in found[2]["summary"]


def test_two_processes_claiming_one_rank_name_the_rank_nobody_is_at_once():
    """A launcher's copied environment: the process started as rank 2 asks
    init_process_group for rank 1 too. Every process arrived, so counting processes finds
    nobody missing; counting the ranks they claim, rank 2 is, and never comes."""
    log = Log()
    for r, claimed, t in ((0, 0, 10.0), (1, 1, 10.2), (2, 1, 10.1)):
        log.add(f"s{r}", "hello", hello(r, world=3), t=t)
        log.add(f"s{r}", "init_start", {"rank": claimed, "world_size": 3}, t=t)
    (f,) = diagnose(log.state(), 10.3, S)
    assert (f["kind"], f["ranks"], f["severity"]) == ("init_incomplete", [2], "critical")
    assert "2 processes claim rank 1 (pid 101 on node0, pid 102 on node0, started as rank 2)" \
        in f["summary"], f["summary"]
    assert f["evidence"]["claimed_twice"] == {"1": [
        {"pid": 101, "host": "node0", "started_as": 1},
        {"pid": 102, "host": "node0", "started_as": 2}]}
    # rank 0 late as well (slow to start on a busy host): not named with rank 2, whom the
    # duplicate explains; it is in the evidence's missing
    late = Log()
    for r, claimed, t in ((1, 1, 10.2), (2, 1, 10.1)):
        late.add(f"s{r}", "hello", hello(r, world=3), t=t)
        late.add(f"s{r}", "init_start", {"rank": claimed, "world_size": 3}, t=t)
    (f0,) = diagnose(late.state(), 10.3, S)
    assert (f0["ranks"], f0["evidence"]["missing"]) == ([2], [0, 2]), f0
    assert "so nobody is rank 2 " in f0["summary"], f0["summary"]
    # the duplicate that ended (a launcher started it again as rank 2) claims nothing: rank 2
    # is then only late, a warning after the grace as for any rank not arrived
    log.add("s2", "exit", {"clean": False}, t=11.0)
    log.add("s3", "hello", hello(2, world=3), t=11.5)
    log.add("s3", "init_start", {"rank": 2, "world_size": 3}, t=11.5)
    assert diagnose(log.state(), 12.0, S) == []


def test_a_rendezvous_that_timed_out_names_the_rank_that_came_late_not_those_that_waited():
    """Corpus: init_timeout_slow_rank. init_process_group(timeout=8 s); rank 2 reaches it 20 s
    late. Ranks 0 and 1 fail with errors that say a peer never came; rank 2 then fails to
    reach a store that is gone. Rank 2 is named, once, from the first failure on."""
    log = Log()
    for r in range(3):
        log.add(f"s{r}", "hello", hello(r, world=3), t=10.0)
    for r in (0, 1):
        log.add(f"s{r}", "init_start", {"rank": r, "world_size": 3, "timeout_s": 8.0}, t=10.0)
    log.add("s1", "init_failed", {"error_type": "DistStoreError", "duration_s": 8.9,
                                  "error": "wait timeout after 8000ms, keys: /default_pg/0//cpu//0/0"},
            t=18.9)
    log.add("s0", "init_failed", {"error_type": "DistStoreError", "duration_s": 9.0, "error":
                                  "Timed out after 9 seconds waiting for clients. 2/3 clients joined."},
            t=19.0)
    (f,) = diagnose(log.state(), 19.5, S)
    assert (f["kind"], f["ranks"], f["severity"]) == ("init_incomplete", [2], "critical")
    assert f["summary"] == ("Rank 2 did not arrive at rendezvous in time: ranks 0, 1 gave up "
                            "waiting for it (`init_process_group(timeout=8 s)`)."), f["summary"]
    assert f["first_seen"] == 18.9
    log.add("s2", "init_start", {"rank": 2, "world_size": 3, "timeout_s": 8.0}, t=30.0)
    log.add("s2", "init_failed", {"error_type": "DistNetworkError", "duration_s": 9.6, "error":
                                  "The client socket has timed out after 8000ms while trying to "
                                  "connect to (127.0.0.1, 13282)."}, t=39.6)
    (g,) = diagnose(log.state(), 40.0, S)
    assert (g["id"], g["ranks"]) == (f["id"], [2])
    assert g["summary"].endswith("; rank 2 arrived 11 s after.")


def _rank_0_before_init(cores, io_bps=0.0):
    """Ranks 1 and 2 in their rendezvous since t = 10; rank 0's agent (attached before
    init_process_group, as the launcher wrapper does) reports it running, using ``cores`` of
    a core, without having called it."""
    log = Log()
    for r in range(3):
        log.add(f"s{r}", "hello", hello(r, world=3), t=10.0)
    for r in (1, 2):
        log.add(f"s{r}", "init_start", {"rank": r, "world_size": 3}, t=10.0)

    def beat(t):
        log.add("s0", "heartbeat", {"groups": [], "cpu_s": 1.0 + cores * (t - 10.0),
                                    "io_b": int(io_bps * (t - 10.0))}, t=t)
        for r in (1, 2):
            log.add(f"s{r}", "heartbeat", {"groups": [], "cpu_s": 1.0 + 0.01 * (t - 10.0)}, t=t)
    return log, beat


def test_a_missing_rank_that_works_before_init_is_given_five_times_hang_after():
    """bench/corpus/healthy_rank0_prepares_data_before_init.py: rank 0 prepares the data before
    init_process_group while the others wait in the rendezvous (a critical at 60 s on a
    healthy job before). Its process is here and works: a warning that says so, critical at
    5 x --hang-after."""
    log, beat = _rank_0_before_init(0.9)
    for t in range(10, 80, 5):
        beat(float(t))
    (f,) = diagnose(log.state(), 80.0, DEFAULTS)
    assert (f["kind"], f["ranks"], f["severity"]) == ("init_incomplete", [0], "warning")
    assert f["evidence"]["here"] == {"0": 0.9}
    assert "Rank 0 runs (its agent reports) but has not called init_process_group yet: " \
        "working (rank 0: 90% of a core)" in f["hint"], f["hint"]
    assert "critical once it has waited 300 s" in f["summary"], f["summary"]
    for t in range(80, 320, 5):
        beat(float(t))
    (f,) = diagnose(log.state(), 320.0, DEFAULTS)
    assert f["severity"] == "critical" and "Rank 0 never arrived" in f["summary"]


def test_a_missing_rank_that_moves_data_before_init_works_too():
    """Downloading the dataset: little CPU, tens of MB a second."""
    log, beat = _rank_0_before_init(0.05, 40e6)
    for t in range(10, 80, 5):
        beat(float(t))
    (f,) = diagnose(log.state(), 80.0, DEFAULTS)
    assert f["severity"] == "warning" and "working (rank 0: 40.0 MB/s of I/O)" in f["hint"]


def test_a_missing_rank_blocked_before_init_is_critical_at_hang_after():
    """The same rank using no CPU (blocked before init_process_group: a lock, a dead
    filesystem): critical at --hang-after as a rank that never came, and the hint says it
    runs and where to look."""
    log, beat = _rank_0_before_init(0.0)
    for t in range(10, 75, 5):
        beat(float(t))
    (f,) = diagnose(log.state(), 75.0, DEFAULTS)
    assert (f["kind"], f["ranks"], f["severity"]) == ("init_incomplete", [0], "critical")
    assert f["evidence"]["here"] == {"0": None}
    assert "using no CPU and moving no data, blocked before it" in f["hint"], f["hint"]


def test_init_incomplete_names_the_missing_rank_after_the_grace():
    log = Log()
    for r, t in ((0, 10.0), (2, 11.0)):
        log.add(f"s{r}", "hello", hello(r, world=3), t=t)
        log.add(f"s{r}", "init_start", {"rank": r, "world_size": 3, "master_addr": "10.1.2.3",
                                        "master_port": "29500"}, t=t)
    assert diagnose(log.state(), 13.9, S) == []
    (f,) = diagnose(log.state(), 14.0, S)
    assert f["kind"] == "init_incomplete" and f["ranks"] == [1]
    assert "nc -zv 10.1.2.3 29500" in f["hint"] and f["evidence"]["arrived"] == [0, 2]
    # a warning while the rank may only be slow to start; critical once waited a hang's time
    assert f["severity"] == "warning" and "has not arrived" in f["summary"]
    (f,) = diagnose(log.state(), 11.0 + S.hang_after, S)
    assert f["severity"] == "critical" and "Rank 1 never arrived" in f["summary"]
    assert f["first_seen"] == 14.0
    log.add("s1", "hello", hello(1, world=3), t=20)
    log.add("s1", "init_start", {"rank": 1, "world_size": 3, "master_addr": "10.1.2.3",
                                 "master_port": "29500"}, t=20)
    assert diagnose(log.state(), 21, S) == []


def test_init_failure_is_classified():
    log = Log().add("s1", "hello", hello(1), t=10).add("s1", "init_start", {"rank": 1}, t=10)
    log.add("s1", "init_failed", {"error_type": "DistNetworkError", "duration_s": 4.0, "error":
                                  "The client socket has timed out after 4000ms while trying "
                                  "to connect to (127.0.0.1, 29602)."}, t=14)
    (f,) = diagnose(log.state(), 15, S)
    assert f["kind"] == "init_failed" and f["ranks"] == [1]
    assert f["evidence"]["cause"] == "connect_timeout" and "29602" in f["hint"]


def test_config_mismatch_blames_the_minority():
    log = Log()
    for r in range(3):
        h = hello(r, world=3)
        h["env"] = {"MASTER_PORT": "29500", **({"NCCL_IB_DISABLE": "1"} if r == 1 else {})}
        h["versions"] = {"torch": "2.13.0"}
        log.add(f"s{r}", "hello", h, t=10 + r)
    (f,) = diagnose(log.state(), 20, S)
    assert f["kind"] == "config_mismatch" and f["ranks"] == [1]
    assert f["evidence"]["key"] == "NCCL_IB_DISABLE" and f["first_seen"] == 12
    assert f["severity"] == "warning"
    log.add("s2", "hello", {**hello(2, world=4), "env": {"MASTER_PORT": "29500"},
                            "versions": {"torch": "2.13.0"}}, t=20)
    found = {f["evidence"]["key"]: f for f in diagnose(log.state(), 21, S)}
    assert found["world_size"]["ranks"] == [2] and found["world_size"]["severity"] == "critical"


def test_a_tie_without_rank_0_names_nobody_until_rank_0_breaks_it():
    """Corpus: master_port_stale. Rank 1 reads a stale MASTER_PORT; its hello and rank 2's
    come before rank 0's: one each, and rank 0, which serves the store, breaks the tie."""
    log = Log()
    for r, port in ((1, "25600"), (2, "25599")):
        log.add(f"s{r}", "hello", {**hello(r, world=3), "env": {"MASTER_PORT": port}}, t=10 + r)
    assert diagnose(log.state(), 13, S) == []
    log.add("s0", "hello", {**hello(0, world=3), "env": {"MASTER_PORT": "25599"}}, t=14)
    (f,) = diagnose(log.state(), 15, S)
    assert (f["kind"], f["ranks"], f["severity"]) == ("config_mismatch", [1], "critical")


def test_a_logging_setting_on_one_rank_is_no_mismatch():
    """Corpus: healthy_nccl_debug_one_rank. One node exports NCCL_DEBUG=INFO to look at its
    network: what it logs, not how it talks. A setting that changes behaviour still counts."""
    log = Log()
    for r in range(3):
        h = hello(r, world=3)
        h["env"] = {"MASTER_PORT": "29500",
                    **({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
                        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"} if r == 1 else {})}
        log.add(f"s{r}", "hello", h, t=10 + r)
    assert diagnose(log.state(), 20, S) == []
    log.add("s2", "hello", {**hello(2, world=3),
                            "env": {"MASTER_PORT": "29500", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}},
            t=20)
    (f,) = diagnose(log.state(), 21, S)
    assert (f["kind"], f["ranks"], f["evidence"]["key"]) == (
        "config_mismatch", [2], "TORCH_DISTRIBUTED_DEBUG")


def test_replay_gives_the_same_findings_at_the_same_moment():
    log = running(3)
    for r in (0, 1):
        progress(log, r, 112, ("0", 5, 4, "all_reduce", 101.0))
    a = diagnose(log.state(), 115, S)
    b = diagnose(log.state(), 115, S)
    assert a == b and a


def test_straggler_is_the_rank_that_waits_least_interval_after_interval():
    log = running(4)
    for r in range(3):
        intervals(log, r, "0", [12, 11, 13, 12, 12])
    intervals(log, 3, "0", [0.3, 0.4, 0.3, 0.3, 0.2])
    (f,) = diagnose(log.state(), 106, S)
    assert f["kind"] == "straggler" and f["ranks"] == [3] and f["severity"] == "warning"
    assert f["evidence"]["mean_wait_us"]["3"] < 500


def test_ranks_late_together_are_named_together():
    # a slow node's ranks: 1 and 3 arrive last by turns, 0 and 2 wait for them every step
    log = running(4)
    for r in (0, 2):
        intervals(log, r, "0", [12, 11, 13, 12, 12])
    intervals(log, 1, "0", [0.3, 1.2, 0.3, 1.1, 0.3])
    intervals(log, 3, "0", [1.2, 0.3, 1.1, 0.3, 1.2])
    (f,) = diagnose(log.state(), 106, S)
    assert (f["kind"], f["ranks"]) == ("straggler", [1, 3])
    assert f["summary"].startswith("Ranks 1, 3 are stragglers") and f["id"].endswith(":r1")
    assert "all on node0: look at that host first" in f["hint"]
    # a victim that waits half as long as the others (it is late too, but less) is no straggler
    log = running(5)
    for r in (0, 2):
        intervals(log, r, "0", [12, 11, 13, 12, 12])
    intervals(log, 4, "0", [6, 5.5, 6.5, 6, 6])
    intervals(log, 1, "0", [0.3, 1.2, 0.3, 1.1, 0.3])
    intervals(log, 3, "0", [1.2, 0.3, 1.1, 0.3, 1.2])
    assert [f["ranks"] for f in diagnose(log.state(), 106, S)] == [[1, 3]]


def test_no_straggler_when_waits_are_short_or_spread():
    log = running(4)
    # Short waits: a rank that is consistently fastest by a fraction of a millisecond.
    for r in range(3):
        intervals(log, r, "0", [1.2, 1.1, 1.3, 1.2, 1.2])
    intervals(log, 3, "0", [0.2, 0.2, 0.2, 0.2, 0.2])
    assert diagnose(log.state(), 106, S) == []
    # Long waits, but a different rank arrives last each second (noise, not a straggler).
    log = running(3)
    intervals(log, 0, "0", [0.3, 12, 12, 0.3, 12])
    intervals(log, 1, "0", [12, 0.3, 12, 12, 0.3])
    intervals(log, 2, "0", [12, 12, 0.3, 12, 12])
    assert diagnose(log.state(), 106, S) == []


def test_a_straggler_is_named_once_its_window_holds_only_late_collectives():
    # Two ranks, 8 collectives a half second. Rank 1 slows down in the middle of the third
    # summary: rank 0 waits 10 ms from then on, rank 1 itself 0.3 ms throughout.
    healthy, late = [0.4] * 8, [10.0] * 8
    log = running(2)
    half_seconds(log, 0, [healthy, healthy, [0.4] * 4 + [10.0] * 4, late, late])
    half_seconds(log, 1, [[0.3] * 8] * 5)
    # 16 collectives a window: at 102.5 it holds the mixed summary (12 of 16 late): not yet.
    assert kinds(diagnose(log.state(), 102.5, S)) == []
    half_seconds(log, 0, [late], start=103.5)
    half_seconds(log, 1, [[0.3] * 8], start=103.5)
    (f,) = diagnose(log.state(), 103.5, S)
    assert (f["kind"], f["ranks"], f["evidence"]["intervals"]) == ("straggler", [1], 2)
    assert f["first_seen"] == 103.5


def test_jitter_that_makes_a_rank_wait_at_most_collectives_by_chance_is_no_straggler():
    # Data-loader jitter: each rank of a pair waits at about half of the collectives. A run
    # of luck where rank 0 waits at 13 of 16 (and rank 1 at the other 3) is not nine in ten.
    # Steps late by about the same time are named on 16 collectives, spread ones on 32.
    log = running(2)
    half_seconds(log, 0, [[8, 12, 0.3, 9, 15, 4, 20, 6], [11, 3, 0.3, 25, 7, 0.3, 9, 14]])
    half_seconds(log, 1, [[0.3, 0.3, 6, 0.3, 0.3, 0.3, 0.3, 0.3],
                          [0.3, 0.3, 12, 0.3, 0.3, 4, 0.3, 0.3]])
    assert kinds(diagnose(log.state(), 102.0, S)) == []
    # 15 of 16, but spread from 3 to 25 ms as jitter spreads them (a crowded host's scheduler
    # too): not on 16 collectives; on 32 with nine in ten late, a straggler.
    spread = [[8, 12, 3, 9, 15, 4, 20, 6], [11, 3, 0.3, 25, 7, 5, 9, 14]]
    mine = [[0.3] * 8, [0.3, 0.3, 12, 0.3, 0.3, 0.3, 0.3, 0.3]]
    log = running(2)
    half_seconds(log, 0, spread)
    half_seconds(log, 1, mine)
    assert kinds(diagnose(log.state(), 102.0, S)) == []
    half_seconds(log, 0, spread, start=102.0)
    half_seconds(log, 1, mine, start=102.0)
    (f,) = diagnose(log.state(), 103.0, S)
    assert (f["kind"], f["ranks"], f["evidence"]["intervals"]) == ("straggler", [1], 4)
    # Steady waits (a rank slower by about the same time at every step): 16 are enough.
    log = running(2)
    half_seconds(log, 0, [[10, 11, 9, 10, 12, 10, 9, 11], [10, 0.3, 11, 10, 9, 12, 10, 10]])
    half_seconds(log, 1, mine)
    assert kinds(diagnose(log.state(), 102.0, S)) == [("straggler", [1])]


def test_slow_collective_against_its_own_history():
    log = running(2)
    for r in range(2):
        intervals(log, r, "0", [0.5] * 11 + [40, 38, 41])
    (f,) = diagnose(log.state(), 115, S)
    assert f["kind"] == "slow_collective" and f["ranks"] == [0, 1]
    assert f["evidence"]["baseline_us"] == 500.0
    for tail in ([2, 2, 2], [0.5, 0.5, 40]):  # 4x: normal variation; one stalled second
        log = running(2)
        for r in range(2):
            intervals(log, r, "0", [0.5] * 11 + tail)
        assert diagnose(log.state(), 115, S) == []
    log = running(2)
    for r in range(2):
        intervals(log, r, "0", [0.5] * 11 + [40, 38, 41])
    log.add("s0", "exit", {"clean": True}, t=116)
    log.add("s1", "exit", {"clean": True}, t=116)
    assert diagnose(log.state(), 117, S) == []  # a finished job's last barrier is no finding


def test_straggler_needs_enough_collectives_in_a_quiet_group():
    log = running(3)
    # One collective a second; rank 2 happens to arrive last in the two latest seconds.
    for r, waits in ((0, [1, 4, 4]), (1, [4, 1, 4]), (2, [4, 0.5, 0.5])):
        intervals(log, r, "0", waits, per=1)
    assert diagnose(log.state(), 104, S) == []
    # 25 seconds of rank 2 arriving 90 ms late at every one: now it is named.
    log = running(3)
    for r in range(3):
        intervals(log, r, "0", [0.3] * 25 if r == 2 else [90] * 25, per=1)
    (f,) = diagnose(log.state(), 127, S)
    assert f["kind"] == "straggler" and f["ranks"] == [2]
    assert f["evidence"]["intervals"] == S.straggler_min_calls
    assert 0.08 < f["evidence"]["cost_share"] < 0.1, f["evidence"]


def test_a_straggler_that_costs_the_others_next_to_nothing_is_not_named():
    """Corpus: healthy_async_allreduce_overlap (3 ranks computing 0.3 s a step on 2 cores):
    the others waited for one rank a few ms at every step, 2.5% of their time: a crowded
    host's scheduler, and no loss worth a warning if it were not."""
    for late_ms, named in ((9, []), (40, [2])):
        log = running(3)
        for r in range(3):
            intervals(log, r, "0", [0.3] * 25 if r == 2 else [late_ms] * 25, per=3)
        found = diagnose(log.state(), 127, S)
        assert [f["ranks"] for f in found if f["kind"] == "straggler"] == \
            ([named] if named else []), (late_ms, found)


def test_chain_continues_through_a_rank_stuck_in_ddp():
    # Rank 0 waits in tp group "3" for rank 1; rank 1 sits in DDP's C++ all-reduce on dp
    # group "2" (only the Flight Recorder sees it) waiting for rank 3, which hangs.
    log = running(4, groups=(("0", None), ("2", [1, 3]), ("3", [0, 1])))
    log.add("s0", "heartbeat", {"groups": [
        {"group": "3", "entered": 50, "completed": 49, "inflight_op": "all_reduce",
         "inflight_since": 100.0, "inflight_dtype": "float32", "inflight_bytes": 64}]}, t=112)
    log.add("s1", "heartbeat", {"groups": [
        {"group": "3", "entered": 49, "completed": 49, "inflight_op": None},
        {"group": "2", "entered": 0, "completed": 0, "inflight_op": None,
         "fr_enqueued": 55, "fr_completed": 54, "fr_inflight_since": 100.2}]}, t=112)
    log.add("s3", "heartbeat", {"groups": [
        {"group": "2", "entered": 0, "completed": 0, "inflight_op": None,
         "fr_enqueued": 54, "fr_completed": 54, "fr_inflight_since": None}]}, t=112)
    found = {f["group"]: f for f in diagnose(log.state(), 112.0, S) if f["kind"] == "hang"}
    assert found["3"]["ranks"] == [3]
    assert found["3"]["evidence"]["chain"] == [
        {"rank": 1, "waits_in": "2", "seq": 55, "op": "a C++ collective (DDP)",
             "source": "flight_recorder", "for": [3]}]
    assert found["3"]["summary"].startswith("Rank 3 never reached")
    assert found["2"]["ranks"] == [3] and found["2"]["evidence"]["source"] == "flight_recorder"


def test_a_single_pause_of_one_rank_is_not_a_straggler():
    # Healthy seconds (waits spread over the ranks), then rank 0 pauses once for 5 s (a
    # checkpoint, a crowded host's scheduler): one of the others' collectives waits 5 s, the
    # rest of that second's do not. A straggler is late at most collectives: two seconds of
    # that name it.
    from pgdash_agent.wire import hist_bucket

    healthy = {0: [1, 3, 2, 3, 1, 2], 1: [3, 1, 3, 2, 3, 1], 2: [2, 2, 1, 1, 2, 3]}
    log = running(3)
    for r in range(3):
        intervals(log, r, "0", healthy[r])
        rows = [{"group": "0", "op": "all_reduce", "count": 19, "bytes": 16 * 19,
                 "sum_us": 19 * 1000.0, "max_us": 1000.0, "hist": [[hist_bucket(1000), 19]]}]
        if r != 0:  # the one collective that waited for rank 0's checkpoint
            rows.append({"group": "0", "op": "barrier", "count": 1, "bytes": 0,
                         "sum_us": 5e6, "max_us": 5e6, "hist": [[hist_bucket(5e6), 1]]})
        else:
            rows.append({"group": "0", "op": "barrier", "count": 1, "bytes": 0,
                         "sum_us": 300.0, "max_us": 300.0, "hist": [[hist_bucket(300), 1]]})
        log.add(f"s{r}", "coll_stats", {"start": 106, "end": 107, "rows": rows}, t=107)
    assert kinds(diagnose(log.state(), 107.5, S)) == []
    log = running(3)
    for r in range(3):
        intervals(log, r, "0", healthy[r] + ([0.5, 0.5] if r == 0 else [60, 60]))
    assert kinds(diagnose(log.state(), 109, S)) == [("straggler", [0])]


def test_a_rank_late_because_it_waited_in_another_group_is_a_victim():
    # DP x TP on 4 ranks: tp groups "tp0" = [0, 1], "tp1" = [2, 3]; dp groups "dp0" = [0, 2],
    # "dp1" = [1, 3]. Rank 0 is slow: rank 1 waits for it in tp0 and so arrives last in
    # dp1, where rank 3 waits for rank 1. Rank 1 is a victim; every finding blames rank 0.
    log = running(4, groups=(("tp0", [0, 1]), ("tp1", [2, 3]), ("dp0", [0, 2]),
                              ("dp1", [1, 3])))
    waits = {("tp0", 0): 0.3, ("tp0", 1): 10, ("dp0", 0): 0.3, ("dp0", 2): 10,
             ("dp1", 1): 0.3, ("dp1", 3): 10, ("tp1", 2): 2, ("tp1", 3): 2}
    for (group, rank), ms in waits.items():
        intervals(log, rank, group, [ms] * 4)
    found = diagnose(log.state(), 105, S)
    assert {f["group"]: f["ranks"] for f in found} == {"tp0": [0], "dp0": [0], "dp1": [0]}
    dp1 = next(f for f in found if f["group"] == "dp1")
    assert dp1["evidence"]["chain"][0]["waits"] == 1
    assert dp1["evidence"]["chain"][0]["group"] == "tp0"
    assert "rank 1 waits for rank 0" in dp1["summary"]


def ddp_tallies(log, rank, group, busy, seconds, t=101.0, samples=5):
    """``seconds`` heartbeats of ``rank``: the Flight Recorder found it inside DDP's C++
    collectives on ``group`` in ``busy`` of each second's ``samples`` samples."""
    for i in range(seconds):
        log.add(f"s{rank}", "heartbeat", {"groups": [
            {"group": group, "entered": 0, "completed": 0, "inflight_op": None,
             "fr_enqueued": 10 * (i + 1), "fr_completed": 10 * (i + 1),
             "fr_inflight_since": None, "fr_busy": busy, "fr_samples": samples}]}, t=t + i)


def demo_layout(slow_tallies, busy=((0, 1), (2, 1), (1, 2), (3, 0))):
    """pgdash demo's 4 ranks: DDP (C++) on dp groups "1" = {0, 2} and "2" = {1, 3}, Python
    all-reduces on tp groups "3" = {0, 1} and "4" = {2, 3}. Rank 3 is slow: in tp group 4,
    rank 2 waits for it; rank 1 waits for it inside DDP, so in tp group 3 rank 0 waits for
    rank 1, which looks like a straggler there."""
    log = running(4, groups=(("1", [0, 2]), ("2", [1, 3]), ("3", [0, 1]), ("4", [2, 3])))
    for r, waits in ((0, [12] * 5), (1, [0.3] * 5), (2, [12] * 5), (3, [0.3] * 5)):
        intervals(log, r, "3" if r < 2 else "4", waits)
    if slow_tallies:
        for r, n in busy:
            ddp_tallies(log, r, "1" if r % 2 == 0 else "2", n, slow_tallies)
    return log


def test_a_rank_late_because_it_waits_inside_ddp_is_not_the_straggler():
    (f4, f3) = sorted(diagnose(demo_layout(slow_tallies=5).state(), 106, S),
                      key=lambda f: f["group"], reverse=True)
    assert (f4["group"], f4["ranks"], "waits_in_cpp" in f4["evidence"]) == ("4", [3], False)
    # Group 3 waits for rank 1, but rank 1 sat in DDP's all-reduce waiting for rank 3.
    assert (f3["group"], f3["ranks"]) == ("3", [3])
    assert f3["evidence"]["waits_in_cpp"] == [
        {"waits": 1, "rank": 3, "group": "2", "busy_share": {"1": 0.4, "3": 0.0}}]
    assert "rank 1 waits for rank 3 inside group 2" in f3["summary"]


def test_a_straggler_in_a_ddp_job_waits_for_enough_recorder_samples():
    # Two seconds of samples (10 per rank) cannot tell whether rank 1 waits inside DDP.
    found = diagnose(demo_layout(slow_tallies=2).state(), 106, S)
    assert [(f["group"], f["ranks"]) for f in found] == []
    # An agent that takes no samples: the rule judges on the Python collectives alone.
    log = demo_layout(slow_tallies=0)
    ddp_tallies(log, 1, "2", 0, 1, samples=0)  # (an agent that samples sends 0 of 0)
    found = diagnose(log.state(), 106, S)
    assert [(f["group"], f["ranks"]) for f in found] == []
    log = demo_layout(slow_tallies=0)
    for r in range(4):
        log.add(f"s{r}", "heartbeat", {"groups": [
            {"group": "1" if r % 2 == 0 else "2", "entered": 0, "completed": 0,
             "inflight_op": None, "fr_enqueued": 9, "fr_completed": 9}]}, t=105.0)
    found = diagnose(log.state(), 106, S)
    assert sorted((f["group"], f["ranks"]) for f in found) == [("3", [1]), ("4", [3])]


def test_shares_too_close_to_call_hold_the_finding_rather_than_guess():
    # Rank 1 found in flight 3 times in 30 samples, rank 3 twice: neither "waits" nor
    # "does not wait" is clear yet, so group 3's straggler is not named (rank 3 is, in 4).
    busy = ((0, 0), (2, 0), (1, 1), (3, 0))
    log = demo_layout(slow_tallies=0)
    for r, n in busy:
        ddp_tallies(log, r, "1" if r % 2 == 0 else "2", n, 3)
        ddp_tallies(log, r, "1" if r % 2 == 0 else "2", 0 if r != 3 else 1, 2, t=104.0)
    found = diagnose(log.state(), 106, S)
    assert [(f["group"], f["ranks"]) for f in found] == [("4", [3])]
    assert found[0]["evidence"]["cpp_groups_checked"][0]["rank"] == 3


def test_no_sample_in_flight_yet_is_no_proof_of_not_waiting():
    # Five seconds after DDP started, neither rank 1 nor rank 3 was ever found in flight:
    # that cannot yet tell which of them waits for the other (a wait may have just begun),
    # so both groups wait; once ten seconds of samples still show nothing, each tp group's
    # own straggler is named.
    busy = ((0, 0), (2, 0), (1, 0), (3, 0))
    found = diagnose(demo_layout(slow_tallies=5, busy=busy).state(), 106, S)
    assert found == []
    log = demo_layout(slow_tallies=0)
    for r, n in busy:
        ddp_tallies(log, r, "1" if r % 2 == 0 else "2", n, 12, t=95.0)
    found = diagnose(log.state(), 106, S)
    assert sorted((f["group"], f["ranks"]) for f in found) == [("3", [1]), ("4", [3])]


def test_a_rank_whose_connection_the_server_hears_is_not_lost_while_the_fold_reads_it_late():
    """An agent waiting for acks from a server behind its agents sends nothing more, and its
    next batch lands after the others' (a healthy 1,024-rank job beside a CPU hog got 925
    rank_lost criticals so): the live server's connections say it is there (Settings.heard)."""
    log = running(4)  # every rank reported at 100
    for r in range(3):
        progress(log, r, 117.0, ("0", 12, 12, None, None))  # the others read 17 s past it
    assert kinds(diagnose(log.state(), 122.0, S)) == [("rank_lost", [3])]
    heard_at: dict[str, float] = {"s3": 121.0}
    live = dataclasses.replace(S, heard=lambda session, at: min(heard_at.get(session, at), at))
    assert diagnose(log.state(), 122.0, live) == []
    heard_at["s3"] = 106.9  # heard last 15.1 s before: its connection is quiet too
    assert kinds(diagnose(log.state(), 122.0, live)) == [("rank_lost", [3])]
    cannot_say = dataclasses.replace(S, heard=lambda session, at: None)
    assert kinds(diagnose(log.state(), 122.0, cannot_say)) == [("rank_lost", [3])]


def test_a_dropped_connection_is_back_when_the_server_hears_its_agent_again():
    log = running(3)
    for r in range(3):
        progress(log, r, 100.5, ("0", 5, 5, None, None))
    log.add("s1", "disconnect", {}, t=101.0)
    for r in (0, 2):
        progress(log, r, 110.0, ("0", 9, 9, None, None))
    assert kinds(diagnose(log.state(), 110.0, S)) == [("rank_lost", [1])]
    back = dataclasses.replace(S, heard=lambda session, at: 109.0 if session == "s1" else at)
    assert diagnose(log.state(), 110.0, back) == []  # its reconnection is not folded yet
    before_close = dataclasses.replace(S, heard=lambda session, at: 100.9)
    assert kinds(diagnose(log.state(), 110.0, before_close)) == [("rank_lost", [1])]


def test_a_silent_rank_still_connected_reads_frozen_once_a_rank_of_its_host_read_it():
    """Heartbeats stopped, connection open: not "vanished". Read from outside by a rank of
    its host (a snapshot's peer reading), it is named frozen, with where it holds the GIL."""
    log = running(2)
    for t in (101, 102, 103):
        progress(log, 0, t, ("0", 5, 4, "all_reduce", 101.0))
    progress(log, 1, 101, ("0", 4, 4, None, None))
    for t in range(104, 125):
        progress(log, 0, t, ("0", 5, 4, "all_reduce", 101.0))
    lost = next(f for f in diagnose(log.state(), 124.0, S) if f["kind"] == "rank_lost")
    assert lost["ranks"] == [1] and "went silent" in lost["summary"]
    assert "its connection still open" in lost["summary"] and "frozen" in lost["hint"]
    dump = ('Thread 101 (active+gil): "MainThread"\n    sre_ucs1_match (_sre/sre_lib.h:1200)\n'
            '    match (re/__init__.py:166)\n    inject (/job/train.py:38)\n')
    log.add("s0", "snapshot", {"ask": "a1", "threads": [], "for_rank": 1, "peer_dump": dump},
            t=110.0)
    lost = next(f for f in diagnose(log.state(), 124.0, S) if f["kind"] == "rank_lost")
    assert lost["summary"].endswith(
        "rank 0 on its host read it from outside: blocked with the GIL held by its thread "
        "MainThread, in match (re/__init__.py:166), called from inject (/job/train.py:38).")
    assert lost["summary"].startswith("Rank 1 is frozen")
    assert lost["evidence"]["read_from_outside"] == {"by": 0, "t": 110.0,
                                                     "gil_held_by": "MainThread"}
    # Rank 1's own host reader (pgdash_agent.reader, started by rank 1) reads it later: a
    # reading stored in rank 1's session, which does not make rank 1 heard.
    log.add("s1", "read", {"ask": "a2", "for_rank": 1, "peer_dump": dump,
                           "reader_pid": 4242}, t=115.0)
    lost = next(f for f in diagnose(log.state(), 124.0, S) if f["kind"] == "rank_lost")
    assert lost["summary"].startswith("Rank 1 is frozen") and (
        "pgdash's reader process on its host (pid 4242) read it from outside: blocked with "
        "the GIL held by its thread MainThread") in lost["summary"], lost["summary"]
    assert lost["evidence"]["read_from_outside"] == {
        "by": 1, "t": 115.0, "gil_held_by": "MainThread", "host_reader": True,
        "reader_pid": 4242}
    gone = running(2)  # a rank whose connection closed: it vanished, as before
    for t in range(101, 112):
        progress(gone, 0, t, ("0", t, t, None, None))
    gone.add("s1", "disconnect", {}, t=104.0)
    (lost,) = [f for f in diagnose(gone.state(), 111.0, S) if f["kind"] == "rank_lost"]
    assert lost["ranks"] == [1] and "vanished" in lost["summary"] and "died" in lost["hint"]


def test_a_bigger_job_is_judged_on_a_coarser_grid_the_same_live_and_in_replay():
    """Up to 256 ranks every moment of the grid (0.5 s), up to 512 every second, above that
    every two seconds: a judgement's cost grows with the ranks. The grid is a function of the
    state, so a second book over the same state judges the same moments."""
    from dashboard.diagnosis.book import Book
    from tests.helpers.events import running

    class Counting(Book):
        def update(self, state, now):
            self.judged.append(now)
            return super().update(state, now)

    for world, every in ((8, 0.5), (256, 0.5), (300, 1.0), (512, 1.0), (513, 2.0), (1024, 2.0)):
        state = running(world).state()
        seen = []
        for _ in range(2):
            book = Counting(S)
            book.judged = []
            book.tick_through(state, 1000.0)  # the first tick starts the grid
            book.tick_through(state, 1010.0)
            seen.append(book.judged)
        assert seen[0] == seen[1]
        gaps = {round(b - a, 3) for a, b in zip(seen[0], seen[0][1:])}
        assert gaps == {every}, (world, gaps)
        assert all(t % every == 0 for t in seen[0]), (world, seen[0][:3])


def test_the_first_bucket_above_a_latency_is_the_one_a_bucket_by_bucket_search_finds():
    import math
    import random

    from dashboard.diagnosis.rules.windows import Windows, first_bucket_above
    from dashboard.state.recent import RecentWindows
    from pgdash_agent.wire import HIST_MAX_BUCKET, hist_bucket_value

    values = [hist_bucket_value(b) for b in range(HIST_MAX_BUCKET + 1)]
    rng = random.Random(7)
    latencies = (values + [math.nextafter(v, 0.0) for v in values]
                 + [math.nextafter(v, math.inf) for v in values]
                 + [rng.uniform(0.0, 1e7) for _ in range(2000)]
                 + [10 ** rng.uniform(-300, 300) for _ in range(2000)]
                 + [0.0, -1.0, 5e-324, 1.0, 1e300, math.inf, -math.inf, math.nan])
    for us in latencies:
        want = next((b for b, v in enumerate(values) if v > us), HIST_MAX_BUCKET + 1)
        assert first_bucket_above(us) == want, us
    hist = {b: b + 1 for b in range(0, HIST_MAX_BUCKET + 1, 7)}
    # One rank's summaries, the histogram split over two of them, pooled as the rules pool.
    flat = [x for pair in sorted(hist.items()) for x in pair]
    half = len(flat) // 4 * 2
    windows = Windows(RecentWindows.of({3: [(1.0, 1, 1.0, flat[:half]),
                                            (2.0, 1, 1.0, flat[half:])]}).columns())
    pooled = windows.pooled(2)
    for us in latencies[::50]:
        want = sum(c for b, c in hist.items() if hist_bucket_value(b) > us)
        assert pooled.counts_above(us) == [want], us
        assert pooled.shares_above(us) == [want / sum(hist.values())], us


def test_groups_judged_together_get_the_verdicts_each_gets_alone():
    """The straggler rule judges all groups of one size at once (rules.windows.Windows); a
    group's verdict must be the one it gets judged alone, whatever its neighbours in the
    stack hold: bench/fold.py's 32-rank mesh (groups of 2, 4, 8 and the world), one rank
    waiting least throughout, at several moments and windows back."""
    from bench.fold import T0, build_log
    from dashboard.diagnosis.rules.straggler_verdict import straggler_in, stragglers_in
    from dashboard.diagnosis.rules.windows import stacked_windows
    from dashboard.state import JobState

    def seen(v):
        return None if v is None else (v.rank, v.medians, v.typical, v.intervals, v.share,
                                       v.recent.ranks, v.recent.cols.sizes.tolist())

    events = build_log(ranks=32, seconds=40, hang_at=None, slow_rank=5, seed=2)
    state, at, named = JobState(1, "j"), 0, 0
    for moment in (12.0, 25.0, 40.0):
        while at < len(events) and events[at]["received_at"] <= T0 + moment:
            state.apply(events[at])
            at += 1
        stacks = stacked_windows(state, T0 + moment)
        assert len(stacks) >= 3 and any(windows.groups > 1 for _, windows in stacks)
        for groups, windows in stacks:
            for back in range(4):
                together = stragglers_in(windows, back, Settings())
                alone = [straggler_in(windows.group(g), back, Settings())
                         for g in range(len(groups))]
                assert list(map(seen, together)) == list(map(seen, alone)), (moment, groups)
                named += sum(v is not None for v in together)
    assert named  # rank 5 is named somewhere: the verdicts compared are not all None


def test_a_flight_recorder_row_without_its_count_is_read_as_zero_not_a_crash():
    """The wire omits defaults: a row whose fr_enqueued is 0 (or whose key a corrupt file
    misspelled, as test_fuzz once generated) has none, and the stall and hang rules read it
    (a KeyError there stopped every judgement of the job)."""
    log = running(2)
    for r in (0, 1):
        log.add(f"s{r}", "heartbeat", {"groups": [
            {"group": "0", "entered": 3, "completed": 3, "inflight_op": None,
             "inflight_since": None, "fr_inflight_since": 100.0}]}, t=101.0)
    assert diagnose(log.state(), 101.0, S) == []


def test_a_rule_that_raises_costs_only_its_own_findings_and_is_counted(monkeypatch, capsys):
    from dashboard.diagnosis import rules
    from dashboard.web.metrics import Snapshot, exposition

    def broken(state, now, s):
        return [][0]

    monkeypatch.setattr(rules, "RULES", [broken, *rules.RULES])
    log = Log()
    for r in (0, 2):
        log.add(f"s{r}", "hello", hello(r, world=3), t=10.0)
        log.add(f"s{r}", "init_start", {"rank": r, "world_size": 3}, t=10.0)
    try:
        found = diagnose(log.state(), 30.0, S)
        assert ("init_incomplete", [1]) in kinds(found)  # the other rules still judged
        assert rules.RULE_ERRORS["broken"] == 1
        assert "rule broken failed (job 1; 1 time(s))" in capsys.readouterr().err
        metrics = exposition(Snapshot([], [], {"rule_errors:broken": 1}, 0, 0))
        assert 'pgdash_rule_errors_total{rule="broken"} 1.0' in metrics
    finally:
        del rules.RULE_ERRORS["broken"]
