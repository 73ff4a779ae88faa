"""FlightRecorderProbe on recorded Flight Recorder JSON (the shapes torch 2.13 gloo produces)."""

import json

from pgdash_agent.flight import FlightRecorderProbe


class FakeRecorder:
    def __init__(self, entries=None):
        self.status = {"0": ("4", "4"), "1": ("-1", "-1")}
        self.entries = entries or [{"pg_id": 0, "process_group": ["0", "default_pg"]},
                                   {"pg_id": 1, "process_group": ["", ""]}]
        self.full_dumps = 0

    def __call__(self, include_collectives):
        doc = {"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1]"}},
               "pg_status": {k: {"last_enqueued_collective": e, "last_completed_collective": c,
                                 "last_started_collective": "-1"}
                             for k, (e, c) in self.status.items()}}
        if include_collectives:
            self.full_dumps += 1
            doc["entries"] = self.entries
        return json.dumps(doc).encode()


def test_in_flight_since_is_kept_until_progress():
    clock = iter([100.0, 101.0, 102.0, 103.0]).__next__
    dump = FakeRecorder()
    probe = FlightRecorderProbe(clock, [dump])
    assert probe.read() == {"0": {"fr_enqueued": 4, "fr_completed": 4,
                                  "fr_inflight_since": None, "fr_busy": 0, "fr_samples": 0}}
    assert dump.full_dumps == 1  # learned group 0's name once; group 1 never ran anything
    dump.status["0"] = ("5", "4")
    assert probe.read()["0"]["fr_inflight_since"] == 101.0
    assert probe.read()["0"]["fr_inflight_since"] == 101.0  # still the same collective
    dump.status["0"] = ("6", "5")
    assert probe.read()["0"]["fr_inflight_since"] == 103.0  # a new one
    assert dump.full_dumps == 1


def test_no_flight_recorder_disables_the_probe():
    def broken(_):
        raise RuntimeError("no such function")

    probe = FlightRecorderProbe(lambda: 1.0, [broken])
    assert [probe.read() for _ in range(4)] == [{}] * 4
    assert probe.disabled and probe.errors == 3


def test_nccl_groups_come_from_their_own_recorder():
    gloo = FakeRecorder()
    nccl = FakeRecorder(entries=[{"pg_id": 0, "process_group": ["1", "tp"]}])
    gloo.status = {"0": ("7", "7")}
    nccl.status = {"0": ("130", "123")}  # NCCL's completion is noticed later by its watchdog
    probe = FlightRecorderProbe(lambda: 5.0, [gloo, nccl])
    assert probe.read() == {
        "0": {"fr_enqueued": 7, "fr_completed": 7, "fr_inflight_since": None,
              "fr_busy": 0, "fr_samples": 0},
        "1": {"fr_enqueued": 130, "fr_completed": 123, "fr_inflight_since": 5.0,
              "fr_busy": 0, "fr_samples": 0}}


def test_samples_between_reads_count_how_often_a_collective_is_in_flight():
    dump = FakeRecorder()
    probe = FlightRecorderProbe(lambda: 1.0, [dump])
    probe.read()
    for state in [("5", "4"), ("5", "5"), ("6", "5"), ("6", "6")]:  # in flight 2 of 4 times
        dump.status["0"] = state
        probe.sample()
    dump.status["0"] = ("7", "6")
    got = probe.read()["0"]  # a read is no sample
    assert (got["fr_busy"], got["fr_samples"]) == (2, 4)
    probe.sample()
    got = probe.read()["0"]  # a fresh tally after each read
    assert (got["fr_busy"], got["fr_samples"]) == (1, 1)
