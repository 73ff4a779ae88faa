"""The server down while a real 2-rank job trains, longer than the agent's buffer can hold:
the agent stays within its bound, training goes on, every drop is counted and reaches the API
and the job page, and nothing the agent did not count as dropped is missing.

The minutes-long version is ``python -m bench.faults --only-outage`` (150 s by default); here
the outage is short, but long enough that the buffer overflows and the agent retries its
connection many times.
"""

from __future__ import annotations

from bench import faults

OUTAGE_S = 10.0
BUFFER = 10


def test_server_down_longer_than_the_buffer_holds(tmp_path):
    row, info = faults.long_outage(tmp_path, OUTAGE_S, buffer=BUFFER, after_s=3.0)
    # Bounded: the buffer never passed its bound, sampled every 0.5 s on both ranks ...
    assert info["max_buffered"] <= BUFFER
    assert all(len([s for s in r["samples"] if not s[4]]) >= OUTAGE_S for r in info["results"])
    # ... and memory did not grow with the outage: the warm RSS against its peak while down
    # (the job's own step record grows by 16 bytes a step; the agent keeps 10 events).
    assert info["rss_growth_kb"] < 16 * 1024, info["phases"]
    # Training went on through the outage on both ranks (speed is bench/faults.py's business).
    assert info["down_steps"] > 100 and info["up_steps"] > 10
    # Drops happened (the buffer overflowed), were counted, and reach the server: per rank
    # in the API, the same total in the page header.
    assert info["outbox_dropped"] > 0 and all(r["outbox_dropped"] for r in info["results"])
    assert all(r["dropped"] for r in info["ranks"]), info["ranks"]
    assert info["dropped_shown"] >= info["outbox_dropped"]
    page = info["page"]
    if page is not None:  # None: no Chromium here (the browser tests say what to install)
        # Only events the buffers dropped: collectives not timed are said apart.
        by_kind = {k: int(n) for k, n in (item.rsplit(": ", 1)
                                          for item in page["title"].split(", "))}
        assert not {"collectives", "flight_recorder"} & set(by_kind), page
        assert sum(by_kind.values()) == info["outbox_dropped"], page
        assert page["text"] == f"{info['outbox_dropped']:,} events", page
    # Nothing lost beyond what was counted, nothing stored twice, and the rest all flushed.
    assert info["unaccounted"] == 0 and info["doubled"] == 0
    assert info["flushed"]
    assert row.lost == 0 and row.doubled == 0 and row.acknowledged == row.stored > 0
