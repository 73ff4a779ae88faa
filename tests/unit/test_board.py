"""The board (pgdash_agent.board): what a rank writes as it enters and completes collectives,
read back by another process after the rank is gone, and the frame the server takes it in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from pgdash_agent import board
from pgdash_agent.collectives import GroupTrack
from pgdash_agent.wire import WireError, validate_boards


def track(name):
    return GroupTrack(name, None, "gloo", [0, 1])


def test_a_board_says_what_each_group_is_inside_and_what_it_completed(tmp_path):
    b = board.Board(tmp_path, rank=3)
    t0 = time.perf_counter()
    world, seven = track("0"), track("7")
    b.enter(world, 1, "all_reduce", torch.float32, 8192, t0, None)
    b.done(world, 1, 8192)  # returned
    b.enter(world, 2, "all_reduce", torch.float32, 4, t0, None)  # inside #2
    b.enter(seven, 5, "broadcast", torch.int64, 16, t0, 1)
    b.complete(seven, 5)  # an async call seen complete: its number only
    (read,) = board.read_all(tmp_path, clean=False)
    assert (read["rank"], read["pid"], read["alive"]) == (3, os.getpid(), True)
    inside, done = read["groups"]
    assert {k: v for k, v in inside.items() if k != "inflight_since"} == {
        "group": "0", "entered": 2, "completed": 1, "inflight_op": "all_reduce",
        "inflight_dtype": "float32", "inflight_bytes": 4, "done_op": "all_reduce",
        "done_dtype": "float32", "done_bytes": 8192}
    assert abs(inside["inflight_since"] - time.time()) < 5  # the monotonic clock, made wall
    assert done == {"group": "7", "entered": 5, "completed": 5}
    assert validate_boards({"t": time.time(), "boards": [read]})["boards"][0] == read
    b.close()
    assert board.read_all(tmp_path) == [] and not (tmp_path / f"{os.getpid()}.board").exists()


def test_a_board_outlives_its_process_and_the_last_read_removes_it(tmp_path):
    """The rank dies inside a collective (here, killed by its own SIGKILL right after entering
    it): its board still says so, and the process reads as gone."""
    code = ("import os, signal, sys, time, torch; from pathlib import Path; "
            "from pgdash_agent import board; from pgdash_agent.collectives import GroupTrack; "
            "b = board.Board(Path(sys.argv[1]), rank=1); "
            "b.enter(GroupTrack('0', None, None, [0, 1]), 9, 'all_gather', torch.bfloat16, 64, "
            "time.perf_counter(), None); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], timeout=120)
    (read,) = board.read_all(tmp_path, clean=False)
    assert read["rank"] == 1 and read["alive"] is False
    assert read["groups"][0]["inflight_op"] == "all_gather"
    assert read["groups"][0]["inflight_dtype"] == "bfloat16"
    assert board.read_all(tmp_path)  # the last words: read once more, then removed
    assert not tmp_path.exists()


def test_a_board_holds_so_many_groups_and_ignores_what_is_not_a_board(tmp_path):
    b = board.Board(tmp_path, rank=0)
    tracks = [track(str(g)) for g in range(board.SLOTS + 5)]
    for t in tracks:
        b.enter(t, 1, "barrier", None, 0, 0.0, None)
    (tmp_path / "junk.board").write_bytes(b"not a board")
    (read,) = board.read_all(tmp_path, clean=False)
    assert len(read["groups"]) == board.SLOTS
    assert read["groups"][0] == {"group": "0", "entered": 1, "completed": 0,
                                 "inflight_op": "barrier", "inflight_dtype": None,
                                 "inflight_bytes": 0, "inflight_since": read["groups"][0][
                                     "inflight_since"]}
    assert tracks[-1].board_off == -1  # no slot left: not written
    b.close()
    b.enter(tracks[0], 2, "barrier", None, 0, 0.0, None)  # closed: a late call changes nothing
    b.complete(tracks[0], 2)


def test_no_board_without_a_rank_or_a_launch():
    assert board.Board.make(None, 0) is None and board.Board.make("k", None) is None


def test_the_last_read_says_how_each_rank_ended_before_or_after_its_launcher_reaps_it(tmp_path):
    """A scheduler's cancel SIGTERMs the ranks and the reader together: the reader waits a
    moment for its ranks to end and reads each one's wait status while it is a zombie (this
    test, its launcher, reaps none until the read), or, for a SIGTERM, the mark faulthandler
    left beside the board as the signal arrived (the launcher reaped it first). A process
    forked from a rank (a DataLoader worker) that is SIGTERMed leaves no mark of the rank's.
    A rank SIGKILLed and reaped says only that it did not die of SIGTERM; one still running
    when the wait runs out says nothing."""
    code = ("import os, signal, sys, time; from pathlib import Path; "
            "from pgdash_agent import board; "
            "b = board.Board(Path(sys.argv[1]), rank=int(sys.argv[2])); how = sys.argv[3]; "
            "r, w = os.pipe(); kid = os.fork() if how == 'fork' else 1; "
            "kid or (os.write(w, b'.'), time.sleep(60)); "
            "kid != 1 and (os.read(r, 1), os.kill(kid, signal.SIGTERM), os.waitpid(kid, 0)); "
            "print('ready', flush=True); "
            "time.sleep(60) if how in ('wait', 'fork') else "
            "os.kill(os.getpid(), signal.SIGABRT) if how == 'abort' else os._exit(3)")
    hows = ("wait", "abort", "exit", "wait", "wait", "wait", "fork")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(rank), how],
                              stdout=subprocess.PIPE, text=True)
             for rank, how in enumerate(hows)]
    waiting, _, _, reaped, _, killed, forked = procs
    try:
        for p in procs:
            assert p.stdout.readline() == "ready\n"
        for p, sig in ((waiting, signal.SIGTERM), (reaped, signal.SIGTERM),
                       (killed, signal.SIGKILL), (forked, signal.SIGKILL)):
            os.kill(p.pid, sig)
        reaped.wait(60)  # reaped: its wait status is gone, its mark stays
        killed.wait(60)
        forked.wait(60)
        reads = {b["rank"]: b for b in board.read_all(tmp_path, clean=False, settle_s=0.3)}
        assert {r: reads[r].get("ended") for r in reads} == {
            0: {"signal": "SIGTERM"}, 1: {"signal": "SIGABRT"}, 2: {"code": 3},
            3: {"signal": "SIGTERM"}, 4: None, 5: {"not_sigterm": True},
            6: {"not_sigterm": True}}
        assert [reads[r]["alive"] for r in range(7)] == [False] * 4 + [True] + [False] * 2
        frame = validate_boards({"t": time.time(), "boards": list(reads.values())})
        assert frame["boards"][0]["ended"] == {"signal": "SIGTERM"}
        board.read_all(tmp_path)  # the last words remove the marks with the boards
        assert not list(tmp_path.glob(f"{reaped.pid}.*"))
    finally:
        for p in procs:
            p.kill()
            p.wait(60)
            p.stdout.close()


def test_the_watch_reads_how_a_rank_ended_before_its_launcher_reaps_it(tmp_path):
    """torchrun reaps a dead rank within 0.1 s, long before the reader's last words: the host
    reader's watch wakes as each rank ends and reads its wait status while it is a zombie."""
    code = ("import os, signal, sys, time; from pathlib import Path; "
            "from pgdash_agent import board; "
            "board.Board(Path(sys.argv[1]), rank=int(sys.argv[2])); print('ready', flush=True); "
            "time.sleep(float(sys.argv[3])); os.kill(os.getpid(), signal.SIGSEGV)")
    told = []
    watch = board.Watch(tmp_path, told.append, rescan_s=0.05)
    going = threading.Event()
    going.set()
    thread = threading.Thread(target=watch.run, args=(going.is_set,), daemon=True)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(rank), wait],
                              stdout=subprocess.PIPE, text=True)
             for rank, wait in ((0, "1.0"), (1, "60"))]
    try:
        for p in procs:
            assert p.stdout.readline() == "ready\n"
        thread.start()
        crashed = procs[0]
        deadline = time.monotonic() + 60
        while crashed.pid not in watch.ended and time.monotonic() < deadline:
            time.sleep(0.05)
        crashed.wait(60)  # the launcher reaps it
        assert watch.ended == {crashed.pid: {"signal": "SIGSEGV"}} and told == [crashed.pid]
        reads = {b["rank"]: b.get("ended") for b in board.read_all(tmp_path, clean=False)}
        assert reads == {0: {"not_sigterm": True}, 1: None}  # (what is left without the watch)
        reads = {b["rank"]: b.get("ended")
                 for b in board.read_all(tmp_path, clean=False, seen=watch.ended)}
        assert reads == {0: {"signal": "SIGSEGV"}, 1: None}
    finally:
        going.clear()
        for p in procs:
            p.kill()
            p.wait(60)
            p.stdout.close()
        thread.join(10) if thread.is_alive() else None


