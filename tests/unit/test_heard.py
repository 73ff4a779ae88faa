"""What the server's connections heard from each agent (dashboard.ingest.heard)."""

from dashboard.ingest.heard import SPANS_KEPT, Heard
from tests.helpers.clock import Clock


def test_frames_and_owed_acknowledgements_are_heard_and_silence_is_not():
    clock = Clock()
    heard = Heard(clock)
    assert heard.heard("a", 1000.0) is None  # never heard here: it cannot say
    heard.connected("a")
    for _ in range(5):  # a heartbeat a second
        clock.t += 1.0
        heard.received("a")
    assert heard.heard("a", 1005.0) == 1005.0
    assert heard.heard("a", 1003.5) == 1003.5  # inside the span
    assert heard.heard("a", 1030.0) == 1005.0  # silent since
    assert heard.heard("a", 999.0) is None  # before its first frame
    clock.t = 1015.0
    heard.received("a")
    heard.owe("a")  # its batch waits for the writer: the agent waits for its ack
    assert heard.heard("a", 1040.0) == 1040.0
    assert heard.heard("a", 1007.0) == 1005.0  # the silence before is still one
    clock.t = 1050.0
    heard.answered("a")
    assert heard.heard("a", 1080.0) == 1050.0  # acknowledged, and nothing came since
    assert heard.heard("a", 1040.0) == 1040.0  # a moment of the wait, judged after it


def test_a_closed_connection_is_owed_nothing_and_heard_again_when_it_reconnects():
    clock = Clock()
    heard = Heard(clock)
    heard.connected("a")
    heard.received("a")
    heard.owe("a")
    clock.t = 1003.0
    heard.closed("a")
    clock.t = 1004.0
    heard.answered("a")  # the commit of a batch sent before the close: nothing went out
    assert heard.heard("a", 1020.0) == 1003.0
    clock.t = 1021.0
    heard.connected("a")
    assert heard.heard("a", 1021.5) == 1021.0


def test_what_it_keeps_per_agent_is_bounded():
    clock = Clock()
    heard = Heard(clock)
    for _ in range(3 * SPANS_KEPT):  # a frame every 10 s: every one a span of its own
        clock.t += 10.0
        heard.received("a")
    assert heard.heard("a", clock.t) == clock.t
    assert heard.heard("a", 1005.0) is None  # older than what it keeps: it cannot say
    assert len(heard._sessions["a"].spans) == SPANS_KEPT
