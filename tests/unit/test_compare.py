"""Two moments of a job compared (dashboard.web.compare) on a generated job that hangs: the
group that stopped with the rank behind in it, the ranks whose state changed, the finding
that appeared; and a latency that moved, from the per-second series."""

from __future__ import annotations

from bench.fold import T0, build_log
from dashboard.diagnosis import Settings, diagnose
from dashboard.state import JobState
from dashboard.web import views
from dashboard.web.compare import compare
from dashboard.web.live import sections

S = Settings(hang_after=10.0)
LOG = build_log(ranks=8, seconds=80, hang_at=40.0, hang_for=35.0, slow_rank=None, seed=3)
STUCK = 4  # build_log's rank that stops entering the world group's collectives


def _answer(at: float) -> dict:
    """What state?at= answers at ``at`` (dashboard.web.live.state_at), judged then."""
    state = JobState(1, "job").apply_all(e for e in LOG if e["received_at"] <= at)
    found = diagnose(state, at, S)
    shown = sections(state, at=at, findings=found, settings=S)
    return {"at": at, "sections": shown, "progress": views.progress_rows(state),
            "findings": shown["findings"]}


def test_the_rank_that_stopped_is_alone_in_its_group_and_the_hang_appeared():
    before, during = _answer(T0 + 35.0), _answer(T0 + 60.0)
    changed = compare(before, during)
    (world,) = changed["groups"]  # the other groups moved on as before
    assert (world["group"], world["a"], world["b"]) == ("0", "moving", "overdue")
    assert world["a_behind"] == [] and world["b_behind"] == [[STUCK, 1]]
    assert world["advanced"] > 0  # it moved, then stopped
    assert [(f["kind"], f["ranks"]) for f in changed["findings"]["appeared"]] == [("hang", [STUCK])]
    assert changed["findings"]["resolved"] == []
    assert STUCK in {row["rank"] for row in changed["ranks"]}
    assert all(row["a"] != row["b"] for row in changed["ranks"])
    # Backwards, the same hang resolves; later inside it, nobody advances at all.
    assert [f["kind"] for f in compare(during, before)["findings"]["resolved"]] == ["hang"]
    later = compare(during, _answer(T0 + 70.0))  # inside the hang, nothing new
    assert later["groups"] == [] and later["ranks"] == []
    assert later["findings"] == {"appeared": [], "resolved": []}


def test_a_latency_that_moved_is_listed_with_its_factor_and_one_that_did_not_is_not():
    a, b = _answer(T0 + 20.0), _answer(T0 + 30.0)
    assert compare(a, b)["latencies"] == []  # the same traffic: nothing moved
    for row in b["sections"]["timeline_grid"]["ops"]:
        if (row["family"], row["op"]) == ("default_pg", "all_reduce"):
            row["p50_us"] = [None if v is None else v * 3 for v in row["p50_us"]]
    (moved,) = compare(a, b)["latencies"]
    assert (moved["family"], moved["op"]) == ("default_pg", "all_reduce")
    assert 2.5 < moved["factor"] < 3.5  # 3x, of medians over windows a little apart
    assert abs(moved["b_p50_us"] / moved["a_p50_us"] - moved["factor"]) < 0.01


def test_moments_shown_are_kept_once_final_a_few_at_a_time_for_a_while():
    from dashboard.web.moments import SETTLED_S, Moments

    clock, mono, made = [1000.0], [0.0], []
    kept = Moments(lambda: clock[0], size=2, ttl_s=60.0, monotonic=lambda: mono[0])

    def get(at):
        return kept.get(1, at, lambda: made.append(at) or {"at": at})

    assert get(900.0) == get(900.0) == {"at": 900.0} and made == [900.0]  # folded once
    get(clock[0] - SETTLED_S / 2)
    get(clock[0] - SETTLED_S / 2)  # events may still be stamped at it: folded again
    assert made.count(clock[0] - SETTLED_S / 2) == 2
    get(901.0), get(902.0)  # two more: the oldest goes
    get(900.0)
    assert made.count(900.0) == 2 and kept.hits == 1
    mono[0] += 61.0  # compaction may have rewritten what it folded
    get(902.0)
    assert made.count(902.0) == 2
    assert kept.get(2, 5.0, lambda: None) is None and kept.get(2, 5.0, lambda: 7) == 7
