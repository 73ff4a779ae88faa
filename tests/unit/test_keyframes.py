"""Keyframes (dashboard.history.keyframes): the page's answer stored at grid moments by the live
fold and by folds for ``state?at=``, each the same answer a fold of that moment gives."""

from __future__ import annotations

import json
import math
import time
import zlib

import pytest

from dashboard.ingest.pipeline import Ingest
from dashboard.storage.store import Store
from dashboard.web.live import keyframe, keyframe_answer, state_at
from tests.helpers.simjob import RANKS, T0, _job_events, _send_live

EVERY = 10.0


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'db.sqlite'}").start()
    yield s
    s.close()


def _live_job(ingest: Ingest, clock: list[float], seconds: int, min_ranks: int = RANKS,
              offset: float = 0.5, share: float = 1.0, hang_at: float = T0 + 40) -> int:
    """A RANKS-rank job with a hang, sent through the live path a second's batch at a time
    (keyframes made for it although it is small, unless ``min_ranks`` says otherwise, and
    each period's, whatever a busy machine makes rendering cost)."""
    ingest.keyframes.min_ranks = min_ranks
    ingest.keyframes.live_share = share
    return _send_live(ingest, clock, _job_events(seconds, hang=(hang_at, T0 + 90)), "kf",
                      offset)


def _stored(ingest: Ingest, store: Store, job_id: int) -> dict[float, dict]:
    store.writer.wait_idle()  # (a scrub's keyframes are queued for the writer)
    out = {}
    for at in sorted(store.keyframes.moments(job_id)):
        out[at] = json.loads(keyframe_answer(zlib.decompress(
            store.keyframes.newest(job_id, at, at)[1])))
    return out


def _folded(store: Store, job_id: int, at: float) -> dict:
    """The answer of a fold of moment ``at`` by a server that makes no keyframes, as the API
    sends it (JSON)."""
    fresh = Ingest(store, keyframe_every_s=0).start()
    return json.loads(json.dumps(state_at(fresh, job_id, at)))


@pytest.mark.parametrize("offset", [0.5, 0.9])
def test_the_live_fold_stores_the_answer_of_each_period_start(store, offset):
    """Whether the first batch after a moment comes at once or most of a second later (its
    book then had two grid moments due), the keyframe holds the moment exactly."""
    clock = [T0]
    ingest = Ingest(store, clock=lambda: clock[0], keyframe_every_s=EVERY,
                    render_keyframe=keyframe).start()
    job_id = _live_job(ingest, clock, 120, offset=offset)
    kept = _stored(ingest, store, job_id)
    assert sorted(kept) == [T0 + k * EVERY for k in range(1, 12)]
    assert ingest.keyframes.skipped == 0
    # The hang's verdicts as they stood at each moment (rank 0 stopped at T0 + 40).
    assert not any(f["active"] for f in kept[T0 + 30]["findings"])
    assert any(f["active"] and f["ranks"] == [0] for f in kept[T0 + 80]["findings"])
    for at in (T0 + 10, T0 + 50, T0 + 80, T0 + 110):
        assert kept[at] == _folded(store, job_id, at), at
        assert kept[at]["at"] == at


def test_a_fold_for_a_moment_stores_the_keyframes_it_passes(store, monkeypatch):
    """Where live made none (a job stored before keyframes, a clustered job), a scrub that
    folds through grid moments stores them, the same answers the live fold would have.
    (The grid alone: none around the hang's marks, the next test's.)"""
    monkeypatch.setattr("dashboard.history.keyframes.MAX_MARKS", 0)
    clock = [T0]
    quiet = Ingest(store, clock=lambda: clock[0], keyframe_every_s=0).start()
    job_id = _live_job(quiet, clock, 100)
    quiet.store.writer.wait_idle()
    assert store.keyframes.moments(job_id) == set()
    scrub = Ingest(store, clock=lambda: clock[0], keyframe_every_s=EVERY,
                   render_keyframe=keyframe).start()
    scrub.keyframes.min_ranks = RANKS
    state_at(scrub, job_id, T0 + 65.3)
    kept = _stored(scrub, store, job_id)
    # The agents connected at T0: that moment too, and up to the moment asked.
    assert sorted(kept) == [T0 + k * EVERY for k in range(0, 7)]
    for at in kept:
        assert kept[at] == _folded(store, job_id, at), at
    # Scrubbing on stores the rest once; nothing is stored twice.
    state_at(scrub, job_id, T0 + 99.0)
    made = scrub.keyframes.made
    state_at(scrub, job_id, T0 + 20.0)
    state_at(scrub, job_id, T0 + 99.0)
    assert sorted(_stored(scrub, store, job_id)) == [T0 + k * EVERY for k in range(0, 10)]
    assert scrub.keyframes.made == made


