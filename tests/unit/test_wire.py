"""The wire format: every malformed message gets a reason that names the field."""

import math

import pytest

from pgdash_agent.wire import (MAX_BATCH_EVENTS, PROTOCOL_VERSION, WireError, decode_v2_batch,
                               encode_v2, hist_bucket, hist_bucket_value, validate_auth,
                               validate_batch, validate_event, validate_events)


def ev(kind, body, seq=1, t=1.0):
    return {"seq": seq, "t": t, "kind": kind, "body": body}


AUTH = {"v": PROTOCOL_VERSION, "session": "abc", "job": "j", "rank": 0, "host": "h", "pid": 1}


def test_good_auth_passes():
    assert validate_auth(dict(AUTH)) == AUTH


@pytest.mark.parametrize("change, message", [
    ({"v": 99}, "protocol v99, this server speaks v1 and v2"),
    ({"session": ""}, "must not be empty"),
    ({"rank": -1}, r"auth.rank: Expected `int` >= 0"),
    ({"rank": True}, "auth.rank: .*got `bool`"),
    ({"job": 5}, "auth.job: Expected `str`, got `int`"),
    ({"job": "x" * 300}, "auth.job: .* length <= 256"),
])
def test_bad_auth_names_the_field(change, message):
    with pytest.raises(WireError, match=message):
        validate_auth({**AUTH, **change})


def test_auth_missing_field():
    bad = dict(AUTH)
    del bad["session"]
    with pytest.raises(WireError, match="auth.session is missing"):
        validate_auth(bad)


GOOD = [
    ev("hello", {"job": "j", "host": "h", "pid": 3, "rank": None, "env": {"RANK": "0"},
                 "versions": {"torch": "2.13.0", "cuda": None}}),
    ev("init_start", {"init_method": "env://", "rank": -1, "world_size": -1}),
    ev("init_done", {"rank": 0, "world_size": 2, "duration_s": 0.5}),
    ev("init_failed", {"error_type": "DistStoreError", "error": "x", "duration_s": 1}),
    ev("group", {"name": "0", "ranks": [0, 1]}),
    ev("coll_stats", {"start": 1, "end": 2, "rows": [
        {"group": "0", "op": "all_reduce", "count": 2, "bytes": 8, "sum_us": 3.0,
         "max_us": 2.0, "hist": [[8, 2]]}]}),
    ev("heartbeat", {"groups": [{"group": "0", "entered": 3, "completed": 2,
                                 "inflight_op": "all_reduce", "inflight_since": 1.5}],
                     "dropped": {"coll_stats": 2}}),
    ev("heartbeat", {"groups": [], "groups_made": 9, "groups_made_fp": [7, 2**32 - 1]}),
    ev("error", {"where": "collective", "error_type": "RuntimeError", "error": "boom"}),
    ev("exit", {"clean": True}),
    ev("gpu", {"uuid": "GPU-0", "lost": False, "values": {"temp_c": 61.0, "power_w": None},
               "reasons": ["hw_slowdown"], "xids": [79], "name": "NVIDIA H200"}),
    ev("stack", {"group": "0", "seq": 7, "op": "all_reduce", "since": 1.5, "stack": "f()"}),
    ev("left", {"group": None}),
    ev("snapshot", {"ask": "a1", "threads": [{"name": "MainThread", "frames": [
        {"file": "/home/me/train.py", "line": 42, "function": "step"}], "training": True}],
        "recent": [["0", "all_reduce", 8, 1.0, 1.5, 3, None]], "took_ms": 2.5}),
]


def test_events_of_every_kind_validate():
    events = GOOD
    for e in events:
        stored = validate_event(e)
        assert [stored[k] for k in ("seq", "t", "kind")] == [e[k] for k in ("seq", "t", "kind")]
        assert all(stored["body"][k] == e["body"][k] for k in stored["body"])
        assert validate_event(stored) == stored  # what is stored checks again, unchanged


