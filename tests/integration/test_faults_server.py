"""Faults on the server side, each on a real server and a real SQLite file: nothing acknowledged
is lost, nothing is doubled, and a bad or greedy agent hurts nobody else.

The scenarios themselves live in ``bench/faults.py`` (which prints them as a table); here each
one runs smaller and its outcome is checked.
"""

from __future__ import annotations

import pytest

from bench import faults
from dashboard.ingest.limits import ConnectionLimits, TokenBucket


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_token_bucket_refills_at_its_rate_and_may_go_into_debt():
    clock = Clock()
    bucket = TokenBucket(rate=10, burst_s=2, clock=clock)
    assert bucket.wait() == 0
    bucket.take(25)  # more than the burst of 20: allowed once, leaves a debt of 5
    assert bucket.wait() == pytest.approx(0.5)
    clock.now += 0.25
    assert bucket.wait() == pytest.approx(0.25)
    clock.now += 100  # a long quiet spell saves up at most the burst
    assert bucket.level == pytest.approx(-2.5) and bucket.wait() == 0
    assert bucket.level == pytest.approx(20)


def test_connection_limits_name_the_setting_and_turn_off_at_zero():
    clock = Clock()
    limits = ConnectionLimits(events_per_s=100, bytes_per_s=1000, burst_s=1, clock=clock)
    assert limits.admit(100, 10) is None
    refusal = limits.admit(1, 1)
    assert refusal is None  # not in debt yet: exactly at zero
    refusal = limits.admit(1, 1)
    assert "PGDASH_MAX_EVENTS_PER_S" in refusal.reason and refusal.retry_after > 0
    clock.now += 1
    assert limits.admit(1, 5000) is None
    clock.now += 0.5
    refusal = limits.admit(1, 1)
    assert "PGDASH_MAX_BYTES_PER_S" in refusal.reason
    assert refusal.retry_after == pytest.approx(3.5, abs=0.01)
    off = ConnectionLimits(events_per_s=0, bytes_per_s=0, clock=clock)
    assert not off.counts_bytes
    assert all(off.admit(10**6, 10**9) is None for _ in range(100))


def test_server_killed_mid_write_burst_opens_clean_and_loses_nothing(tmp_path):
    row, check = faults.kill_mid_burst(tmp_path, events=4_000)
    assert check == "ok"
    assert row.lost == 0 and row.doubled == 0, row
    assert row.acknowledged == row.stored == 2 * (4_000 + 1), row


def test_locked_database_is_named_then_ingest_resumes(tmp_path):
    row, refusals = faults.db_locked(tmp_path, hold_s=3.0)
    assert refusals, "batches sent while the database was locked must be refused"
    assert all("locked.db is locked" in r and "PGDASH_DB_BUSY_TIMEOUT_S" in r
               for r in refusals if "earlier batch" not in r), refusals
    assert row.lost == 0 and row.doubled == 0 and row.acknowledged == row.stored == 401, row
    assert "API answered: True" in row.note


def test_full_disk_is_named_then_ingest_resumes(tmp_path):
    row, refusals = faults.disk_full(tmp_path)
    assert refusals and "full.db cannot grow: its disk is full" in refusals[0], refusals
    assert row.lost == 0 and row.doubled == 0 and row.acknowledged == row.stored == 201, row


def test_flooding_and_garbage_agents_leave_a_polite_one_unaffected(tmp_path):
    rows, info = faults.flood_and_garbage(tmp_path, seconds=3.0, rate=400)
    flooder, polite, garbage = rows
    assert all(ack and ack.get("ok") for ack in info["polite_acks"]), info["polite_acks"]
    assert polite.acknowledged == polite.stored and polite.lost == polite.doubled == 0
    # The flooder was slowed: refused with a reason naming the setting, counted in /metrics,
    # and held near its rate (one burst of a second plus one batch of debt on top).
    assert info["rate_limited"] > 0
    assert any("PGDASH_MAX_EVENTS_PER_S" in r for r in info["flood_refusals"])
    assert info["flood_window"] <= info["rate"] * (info["elapsed"] + 1) + 200 + 1
    # ... and it lost nothing for it: everything was stored once, later.
    assert flooder.lost == 0 and flooder.doubled == 0
    assert flooder.acknowledged == flooder.stored
    assert garbage.stored == 0 and info["garbage_acks"]
    # Every junk batch got an answer (no dropped connection, no exception), and a refusal.
    assert all(isinstance(a, dict) and (not a["ok"] or a["rejected"])
               for a in info["garbage_acks"]), info["garbage_acks"][:5]


def test_server_down_while_training_keeps_the_agent_bounded_and_shows_drops(tmp_path):
    row, info = faults.server_down(tmp_path, steps=150, buffer=10)
    assert info["max_buffered"] <= info["buffer"]
    assert info["dropped_agent"] > 0
    # What the agents counted reaches the server and GET /api/jobs/<id> shows it per rank.
    assert info["dropped_shown"] > 0
    assert all(r["dropped"] for r in info["ranks"]), info["ranks"]
    assert all(r["flushed"] for r in info["results"])