def test_a_fold_past_an_incident_stores_its_moments_second_by_second(store):
    """Around each incident's marks (where it began; where it ended, once resolved: the
    page's Shift+arrow stops) a fold stores a moment every FINE_S from FINE_BEFORE_S before
    the mark to FINE_AFTER_S after, aligned on the mark so that the page's one-second steps
    from it land on them: the hang forms second by second, each moment a read, each the
    answer a fold of it gives."""
    from dashboard.diagnosis.incidents import marks
    from dashboard.history.keyframes import FINE_AFTER_S, FINE_BEFORE_S

    clock = [T0]
    live = Ingest(store, clock=lambda: clock[0], keyframe_every_s=EVERY,
                  render_keyframe=keyframe).start()
    job_id = _live_job(live, clock, 130, hang_at=T0 + 40.25)
    begun, ended = marks(live.incidents(job_id))  # the hang of rank 0, resolved
    assert T0 + 40 < begun < T0 + 90 <= ended < T0 + 130
    assert begun % 1 == 0.25  # between the grid's moments: the seconds around it too
    grid = set(_stored(live, store, job_id))
    assert grid == {T0 + k * EVERY for k in range(1, 13)}  # the live server makes no others
    scrub = Ingest(store, clock=lambda: clock[0], keyframe_every_s=EVERY,
                   render_keyframe=keyframe).start()
    scrub.keyframes.min_ranks = RANKS
    state_at(scrub, job_id, begun)  # the page's Shift+→ to the hang
    kept = _stored(scrub, store, job_id)
    before = [begun + k for k in range(-int(FINE_BEFORE_S), 1)]
    grid.add(T0)  # (the agents connected then: live had no batch before it)
    assert set(kept) == grid | set(before)
    for at in (before[0], begun - 7, begun):
        assert kept[at] == _folded(store, job_id, at), at
        assert kept[at]["at"] == at
    def waiting(at):  # the ranks in an all_reduce at that moment
        return sorted(row["rank"] for row in kept[at]["progress"] if row["inflight_op"])

    assert waiting(begun - 11) == [] and waiting(begun) == [1, 2, 3]  # the hang formed
    # Stepping on from the mark stores the seconds after it; a scrub toward the resolution
    # those around it; one away from every mark, none.
    state_at(scrub, job_id, begun + FINE_AFTER_S)
    state_at(scrub, job_id, ended + FINE_AFTER_S)
    state_at(scrub, job_id, ended + FINE_AFTER_S + 15)
    kept = _stored(scrub, store, job_id)
    after = [begun + k for k in range(1, int(FINE_AFTER_S) + 1)]
    around_end = [ended + k for k in range(-int(FINE_BEFORE_S), int(FINE_AFTER_S) + 1)]
    assert set(kept) == grid | set(before) | set(after) | set(around_end)
    assert kept[ended + 3] == _folded(store, job_id, ended + 3)
    assert any(f["active"] for f in kept[begun + 1]["findings"])  # judged at the next second
    # The exact moment one second-step from a mark is a keyframe: the API reads it.
    made = scrub.keyframes.made
    assert json.loads(keyframe_answer(scrub.keyframes.near(job_id, begun - 1, 0))) == \
        kept[begun - 1]
    state_at(scrub, job_id, begun + 2)
    assert scrub.keyframes.made == made  # nothing stored twice


