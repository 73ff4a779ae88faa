"""The agent's outbox: bounded, drops summaries first (counted), keeps sequence order, and
lets readings wait for the next heartbeat."""

from pgdash_agent.outbox import Outbox


def test_outbox_drops_summaries_first_and_counts_them():
    box = Outbox(capacity=3)
    box.put(1, "hello", {})
    assert box.put(2, "coll_stats", {})
    assert box.put(3, "heartbeat", {})
    assert not box.put(4, "exit", {"clean": True})  # full: the oldest summary goes
    assert [e["kind"] for e in box.take(10)] == ["hello", "heartbeat", "exit"]
    assert box.dropped == {"coll_stats": 1}


def test_outbox_requeue_keeps_sequence_order():
    box = Outbox(capacity=10)
    for i in range(5):
        box.put(i, "heartbeat", {})
    first = box.take(2)
    box.put(9, "exit", {"clean": True})
    box.requeue(first)
    assert [e["seq"] for e in box.take(10)] == [1, 2, 3, 4, 5, 6]


def test_readings_wait_for_the_heartbeat_and_leave_with_it():
    box = Outbox(capacity=10)
    box.put(100.0, "coll_stats", {})  # the half-second summary
    assert not box.due(1.0, now=100.5)
    assert box.due(1.0, now=101.0)  # waited one heartbeat period: it goes alone
    box.put(101.0, "coll_stats", {})
    box.put(101.0, "gpu", {})
    assert not box.due(1.0, now=100.1)  # (a clock that read earlier: nothing presses)
    box.put(101.0, "heartbeat", {})  # the heartbeat takes all of them, in one batch
    assert box.due(1.0, now=100.1)
    assert [e["kind"] for e in box.take(10)] == ["coll_stats", "coll_stats", "gpu", "heartbeat"]
    assert not box.due(1.0, now=200.0)  # nothing left
    box.put(102.0, "gpu", {})
    box.put(102.1, "error", {"error": "boom"})  # an error does not wait
    assert box.due(1.0, now=102.1)
    sent = box.take(10)
    box.requeue(sent)  # not acknowledged: what made it due still does
    assert box.due(1.0, now=102.1)
