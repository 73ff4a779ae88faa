"""Incidents and the stall warning on plain data: grouping by root cause, stable ids, and a
stall that names the missing rank long before --hang-after, but not for a healthy pause."""

import http.server
import json
import threading

import pytest

from dashboard.diagnosis import Settings, diagnose, finding
from dashboard.diagnosis.incidents import incidents
from dashboard.web.notify import Notifier, check_url, payload
from tests.helpers.events import intervals, progress, running

S = Settings(hang_after=60.0)


def waiting_for(log, last, seq, since, t, groups=("0",)):
    """Every rank but ``last`` waits in collective ``seq`` of each group since ``since``."""
    world = len(log.state().ranks())
    for r in range(world):
        rows = [(g, seq, seq - 1, "all_reduce", since) if r != last else
                (g, seq - 1, seq - 1, None, None) for g in groups]
        progress(log, r, t, *rows)


def history(log, world, group="0", ms=2.0, seconds=3, per=20):
    for r in range(world):
        intervals(log, r, group, [ms] * seconds, per=per)


# -- stall ------------------------------------------------------------------------------------

def test_stall_names_the_missing_rank_after_the_floor_then_hang_takes_over():
    log = running(3)
    history(log, 3)  # 60 collectives a rank of 2 ms: the floor (10 s) decides
    waiting_for(log, 2, 61, since=110.0, t=111.0)
    assert diagnose(log.state(), 119.9, S) == []
    (f,) = diagnose(log.state(), 120.5, S)
    assert (f["kind"], f["severity"], f["ranks"], f["group"]) == ("stall", "warning", [2], "0")
    assert f["first_seen"] == 120.0 and f["evidence"]["waiting"] == [0, 1]
    assert f["evidence"]["threshold_s"] == 10.0 and f["summary"].startswith("Rank 2 ")
    # At --hang-after the stall becomes the critical hang; never both at once.
    waiting_for(log, 2, 61, since=110.0, t=170.5)  # heartbeats go on
    assert [x["kind"] for x in diagnose(log.state(), 171.0, S)] == ["hang"]
    # The peer arrives: the stall resolves by itself.
    for r in range(3):
        progress(log, r, 171.0, ("0", 61, 61, None, None))
    assert diagnose(log.state(), 171.5, S) == []


def test_a_group_whose_collectives_are_slow_waits_longer_before_a_stall():
    log = running(3)
    history(log, 3, ms=4000.0, per=2, seconds=12)  # 24 collectives of 4 s: 10 x p99 ~ 40 s
    waiting_for(log, 2, 25, since=200.0, t=201.0)
    assert diagnose(log.state(), 215.0, S) == []
    waiting_for(log, 2, 25, since=200.0, t=244.0)
    (f,) = diagnose(log.state(), 245.0, S)
    assert f["kind"] == "stall" and f["evidence"]["threshold_s"] >= 35.0


def test_warm_up_is_judged_with_the_warm_up_floor():
    log = running(3)  # no collective completed yet: a first step may compile for a while
    waiting_for(log, 2, 1, since=110.0, t=134.0)
    assert diagnose(log.state(), 135.0, S) == []
    (f,) = diagnose(log.state(), 141.0, S)
    assert f["kind"] == "stall" and f["evidence"]["warmup"] is True


def test_a_collective_every_rank_entered_is_no_stall():
    log = running(3)
    history(log, 3)
    for r in range(3):
        progress(log, r, 129.0, ("0", 61, 60, "all_reduce", 110.0))
    assert diagnose(log.state(), 130.0, S) == []


def test_a_checkpoint_pause_of_a_few_seconds_says_nothing():
    # Rank 0 checkpoints for 5 s while ranks 1 and 2 wait in the barrier after the step.
    log = running(3)
    history(log, 3)
    waiting_for(log, 0, 61, since=110.0, t=111.0)
    for now in (112.0, 114.0, 115.5):
        assert diagnose(log.state(), now, S) == []


# -- incidents --------------------------------------------------------------------------------

def test_one_frozen_rank_seen_in_five_groups_is_one_incident():
    log = running(8, groups=[(str(g), None) for g in range(5)])
    history(log, 8)
    for g in range(5):
        history(log, 8, group=str(g))
    waiting_for(log, 7, 61, since=110.0, t=111.0, groups=[str(g) for g in range(5)])
    found = diagnose(log.state(), 125.0, S)
    assert len(found) == 5 and {f["kind"] for f in found} == {"stall"}
    (inc,) = incidents(found)
    assert (inc["id"], inc["kind"], inc["severity"], inc["ranks"]) == \
        ("hang:r7", "stall", "warning", [7])
    assert sorted(inc["findings"]) == sorted(f["id"] for f in found)
    assert "Rank 7 holds up the job" in inc["summary"] and "5 groups" in inc["summary"]
    # At --hang-after: the same incident, now critical, with the stalls as history.
    waiting_for(log, 7, 61, since=110.0, t=170.5, groups=[str(g) for g in range(5)])
    later = diagnose(log.state(), 171.0, S)
    book = {f["id"]: f for f in found}
    for f in book.values():
        f["active"] = False
    book.update({f["id"]: f for f in later})
    (inc2,) = incidents(book.values())
    assert (inc2["id"], inc2["kind"], inc2["severity"]) == ("hang:r7", "hang", "critical")
    assert len(inc2["findings"]) == 10 and inc2["first_seen"] == 120.0
    assert "hangs the job" in inc2["summary"]
    # Replay gives the same incident from the findings active at that moment.
    (replayed,) = incidents(later)
    assert (replayed["id"], replayed["kind"], replayed["ranks"]) == ("hang:r7", "hang", [7])