def test_an_ended_jobs_incidents_are_made_ready_in_the_background(store):
    """As a job ends (and as the page opens an ended one: GET /incidents asks), the moments
    around each of its incident marks are folded and stored on a fold of their own: every
    second from 30 s before each mark to 10 s after, each the answer a fold gives, each job
    once; running jobs and jobs too small for keyframes are left alone."""
    from dashboard.diagnosis.incidents import marks
    from dashboard.history.keyframes import FINE_AFTER_S, FINE_BEFORE_S

    clock = [T0]
    ingest = Ingest(store, clock=lambda: clock[0], keyframe_every_s=EVERY,
                    render_keyframe=keyframe).start()
    ingest.keyframes.min_ranks = RANKS
    ingest.incident_frames.settle_s = 0.0
    ingest.incident_frames.pace.duty = 1.0  # (no pauses between slices of work)
    events = _job_events(130, hang=(T0 + 40.25, T0 + 90))
    last = max(ev["received_at"] for ev in events)
    exits = [{"session": f"s{r}", "t": last + 1, "received_at": last + 1.01, "kind": "exit",
              "body": {"clean": True, "code": 0}} for r in range(RANKS)]
    job_id = _send_live(ingest, clock, events + exits, "ended")
    store.writer.wait_idle()
    assert store.jobs.get(job_id)["ended_at"] is not None
    later = [{**ev, "t": ev["t"] + 1000, "received_at": ev["received_at"] + 1000}
             for ev in events]
    running = _send_live(ingest, clock, later, "running")
    assert not ingest.incident_frames.ask(running)  # its incidents are still being judged
    begun, ended = marks(ingest.incidents(job_id))
    assert ingest.incident_frames.wait_idle()  # the live fold saw it end: asked
    assert ingest.incident_frames.marks_folded == 2
    kept = _stored(ingest, store, job_id)
    steps = range(-int(FINE_BEFORE_S), int(FINE_AFTER_S) + 1)
    assert {m + k for m in (begun, ended) for k in steps} <= set(kept)
    for at in (begun - FINE_BEFORE_S, begun - 1, begun + FINE_AFTER_S, ended + 4):
        assert kept[at] == _folded(store, job_id, at), at
    assert not ingest.incident_frames.ask(job_id)  # once
    fresh = Ingest(store, clock=lambda: clock[0], keyframe_every_s=EVERY,
                   render_keyframe=keyframe).start()
    assert not fresh.incident_frames.ask(job_id)  # too small for keyframes (MIN_RANKS)
    fresh.keyframes.min_ranks = RANKS
    assert fresh.incident_frames.ask(job_id) and fresh.incident_frames.wait_idle()
    assert fresh.incident_frames.marks_folded == 0  # a restart reads what is stored


def test_preparing_incidents_waits_while_the_server_is_behind_and_stops_with_it(
        store, monkeypatch):
    """Live ingest first: while the server is behind its agents no fold of this kind works
    (given up after BEHIND_WAIT_S), and a server that stops is not held up by one."""
    monkeypatch.setattr("dashboard.history.incident_frames.BEHIND_WAIT_S", 2.0)
    clock = [T0]
    ingest = Ingest(store, clock=lambda: clock[0], keyframe_every_s=EVERY,
                    render_keyframe=keyframe).start()
    ingest.keyframes.min_ranks = RANKS
    frames = ingest.incident_frames
    frames.settle_s, frames.pace.behind = 0.0, lambda: True
    events = _job_events(60, hang=(T0 + 20.25, T0 + 40))
    last = max(ev["received_at"] for ev in events)
    job_id = _send_live(ingest, clock, events + [
        {"session": f"s{r}", "t": last + 1, "received_at": last + 1.01, "kind": "exit",
         "body": {"clean": True, "code": 0}} for r in range(RANKS)], "behind")
    assert frames.wait_idle(timeout=30) and frames.marks_folded == 0
    kept = set(_stored(ingest, store, job_id))
    assert all(at % EVERY == 0 for at in kept)  # the grid's alone
    # Asked again (a fresh server), and stopped while it waits: at once.
    fresh = Ingest(store, clock=lambda: clock[0], keyframe_every_s=EVERY,
                   render_keyframe=keyframe).start()
    fresh.keyframes.min_ranks = RANKS
    fresh.incident_frames.pace.behind = lambda: True
    assert fresh.incident_frames.ask(job_id)
    time.sleep(0.3)
    fresh.stop()
    assert not fresh.incident_frames._thread.is_alive()  # gone within stop's second
    assert fresh.incident_frames.marks_folded == 0


def test_near_reads_the_newest_keyframe_within_the_span_and_never_a_later_one(store):
    clock = [T0]
    ingest = Ingest(store, clock=lambda: clock[0], keyframe_every_s=EVERY,
                    render_keyframe=keyframe).start()
    job_id = _live_job(ingest, clock, 45)
    _stored(ingest, store, job_id)
    def near(*args):
        found = ingest.keyframes.near(*args)
        return found if found is None else json.loads(keyframe_answer(found))

    assert near(job_id, T0 + 29.9, 10)["at"] == T0 + 20
    assert near(job_id, T0 + 30.0, 10)["at"] == T0 + 30
    assert near(job_id, T0 + 9.9, 5) is None  # none in [T0 + 4.9, T0 + 9.9]
    assert near(job_id, T0 + 39.5, 0) is None  # within 0: only a keyframe at that moment
    assert near(job_id + 1, T0 + 30, 10) is None  # another job's