def test_a_rank_that_ends_cleanly_or_handles_sigterm_itself_is_left_as_it_was(tmp_path):
    """The mark changes nothing a program sees: SIGTERM still ends it (by SIGTERM, as its
    launcher reads it), a handler set before the board keeps it unmarked, and a clean close
    gives SIGTERM its default action back."""
    b = board.Board(tmp_path, rank=0)
    assert (tmp_path / f"{os.getpid()}.term").exists()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    b.close()
    assert not list(tmp_path.glob("*")) and board._marked == []
    code = ("import faulthandler, signal, sys, time; from pathlib import Path; "
            "from pgdash_agent import board; "
            "signal.signal(signal.SIGTERM, lambda *_: sys.exit(5)) if sys.argv[2] == 'own' "
            "else faulthandler.register(signal.SIGTERM, file=sys.stderr, chain=True) "
            "if sys.argv[2] == 'dump' else None; "
            "board.Board(Path(sys.argv[1]), rank=0); print('ready', flush=True); "
            "time.sleep(60)")
    # (dump: the program's own faulthandler dump on SIGTERM, which Python's signal module does
    # not see: kept, not replaced by the mark)
    for own, returncode, marked in (("own", 5, False), ("dump", -signal.SIGTERM, False),
                                    ("default", -signal.SIGTERM, True)):
        tmp_path.mkdir(exist_ok=True)  # (the clean close removed it: its last board)
        p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), own],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline() == "ready\n"
            p.terminate()
            assert p.wait(60) == returncode
            assert ("most recent call first" in p.stderr.read()) is (own == "dump")
        finally:
            p.kill()
            p.wait(60)
            p.stdout.close()
            p.stderr.close()
        assert board._term_mark(tmp_path / f"{p.pid}.board") == (
            {"signal": "SIGTERM"} if marked else None)


