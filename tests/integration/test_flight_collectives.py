"""Collectives issued from C++ (DDP's reducer, functional collectives) reach the API through
the Flight Recorder, each exactly once: never again when a Python wrapper saw it too."""

import json
import urllib.request

import pytest

from pgdash_agent.flight_dump import entry_bytes, op_name
from pgdash_agent.flight_stats import FlightStats, WrappedIntervals
from tests.helpers.procs import launch_job, wait_for, wait_job

STEPS = 12


def _rows(server, job_id, **filters):
    query = "&".join(f"{k}={v}" for k, v in filters.items())
    return server.api(f"/api/jobs/{job_id}/collectives?{query}")["collectives"]


@pytest.mark.parametrize("hook", [False, True], ids=["flight-recorder", "ddp-comm-hook"])
def test_ddp_funcol_and_python_collectives_each_counted_once(server, tmp_path, hook):
    """DDP's bucket all-reduces are counted once: by the Flight Recorder reader when the
    agent leaves DDP alone (PGDASH_DDP_HOOK=0), by the wrappers through the agent's comm hook
    (the default, agent.ddp); functional collectives only ever by the Flight Recorder."""
    out = tmp_path / "expected.json"
    procs = launch_job("ddp_job.py", 2, server.url, "fr-ddp", tmp_path,
                       args=["--steps", str(STEPS), "--out", str(out)],
                       env={"PGDASH_DDP_HOOK": "1" if hook else "0"})
    assert wait_job(procs, 180, tmp_path) == [0, 0]
    expected = json.loads(out.read_text())
    cpp = expected["ddp_buckets"] * (not hook) + expected["funcol"]  # the recorder's share
    python = expected["python"] + expected["ddp_buckets"] * hook  # the wrappers'
    job = wait_for(lambda: next((j for j in server.api("/api/jobs")["jobs"]
                                 if j["name"] == "fr-ddp" and j["status"] == "finished"), None),
                   60, "the job to finish")
    for rank in (0, 1):
        rows = wait_for(lambda: [r for r in _rows(server, job["id"], rank=rank)
                                 if r["source"] == "flight_recorder" and r["op"] == "all_reduce"],
                        30, f"rank {rank}'s Flight Recorder all_reduce row")
        # DDP's buckets and the functional all-reduces, all on the default group ("0"); the
        # Python all-reduces of the loss on the same group are not among them.
        assert [(r["group"], r["count"]) for r in rows] == [("0", cpp)]
        row = rows[0]
        assert row["timing"] == "host_poll" and row["resolution_us"] > 0
        assert 0 < row["p50_us"] <= row["p99_us"] <= row["max_us"]
        # DDP buckets are float32 gradients; the functional all-reduce is 4 floats.
        assert row["bytes"] >= 4 * 4 * expected["funcol"]
        wrapped = [r for r in _rows(server, job["id"], rank=rank) if r["source"] == "wrapper"]
        assert {(r["group"], r["op"]): r["count"] for r in wrapped} == {
            ("0", "all_reduce"): python, ("1", "all_reduce"): expected["side"]}
        # The side group only ever ran Python collectives: nothing from the recorder there.
        assert not [r for r in _rows(server, job["id"], rank=rank, group="1")
                    if r["source"] == "flight_recorder"]
    # DDP's constructor broadcasts the module state from C++ too.
    assert any(r["op"] == "broadcast" and r["source"] == "flight_recorder"
               for r in _rows(server, job["id"], rank=0))
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    count = 'pgdash_collective_latency_seconds_count{family="default_pg",job="fr-ddp"'
    assert f'{count},op="all_reduce",source="flight_recorder"}} {2 * cpp}.0' in metrics
    assert f'{count},op="all_reduce",source="wrapper"}} {2 * python}.0' in metrics


# -- the reader on recorded entries (shapes as torch 2.13 gloo writes them) --------------------

def _entry(rid, seq, op="all_reduce", group="0", created_s=100.0, retired=True, n=4):
    return {"collective_seq_id": seq, "input_dtypes": ["Float"], "input_sizes": [[n]],
            "is_p2p": False, "op_id": seq, "output_dtypes": ["Float"], "output_sizes": [[n]],
            "p2p_seq_id": 0, "pg_id": int(group), "process_group": [group, "default_pg"],
            "profiling_name": f"gloo:{op}", "record_id": rid, "retired": retired,
            "state": "scheduled", "thread_id": "1", "thread_name": "python",
            "time_created_ns": int(created_s * 1e9), "time_discovered_completed_ns": 0,
            "time_discovered_started_ns": 0, "timeout_ms": 1800000}


class Recorder:
    """A ring of ``size`` entries dumped in torch's JSON layout (compact, keys sorted)."""

    def __init__(self, size=2000):
        self.size = size
        self.entries = []
        self.enqueued = {}
        self.completed = {}

    def add(self, entry):
        self.entries = (self.entries + [entry])[-self.size:]
        pg = str(entry["pg_id"])
        self.enqueued[pg] = entry["collective_seq_id"]
        if entry["retired"]:
            self.completed[pg] = entry["collective_seq_id"]

    def __call__(self, include):
        doc = {"comm_lib_version": "", "entries": self.entries if include else None,
               "nccl_comm_state": {}, "pg_config": {},
               "pg_status": {pg: {"last_completed_collective": str(self.completed.get(pg, -1)),
                                  "last_enqueued_collective": str(seq),
                                  "last_started_collective": "-1"}
                             for pg, seq in self.enqueued.items()}, "version": "2.10"}
        if not include:
            del doc["entries"]
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