def test_a_small_job_gets_none(store):
    """Its moments fold in a fraction of a second; keyframes would cost it more per rank."""
    clock = [T0]
    ingest = Ingest(store, clock=lambda: clock[0], keyframe_every_s=EVERY,
                    render_keyframe=keyframe).start()
    job_id = _live_job(ingest, clock, 35, min_ranks=RANKS + 1)
    state_at(ingest, job_id, T0 + 34)
    assert ingest.keyframes.made == 0 and _stored(ingest, store, job_id) == {}


def test_live_keyframes_take_at_most_their_share_of_the_writer(store):
    """A render that takes d seconds puts the job's next live keyframe d / live_share
    seconds later (the job's batches wait while one renders); scrubs store the others."""

    def slow(*args):
        time.sleep(0.2)
        return keyframe(*args)

    clock = [T0]
    ingest = Ingest(store, clock=lambda: clock[0], keyframe_every_s=EVERY,
                    render_keyframe=slow).start()
    job_id = _live_job(ingest, clock, 120, share=0.01)  # 0.2 s or more: 20 s or more apart
    kept = sorted(_stored(ingest, store, job_id))
    assert len(kept) >= 2 and ingest.keyframes.skipped >= 4
    assert all(b - a >= 3 * EVERY for a, b in zip(kept, kept[1:])), kept


def test_an_answer_that_cannot_be_rendered_costs_the_fold_nothing(store):
    clock = [T0]

    def broken(*_):
        raise RuntimeError("boom")

    ingest = Ingest(store, clock=lambda: clock[0], keyframe_every_s=EVERY,
                    render_keyframe=broken).start()
    job_id = _live_job(ingest, clock, 35)
    assert ingest.keyframes.failed == 3 and _stored(ingest, store, job_id) == {}
    stored = list(store.log.events(job_id))
    assert ingest.state(job_id).last_event_id == stored[-1]["id"]  # every batch was folded


def test_compaction_keeps_old_keyframes_every_30_s_and_a_scrub_stores_none_again(
        store, monkeypatch):
    """Beyond the window and away from findings, the keyframes at multiples of
    PGDASH_KEYFRAME_KEEP_S stay (the page takes one up to 30 s before a moment); a scrub
    through that stretch does not store the others again. (The grid alone.)"""
    monkeypatch.setattr("dashboard.history.keyframes.MAX_MARKS", 0)
    from dashboard.storage.compaction import Compactor, Policy

    clock = [T0]
    ingest = Ingest(store, clock=lambda: clock[0], keyframe_every_s=EVERY,
                    render_keyframe=keyframe).start()
    job_id = _live_job(ingest, clock, 400)
    made = sorted(_stored(ingest, store, job_id))
    compactor = Compactor(store, Policy(keep_full_s=180, around_findings_s=0),
                          guard=ingest.rewind.compacting, clock=lambda: clock[0])
    compactor.run_once()
    last = max(ev["received_at"] for ev in store.log.events(job_id))
    horizon = math.floor((last - 180) / 60) * 60  # the window's first cell (60 s, of epoch)
    spans = [(f["first_seen"], f["last_seen"]) for f in store.findings.of_job(job_id)]
    assert any(b < horizon for _, b in spans)  # the hang's: keyframes kept around it

    def kept(at):
        return at >= horizon or at % 30 == 0 or any(a <= at <= b for a, b in spans)

    left = sorted(store.keyframes.moments(job_id))
    assert left == [at for at in made if kept(at)] and len(left) < len(made)
    assert compactor.keyframes_deleted == len(made) - len(left)
    # A server that scrubs the job from its start stores nothing the compactor removed.
    scrub = Ingest(store, clock=lambda: clock[0], keyframe_every_s=EVERY,
                   render_keyframe=keyframe).start()
    scrub.keyframes.min_ranks = RANKS
    state_at(scrub, job_id, T0 + 170)
    assert scrub.keyframes.made == 0 and sorted(_stored(scrub, store, job_id)) == left