def f_(kind, ranks, group=None, severity="critical", t=100.0, active=True, key="", **ev):
    f = finding(kind, severity, ranks, group, f"{kind} on {ranks}", f"fix {kind}", ev, t,
                key=key or f"r{ranks}")
    f["active"] = active
    return f


def test_a_crash_and_the_hang_it_causes_are_one_incident():
    found = [f_("rank_failed", [1], t=100.0), f_("hang", [1], "0", t=170.0, waiting=[0, 2]),
             f_("rank_failed", [3], t=300.0, key="r3")]
    incs = incidents(found)
    assert [(i["id"], i["kind"], i["ranks"]) for i in incs] == [
        ("crash:r3", "rank_failed", [3]), ("crash:r1", "rank_failed", [1])]
    crash = incs[1]
    assert len(crash["findings"]) == 2 and crash["hint"] == "fix rank_failed"
    assert crash["chain"][0]["link"].startswith("root cause: rank_failed on the job")
    assert "1 related finding (hang)" in crash["summary"]


def test_a_gpu_fault_and_the_straggler_it_makes_are_one_incident():
    found = [f_("straggler", [2], "0", "warning", t=90.0),
             f_("gpu_fault", [2], t=100.0), f_("straggler", [0], "1", "warning", t=95.0)]
    incs = {i["id"]: i for i in incidents(found)}
    assert set(incs) == {"gpu:r2", "straggler:r0"}
    assert incs["gpu:r2"]["kind"] == "gpu_fault" and incs["gpu:r2"]["first_seen"] == 90.0


def test_a_straggler_incident_leads_with_the_group_that_waits_for_the_culprit_itself():
    """The demo's shape: in tp the others wait for rank 1, which waits for rank 3 in dp (a
    hop), seen first; in dp they wait for rank 3 itself. The incident reads from dp."""
    hop = [{"rank": 3, "waits": 1, "group": "dp"}]
    found = [f_("straggler", [3], "tp", "warning", t=90.0, chain=hop),
             f_("straggler", [3], "dp", "warning", t=91.0)]
    [inc] = incidents(found)
    assert inc["ranks"] == [3] and inc["first_seen"] == 90.0
    assert inc["chain"][0]["link"] == "root cause: the ranks of group dp keep waiting for rank 3"
    assert inc["summary"].startswith("straggler on [3]") and "1 related finding" in inc["summary"]


def test_unrelated_causes_and_group_wide_slowness_stay_apart():
    found = [f_("config_mismatch", [1], key="NCCL_IB"), f_("rank_failed", [1]),
             f_("slow_collective", [0, 1, 2], "0", "warning", key="latest"),
             f_("hang", [2], "0", t=120.0, waiting=[0, 1])]
    ids = sorted(i["id"] for i in incidents(found))
    assert ids == ["config:r1", "crash:r1", "hang:r2", "slow:r0-1-2"]


def test_resolved_incidents_stay_listed_and_do_not_glue_live_ones():
    found = [f_("straggler", [1, 2], "0", "warning", t=50.0, active=False),
             f_("hang", [1], "0", t=100.0), f_("hang", [2], "1", t=101.0)]
    incs = incidents(found)
    assert [(i["id"], i["active"]) for i in incs] == [
        ("hang:r2", True), ("hang:r1", True), ("straggler:r1-2", False)]


# -- notify -----------------------------------------------------------------------------------

def test_payload_is_slack_compatible_and_carries_the_incident():
    inc = incidents([f_("rank_failed", [1])])[0]
    body = payload("new", {"id": 4, "name": "llama", "status": "failed"}, inc,
                   "http://127.0.0.1:8686")
    assert body["text"].startswith("[pgdash] CRITICAL incident new in llama: rank_failed on")
    assert "Next: fix rank_failed" in body["text"]
    assert body["url"] == "http://127.0.0.1:8686/jobs/4"
    assert body["incident"]["id"] == "crash:r1" and body["event"] == "new"
    json.dumps(body)


def test_notify_url_must_be_http():
    with pytest.raises(ValueError, match="PGDASH_NOTIFY"):
        check_url("hooks.slack.com/x")


class _Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.calls.append(body)
        status = 500 if len(self.server.calls) <= self.server.fail_first else 200
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hook():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    srv.calls, srv.fail_first = [], 0
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_notifier_retries_a_failing_webhook_and_drops_beyond_its_queue(hook):
    from tests.helpers.procs import wait_for

    hook.fail_first = 2
    url = f"http://127.0.0.1:{hook.server_address[1]}/hook"
    n = Notifier(url, timeout=2.0, retries=3, backoff=0.01).start()
    inc = incidents([f_("rank_failed", [1])])[0]
    assert n("new", {"id": 1, "name": "j"}, inc)
    wait_for(lambda: n.counters["sent"] == 1, 20, "the notification after two failures")
    assert len(hook.calls) == 3 and n.counters["retried"] == 2
    assert hook.calls[-1]["incident"]["id"] == "crash:r1"
    n.stop()
    # A queue of one, nobody sending: the second notification is dropped and counted.
    full = Notifier(url, max_queue=1)
    assert full("new", {"id": 1}, inc) and not full("resolved", {"id": 1}, inc)
    assert full.counters["dropped"] == 1