class Probe:
    def __init__(self, recorder):
        self.dumps = [recorder]
        self.names = {}
        self.disabled = False


def _stats(recorder, opened=None, spans=None, wrapped=None):
    wrapped = wrapped or WrappedIntervals()
    return FlightStats(Probe(recorder), wrapped, lambda: (opened or {}, spans or {}),
                       budget=1.0), wrapped


def test_entries_inside_a_wrapped_interval_are_skipped_and_each_entry_counts_once():
    rec = Recorder()
    stats, wrapped = _stats(rec)
    for seq in range(1, 6):
        rec.add(_entry(seq - 1, seq))
    wrapped.add("0", 1, 3)  # a wrapped call issued numbers 2 and 3
    stats.read(now=101.0)
    [row] = stats.take_summary()
    assert (row["group"], row["op"], row["count"], row["bytes"]) == ("0", "all_reduce", 3, 48)
    assert row["source"] == "flight_recorder" and row["timing"] == "host_poll"
    stats.read(now=102.0)  # nothing new: nothing counted again
    assert stats.take_summary() == []
    rec.add(_entry(5, 6, op="broadcast"))
    stats.read(now=103.0)
    assert [(r["op"], r["count"]) for r in stats.take_summary()] == [("broadcast", 1)]
    assert stats.missed == 0


def test_an_open_wrapped_call_holds_its_entries_until_its_interval_is_known():
    rec = Recorder()
    opened = {"0": 1}
    wrapped = WrappedIntervals()
    stats = FlightStats(Probe(rec), wrapped, lambda: (dict(opened), {}), budget=1.0)
    rec.add(_entry(0, 1))
    rec.add(_entry(1, 2))  # issued by the wrapped call still running
    stats.read(now=101.0)
    assert [r["count"] for r in stats.take_summary()] == [1]  # only number 1 is known C++
    opened.clear()
    wrapped.add("0", 1, 2)  # the call ended: number 2 was its own
    stats.read(now=102.0)
    assert stats.take_summary() == []


def test_async_works_not_completed_yet_still_cover_their_entries():
    rec = Recorder()
    stats, _ = _stats(rec, spans={"0": [(0, 1)]})
    rec.add(_entry(0, 1))
    rec.add(_entry(1, 2))
    stats.read(now=101.0)
    assert [r["count"] for r in stats.take_summary()] == [1]


def test_entries_the_ring_overwrote_are_counted_as_missed():
    rec = Recorder(size=4)
    stats, _ = _stats(rec)
    for seq in range(1, 4):
        rec.add(_entry(seq - 1, seq))
    stats.read(now=101.0)
    assert stats.take_summary()[0]["count"] == 3
    for seq in range(4, 11):  # 7 more into a ring of 4: 3 overwritten unread
        rec.add(_entry(seq - 1, seq))
    stats.read(now=102.0)
    assert stats.take_summary()[0]["count"] == 4
    assert stats.missed == 3


def test_completion_is_timed_by_the_status_polls():
    rec = Recorder()
    stats, _ = _stats(rec)
    rec.add(_entry(0, 1, created_s=100.0, retired=False))
    rec.completed["0"] = 0
    stats.note_status(100.001, {"0:0": {"last_completed_collective": "0"}})
    stats.read(now=100.002)  # seen running: waits
    assert stats.take_summary() == []
    stats.note_status(100.010, {"0:0": {"last_completed_collective": "0"}})
    stats.note_status(100.020, {"0:0": {"last_completed_collective": "1"}})
    rec.entries[0]["retired"] = True
    rec.completed["0"] = 1
    stats.read(now=100.030)
    [row] = stats.take_summary()
    # Completed between the polls at 10 and 20 ms: 15 ms, exact to 10 ms.
    assert row["count"] == 1
    assert abs(row["sum_us"] - 15_000) < 1 and abs(row["resolution_us"] - 10_000) < 1
    # A snapshot's timeline draws it (issued from C++, seen by the recorder alone).
    [(group, op, nbytes, start, end, seq)] = stats.recent
    assert (group, op, nbytes, start, seq) == ("0", "all_reduce", 16, 100.0, 1)
    assert abs(end - 100.015) < 1e-6


def test_device_timing_is_used_when_the_entry_has_it():
    rec = Recorder()
    stats, _ = _stats(rec)
    entry = _entry(0, 1, retired=False)
    entry["profiling_name"] = "nccl:all_reduce"
    rec.add(entry)
    stats.read(now=100.5)  # running: no duration yet
    assert stats.take_summary() == []
    entry.update(retired=True, state="completed", duration_ms=0.25)  # NCCL adds it when done
    stats.read(now=101.0)
    [row] = stats.take_summary()
    assert (row["timing"], row["sum_us"], row["resolution_us"]) == ("device", 250.0, 0.0)


def test_names_and_bytes():
    assert op_name("gloo:all_reduce") == "all_reduce"
    assert op_name("nccl:send 1->2") == "send"
    assert entry_bytes({"input_sizes": [[3, 4], [2]], "input_dtypes": ["Float", "BFloat16"]}) \
        == 3 * 4 * 4 + 2 * 2