def test_fields_this_version_does_not_know_are_not_stored():
    """A newer agent's extra fields pass, but only what was checked reaches the log: no NaN,
    no list nested thousands deep, in a body or in a row of one."""
    deep: list = []
    for _ in range(3000):
        deep = [deep]
    stored = validate_event(ev("coll_stats", {"start": 1, "end": 2, "future": math.nan,
                                              "rows": [{"group": "0", "op": "a", "count": 1,
                                                        "bytes": 0, "sum_us": 1, "max_us": 1,
                                                        "hist": [[5, 1]], "nested": deep}]}))
    assert stored["body"] == {"start": 1.0, "end": 2.0, "rows": [
        {"group": "0", "op": "a", "count": 1, "bytes": 0, "sum_us": 1.0, "max_us": 1.0,
         "hist": [[5, 1]]}]}


FRAME = {"file": "/home/me/train.py", "line": 42, "function": "step", "code": "x / n"}


def test_an_error_with_a_traceback_is_stored_and_an_old_agents_without_one_too():
    body = {"where": "uncaught", "error_type": "ZeroDivisionError", "error": "division by zero",
            "traceback": [{**FRAME, "library": True}, FRAME], "traceback_omitted": 3}
    stored = validate_event(ev("error", body))
    assert stored["body"]["traceback"] == [{**FRAME, "library": True}, FRAME]
    assert stored["body"]["traceback_omitted"] == 3
    old = validate_event(ev("error", {"where": "uncaught", "error_type": "E", "error": "x"}))
    assert "traceback" not in old["body"] and "causes" not in old["body"]
    chained = validate_event(ev("error", {**body, "causes": [
        {"error_type": "OSError", "error": "[Errno 28] No space left on device"}]}))
    assert chained["body"]["causes"] == [{"error_type": "OSError",
                                          "error": "[Errno 28] No space left on device"}]


BAD_EVENTS = [
    (ev("error", {"where": "uncaught", "error_type": "E", "error": "x",
                  "causes": [{"error_type": "E", "error": "y"}] * 5}),
     "body.causes: .* length <= 4"),
    (ev("error", {"where": "uncaught", "error_type": "E", "error": "x",
                  "causes": [{"error_type": "E"}]}), r"body.causes\[0\].error is missing"),
    (ev("error", {"where": "uncaught", "error_type": "E", "error": "x",
                  "traceback": [FRAME] * 41}), "body.traceback: .* length <= 40"),
    (ev("error", {"where": "uncaught", "error_type": "E", "error": "x",
                  "traceback": [{**FRAME, "line": -1}]}),
     r"body.traceback\[0\].line: Expected `int` >= 0"),
    (ev("error", {"where": "uncaught", "error_type": "E", "error": "x",
                  "traceback": [{"line": 1, "function": "f"}]}),
     r"body.traceback\[0\].file is missing"),
    (ev("error", {"where": "uncaught", "error_type": "E", "error": "x",
                  "traceback": [{**FRAME, "code": "x" * 2000}]}),
     r"body.traceback\[0\].code: .* length <= 1024"),
    (ev("nonsense", {}), "kind 'nonsense' is not one of"),
    (ev("exit", {"clean": "yes"}), "body.clean: Expected `bool`, got `str`"),
    (ev("group", {"name": "0", "ranks": [0, "1"]}), r"body.ranks\[1\]: Expected `int`"),
    (ev("group", {"name": "0"}), "body.ranks is missing"),
    (ev("exit", {"clean": True}, seq=0), "event.seq: Expected `int` >= 1"),
    (ev("exit", {"clean": True}, t=math.inf), "event.t: Expected `float`"),
    (ev("error", {"where": "x", "error_type": "E", "error": "x" * 70_000}), "body.error: .* length <= 65536"),
    (ev("coll_stats", {"start": 1, "end": 2, "rows": [
        {"group": "0", "op": "a", "count": 1, "bytes": 0, "sum_us": 1, "max_us": 1,
         "hist": [[5]]}]}), r"rows\[0\].hist\[0\]: Expected `array` of at least length 2"),
    (ev("heartbeat", {"groups": [], "dropped": {"x": -1}}), r"body.dropped\[...\]: Expected `int` >= 0"),
    (ev("heartbeat", {"groups": [], "groups_made": 20, "groups_made_fp": [1] * 17}),
     "body.groups_made_fp: .* length <= 16"),
    ("not an object", "event: Expected `object`, got `str`"),
    (ev("exit", {"clean": True}, t=math.nan), "event.t: Expected `float`"),
]