@pytest.mark.parametrize("bad, field", [
    ({"t": 1.0, "boards": [{"rank": -1, "pid": 5, "alive": False, "groups": []}]}, "rank"),
    ({"t": 1.0, "boards": [{"rank": 0, "pid": 5, "alive": False, "groups": [],
                            "ended": {"signal": "SIGTERM", "code": 1}}]}, "ended"),
    ({"t": 1.0, "boards": [{"rank": 0, "pid": 5, "alive": False, "groups": [],
                            "ended": {"code": 300}}]}, "code"),
    ({"t": 1.0, "boards": [{"rank": 0, "pid": 5, "alive": False, "groups": [],
                            "ended": {}}]}, "ended"),
    ({"t": 1.0, "boards": [{"rank": 0, "pid": 5, "alive": False,
                            "groups": [{"group": "0", "entered": "x", "completed": 0}]}]},
     "entered"),
    ({"boards": []}, "t"),
])
def test_a_bad_boards_frame_is_refused_naming_its_field(bad, field):
    with pytest.raises(WireError, match=field):
        validate_boards(bad)


def test_boards_of_launches_killed_whole_are_swept_by_the_next_board(tmp_path, monkeypatch):
    """Every process SIGKILLed, the reader too: nobody reads or removes their boards. A new
    board removes those of processes that are gone, a minute untouched, and their folders."""
    monkeypatch.setattr(board.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(board.os.path, "isdir", lambda p: False)  # (not /dev/shm)
    old = board.directory("killed launch")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    for pid in (dead, str(os.getpid())):
        (old / f"{pid}.board").write_bytes(b"\0" * board.SIZE)
        os.utime(old / f"{pid}.board", (time.time() - 120, time.time() - 120))
    fresh = old / "1.board"
    fresh.write_bytes(b"\0" * board.SIZE)  # gone, but touched just now: kept
    board.directory("another launch")
    assert sorted(p.name for p in old.iterdir()) == sorted(["1.board", f"{os.getpid()}.board"])