@pytest.mark.parametrize("event, message", BAD_EVENTS)
def test_bad_events_name_the_field(event, message):
    with pytest.raises(WireError, match=message):
        validate_event(event)


def test_a_v2_batch_read_straight_into_its_shapes_is_what_validation_stores():
    """The server's fast path for v2 batches (decode_v2_batch) gives what validate_events
    gives for the same events, a newer agent's fields left out alike."""
    newer = ev("coll_stats", {"start": 1, "end": 2, "future": 1, "rows": [
        {"group": "0", "op": "a", "count": 1, "bytes": 0, "sum_us": 1, "max_us": 1,
         "hist": [[5, 1]], "nested": [[[]]]}]}, seq=9)
    events = GOOD + [newer]
    batch_id, fast = decode_v2_batch(encode_v2({"id": 4, "events": events, "later": True}))
    assert batch_id == 4
    assert fast == validate_events(events)[0]
    assert validate_events(fast) == (fast, [])


@pytest.mark.parametrize("event, message", BAD_EVENTS)
def test_a_v2_batch_with_any_bad_event_is_left_to_validation_which_names_it(event, message):
    assert decode_v2_batch(encode_v2({"id": 1, "events": [GOOD[0], event]})) is None


@pytest.mark.parametrize("frame", [
    encode_v2({"id": True, "events": []}), encode_v2({"id": 1}), encode_v2({"auth": {}}),
    encode_v2({"id": 1, "events": [GOOD[0]] * (MAX_BATCH_EVENTS + 1)}), b"\xc1", "text",
])
def test_a_v2_frame_that_is_not_a_good_batch_is_left_to_validation(frame):
    assert decode_v2_batch(frame) is None


def test_batch_keeps_good_events_and_reports_bad_ones():
    good, rejected = validate_batch({"v": PROTOCOL_VERSION, "events": [
        ev("exit", {"clean": True}, seq=1), ev("exit", {}, seq=2), 7]})
    assert [e["seq"] for e in good] == [1]
    assert rejected[0]["seq"] == 2 and "clean is missing" in rejected[0]["error"]
    assert rejected[1]["seq"] is None and "Expected `object`" in rejected[1]["error"]


@pytest.mark.parametrize("batch, message", [
    ([], "batch must be an object"),
    ({"v": 2, "events": []}, "batch.v must be 1"),
    ({"v": PROTOCOL_VERSION}, "batch.events must be a list"),
    ({"v": PROTOCOL_VERSION, "events": [{}] * (MAX_BATCH_EVENTS + 1)}, "the limit is 500"),
])
def test_bad_batch_envelope_is_refused_whole(batch, message):
    with pytest.raises(WireError, match=message):
        validate_batch(batch)


def test_histogram_buckets_are_about_nine_percent_wide():
    for us in (1.5, 10, 333, 12_345, 9_876_543):
        value = hist_bucket_value(hist_bucket(us))
        assert abs(value - us) / us < 0.05
    assert hist_bucket(0) == 0 and hist_bucket(-3) == 0
    assert hist_bucket(1e300) == 320


def test_text_that_is_not_unicode_is_refused_not_stored():
    # JSON may spell a lone UTF-16 surrogate ("\ud800"); it cannot be stored or shown.
    with pytest.raises(WireError, match="not valid Unicode"):
        validate_event(ev("exit", {"clean": False, "reason": "\ud800"}))
