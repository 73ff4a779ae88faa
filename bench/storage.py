"""Bounded storage: bytes on disk per rank-hour, ``state?at=`` time, export/import time.

What runs: a simulated job of ``--ranks`` ranks (default 64; the issue's figure is
``--ranks 256``) for ``--minutes`` of simulated time (default 60), written through the real
path (``Ingest.connect`` and ``Ingest.batch_nowait`` -> the Store's writer thread -> a real
SQLite file, folded live into JobState) with a clock the bench moves forward. Each rank
sends what a real agent sends at its defaults (bench.common.agent_schedule: a heartbeat, a
GPU reading and a latency summary of ``--ops`` rows a second, and a second summary half a
second later, PGDASH_STATS_INTERVAL_S = 0.5), a second's events in one batch; at ``--hang-at`` minutes one rank
stops entering the world group's collectives for ``--hang-for`` minutes (the others wait
in an all_reduce), so diagnosis raises a hang that resolves: the "full resolution kept
around findings" part of the figure. Live diagnosis runs every 10 simulated seconds; the
compactor (dashboard.storage.compaction, if this pgdash has it) runs every 5 simulated minutes,
through the writer thread as in the server.

Printed:

* **bytes per rank-hour**: the SQLite file (after a WAL checkpoint) and the pages in use
  (what a VACUUM would shrink it to; SQLite reuses the free ones), divided by ranks x hours:
  at the job's end, and once the compactor has seen it quiet (a stored job: its newest
  cells packed too);
* **compaction**: the seconds the compactor's passes took while the job ran (a share of
  the ingest time: in the server it is a thread competing with ingest for the GIL);
* **state?at**: ``Ingest.state_at`` (what ``GET /api/jobs/<id>/state?at=`` runs) for
  ``--moments`` random moments in random order (forward and backwards): the first (cold)
  one, then p50 / p95 / max; again with a fresh Ingest on the same file (a restart);
* **state?at&within=**: the same moments after the restart as the page asks them while its
  slider moves on a big job (``&within=30``: the newest keyframe up to 30 s before, stored
  by the live fold every ``--keyframe-every`` seconds, dashboard.history.keyframes; a moment
  without one is folded), and the keyframes' bytes per rank-hour;
* **incident marks**: the page at the job's incident marks (where incidents began and ended:
  Shift+←/→) after a restart, as the API answers (a keyframe at exactly the moment asked,
  else a fold): the first visit and again on a fresh server, ten one-second steps back from
  each (←), and how far before the moment asked the ``&within=30`` answer 3.5 s before each
  lies (dragging past it); with ``--prepare-marks``, the server first prepares them as the
  page's opening of an ended job asks (dashboard.history.incident_frames), timed;
* **opening** (``--scrub-only``): the job opened on a restarted server (``GET
  /api/jobs/<id>``: its state folded from its newest checkpoint, or its whole log), first;
* **export / import**: ``pgdash export``'s lines of the job into a file, and that file
  imported as a new job (dashboard.history.archive), in seconds.

Reference in the same run: the bytes of the same log as the JSON rows the first schema
stored (one row per event, JSON body), computed from the events sent.

A measurement, not a test: exit status 0 whatever the figures. From the repository root::

    python -m bench.storage                          # 64 ranks, an hour (a few minutes)
    python -m bench.storage --ranks 256              # the issue's job
    python -m bench.storage --ranks 8 --minutes 20   # quick look
    python -m bench.storage --ranks 256 --checkpoint-every 60   # denser checkpoints: the
        # scrub time they buy against the bytes they cost
    python -m bench.storage --ranks 256 --no-export --db job.db      # keep the job, then
    python -m bench.storage --ranks 256 --scrub-only --db job.db --at 1250 950 --verbose
    python -m bench.storage --ranks 1024 --minutes 10 --hang-at 5.0062 --hang-for 2 \
        --scrub-only --db copy.db --prepare-marks   # incidents prepared before the visits
        # scrub it again; PYTHONSAFEPATH=1 PYTHONPATH=<another checkout>:$PWD scrubs with
        # that pgdash (on a copy of the file, since scrubs store the checkpoints they pass)
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import sqlite3
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

from bench.common import (agent_schedule, members, mesh_groups, pct, second_events,
                          start_events, summary_event)
from dashboard.history import archive
from dashboard.ingest.pipeline import Ingest
from dashboard.web.live import state_at

try:
    from dashboard.web.live import keyframe, keyframe_answer
except ImportError:  # a pgdash from before keyframes
    keyframe = keyframe_answer = None
from dashboard.storage.store import Store

try:
    from dashboard import garbage
except ImportError:  # an earlier pgdash (PYTHONPATH): CPython's collector, as its server's
    garbage = None

try:
    from dashboard.storage.compaction import Compactor, Policy
except ImportError:  # a pgdash from before bounded storage
    Compactor = Policy = None


T0 = 1_780_000_000.0  # the job's start: the same cells and checkpoints every run


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def simulate(args, db: Path) -> dict:
    t0 = T0
    clock = Clock(t0)
    store = Store(f"sqlite:///{db}", queue_limit=100_000).start()
    ingest = make_ingest(args, store, clock)
    compactor = make_compactor(args, store, ingest, clock)
    rng = random.Random(args.seed)
    world = args.ranks
    groups = members(mesh_groups(world), world)
    sessions, seqs, job_id = [], [], None
    json_bytes = 0  # the reference: the same events as first-schema JSON rows
    for rank in range(world):
        session = uuid.uuid4().hex
        sessions.append(session)
        seqs.append(0)
        _, job_id = ingest.connect({"v": 1, "session": session, "job": "bench-storage",
                                    "rank": rank, "host": f"node{rank // 8:04d}",
                                    "pid": 10_000 + rank})

    def send(rank: int, events: list) -> object:
        nonlocal json_bytes
        out = []
        for kind, body, t in events:
            seqs[rank] += 1
            out.append({"seq": seqs[rank], "t": t, "kind": kind, "body": body})
            json_bytes += len(json.dumps(body)) + 120  # + the row's other columns, indexes
        ack, pending = ingest.batch_nowait(sessions[rank], job_id, out)
        if not ack.get("ok"):
            raise SystemExit(f"bench: batch refused: {ack}")
        return pending

    pending = []
    for rank in range(world):
        pending.append(send(rank, [(k, b, clock.t) for k, b, _ in
                                   start_events(rank, world, "bench-storage", groups[rank])]))
    hang_start = t0 + args.hang_at * 60
    hang_end = hang_start + args.hang_for * 60
    stuck = world // 2  # the rank that stops entering the world group's collectives
    seconds = int(args.minutes * 60)
    schedule = agent_schedule()  # [(0.0, True), (0.5, False)] at the agent's defaults
    span = schedule[1][0] if len(schedule) > 1 else 1.0  # what a summary covers
    wall, compact_s = time.perf_counter(), 0.0
    for s in range(1, seconds + 1):
        base = t0 + s
        for rank in range(world):
            clock.t = base + rank / world  # each rank at its own phase within the second
            t = clock.t - 0.05
            # What the agent sends a second at its defaults (bench.common.agent_schedule): at
            # the heartbeat a summary, the heartbeat and a GPU reading, and a summary at each
            # stats interval between; here in one batch, as an agent behind by a beat sends.
            hb, coll, gpu = second_events(rank, s, groups[rank], args.ops, rng, now=t,
                                          span=span)
            events = [summary_event(groups[rank], args.ops, rng, span, now=t - 1 + offset)
                      for offset, _ in schedule[1:]] + [hb, coll, gpu]
            if hang_start <= t < hang_end:
                step = int(args.hang_at * 60)
                for row in hb[1]["groups"]:
                    if row["group"] == "0":
                        entered = step * 20 + (0 if rank == stuck else 1)
                        row.update(entered=entered, completed=step * 20,
                                   inflight_op=None if rank == stuck else "all_reduce",
                                   inflight_since=None if rank == stuck else hang_start)
                events = [hb, gpu]  # nothing completes while the world group waits
            pending.append(send(rank, [(k, b, t) for k, b, _ in events]))
        for p in pending:
            if p is not None:
                p.result(timeout=600)
        pending = []
        if s % 10 == 0:
            ingest.diagnosis.run()
        if compactor is not None and s % 300 == 0:
            start = time.perf_counter()
            compactor.run_once()
            compact_s += time.perf_counter() - start
        if s % 600 == 0:
            print(f"  simulated {s // 60} min of {args.minutes:g} "
                  f"({time.perf_counter() - wall:.0f} s)", flush=True)
    if args.end:  # every rank exits cleanly: a job that ended (bench.scrub replays it)
        clock.t = t0 + seconds + 1
        for rank in range(world):
            send(rank, [("exit", {"clean": True}, clock.t)]).result(timeout=600)
    if compactor is not None:
        start = time.perf_counter()
        compactor.run_once()
        compact_s += time.perf_counter() - start
    if hasattr(ingest.rewind, "wait_saved"):  # live checkpoints compress off the writer
        ingest.rewind.wait_saved()
    store.writer.wait_idle()
    ingest_s = time.perf_counter() - wall
    # The job ended: the server prepares its incidents (dashboard.history.incident_frames),
    # timed here and finished before anything else is measured.
    frames = getattr(ingest, "incident_frames", None)
    if frames is not None and not getattr(args, "prepare_end", True):
        frames.stop()  # (tests that want the grid's keyframes alone)
    elif frames is not None:
        frames.wait_idle(timeout=3600)
        store.writer.wait_idle()
        if frames.marks_folded:
            print(f"incident marks prepared as the job ended: {frames.marks_folded} marks, "
                  f"{time.perf_counter() - wall - ingest_s:.1f} s (in the background, "
                  f"{frames.settle_s:g} s after it ended)")
    findings = store.findings.of_job(job_id)
    return {"store": store, "ingest": ingest, "job_id": job_id, "t0": t0,
            "end": t0 + seconds + 1, "json_bytes": json_bytes, "findings": findings,
            "ingest_s": ingest_s, "compactor": compactor, "clock": clock,
            "compact_s": compact_s}


def disk_bytes(db: Path) -> tuple[int, int]:
    """(file bytes after a WAL checkpoint, bytes of the pages in use)."""
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    pages, free, size = (con.execute(f"PRAGMA {p}").fetchone()[0]
                         for p in ("page_count", "freelist_count", "page_size"))
    con.close()
    return db.stat().st_size, (pages - free) * size


def scrub(ingest: Ingest, job_id: int, moments: list[float], verbose: bool = False,
          origin: float | None = None) -> tuple[float, list[float]]:
    """(the first moment's time, the others'); verbose: each moment, in seconds after
    ``origin`` (the first moment)."""
    origin = moments[0] if origin is None else origin
    times, rewind, last = [], ingest.rewind, None
    for at in moments:
        read, loaded = rewind.events_read, getattr(rewind, "checkpoints_loaded", 0)
        start = time.perf_counter()
        found = state_at(ingest, job_id, at)
        times.append(time.perf_counter() - start)
        assert found is not None and found["job"]["world_size"], "state?at= gave no job"
        if verbose:
            way = "" if last is None else ("forward" if at > last else "back")
            print(f"    at +{at - origin:8.0f} s {way:7} {times[-1] * 1000:7.0f} ms, "
                  f"{rewind.events_read - read} events folded, stored checkpoint "
                  f"{'loaded' if getattr(rewind, 'checkpoints_loaded', 0) > loaded else '-'}")
        last = at
    if hasattr(ingest.rewind, "wait_saved"):  # what the scrubs stored, before a restart
        ingest.rewind.wait_saved(timeout=300)
    return times[0], times[1:]


def make_ingest(args, store: Store, clock: Clock) -> Ingest:
    """The server's ingest, storing checkpoints every --checkpoint-every seconds and
    keyframes every --keyframe-every (where this pgdash has them)."""
    frames = {} if keyframe is None else {"keyframe_every_s": args.keyframe_every,
                                          "render_keyframe": keyframe}
    ingest = Ingest(store, clock=clock, **frames)
    if args.checkpoint_every is not None:
        ingest.rewind.persist_every_s = args.checkpoint_every
    return ingest.start()


def make_compactor(args, store: Store, ingest: Ingest, clock: Clock):
    """The server's compactor with the bench's flags (None without compaction)."""
    if Compactor is None or args.keep_full <= 0:
        return None
    more = {} if args.pack_after is None else {"pack_after_s": args.pack_after,
                                               "checkpoint_keep_s": args.checkpoint_keep}
    known = inspect.signature(Compactor).parameters
    timed = {"clock": clock} if "clock" in known else {}
    if "duty" in known:  # ingest waits while it compacts here: no pauses for it
        timed["duty"] = 1.0
    return Compactor(store, Policy(keep_full_s=args.keep_full,
                                   around_findings_s=args.keep_around_findings, **more),
                     guard=ingest.rewind.compacting, **timed)


WITHIN_S = 30.0  # what the page asks while its slider moves (static/js/job/replay.js)


def scrub_near(ingest: Ingest, job_id: int, moments: list[float],
               within: float | None = WITHIN_S) -> tuple[list[float], int, list[float]]:
    """``state?at=T&within=S`` at each moment, as the API answers it (``within`` 0: the
    exact moment, ``state?at=T`` alone, where the API reads a keyframe at exactly T; None:
    a fold, as it did before): the keyframe's JSON, or a fold of T without one. (times,
    moments answered by a keyframe, the moment each answer shows)"""
    times, hits, shown = [], 0, []
    for at in moments:
        start = time.perf_counter()
        found = None if within is None else ingest.keyframes.near(job_id, at, within)
        answer = json.dumps(state_at(ingest, job_id, at)) if found is None else \
            keyframe_answer(found)
        times.append(time.perf_counter() - start)
        hits += found is not None
        shown.append(json.loads(answer)["at"])
    return times, hits, shown


def report_near(ingest: Ingest, store: Store, job_id: int, moments: list[float],
                rank_hours: float) -> None:
    if not hasattr(ingest, "keyframes"):
        return
    times, hits, _ = scrub_near(ingest, job_id, moments)
    with store.engine.connect() as conn:
        n, size = conn.exec_driver_sql(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(answer)), 0) FROM keyframes").first()
    print(f"state?at&within={WITHIN_S:g} after a restart: "
          f"p50 {statistics.median(times) * 1000:.0f} ms, p95 {pct(times, 0.95) * 1000:.0f} "
          f"ms, max {max(times) * 1000:.0f} ms; "
          f"{hits} of {len(times)} moments from a keyframe [goal p50 <= 100 ms, p95 <= 200]")
    print(f"keyframes stored: {n} ({size / 1e6:.1f} MB, {size / rank_hours / 1e3:.0f} kB per "
          f"rank-hour; made {ingest.keyframes.made} by this process's scrubs)")


STEPS_BACK = 10  # one-second steps back from each incident mark (the page's ←)


def report_open(args, store: Store, job_id: int, end: float) -> None:
    """Opening the job on a server restarted since (the page's ``GET /api/jobs/<id>``: its
    state folded from its log, and held from then on)."""
    from dashboard.web import views

    ingest = make_ingest(args, store, Clock(end))
    start = time.perf_counter()
    ingest.read(job_id, views.detail)
    took = time.perf_counter() - start
    from_checkpoint = ingest.counters.get("checkpoints_loaded_live")
    print(f"opening the job after a restart (GET /api/jobs/<id>): {took:.2f} s"
          + ("" if from_checkpoint is None else
             f" ({'from its newest checkpoint' if from_checkpoint else 'its whole log'})"))
    store.writer.wait_idle()


def report_marks(args, store: Store, job_id: int, end: float) -> None:
    """The page at the job's incident marks (where incidents began and, once resolved,
    ended: its Shift+←/→ stops) after a restart, as the API answers: each mark's exact
    moment, the first visit and again on a fresh server; STEPS_BACK one-second steps back
    from each (←); and ``&within=30`` 3.5 s before each (the slider dragged past it): how
    far before the moment asked the moment shown is."""
    ingest = make_ingest(args, store, Clock(end))
    if not hasattr(ingest, "keyframes"):
        return
    found = ingest.incidents(job_id) or []
    # (dashboard.diagnosis.incidents.marks, spelt out: an older pgdash measured has none)
    marks = sorted({i["first_seen"] for i in found}
                   | {i["last_seen"] for i in found if not i["active"]})
    if not marks:
        print("incident marks: none (the job raised no incident)")
        return
    # A pgdash whose API answers state?at=T from a keyframe at exactly T (its keyframes
    # know the moments a scrub goes toward); before, T was always folded.
    exact = 0.0 if "toward" in inspect.signature(ingest.keyframes.passing).parameters else None
    if args.prepare_marks:
        frames = getattr(ingest, "incident_frames", None)
        if frames is None:
            print("incident marks: this pgdash does not prepare them (no incident_frames)")
        else:
            start = time.perf_counter()
            frames.ask(job_id)
            frames.wait_idle(timeout=3600)
            store.writer.wait_idle()
            print(f"incident marks prepared in the background (GET /incidents, as the page "
                  f"opens the job): {time.perf_counter() - start:.1f} s, "
                  f"{frames.marks_folded} of {len(marks)} marks folded")
    first, hits_first, _ = scrub_near(ingest, job_id, marks, exact)
    store.writer.wait_idle()
    again, hits_again, _ = scrub_near(make_ingest(args, store, Clock(end)), job_id, marks,
                                      exact)
    back = [m - k for m in marks for k in range(1, STEPS_BACK + 1)]
    steps, hits_steps, _ = scrub_near(make_ingest(args, store, Clock(end)), job_id, back,
                                      exact)
    near = [m - 3.5 for m in marks]
    _, _, shown = scrub_near(make_ingest(args, store, Clock(end)), job_id, near)
    late = [at - s for at, s in zip(near, shown)]

    def ms(times: list[float]) -> str:
        return f"p50 {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms"

    print(f"incident marks ({len(marks)}), exact, after a restart: first visit {ms(first)} "
          f"({hits_first} from a keyframe); again, a fresh server: {ms(again)} ({hits_again} "
          f"from a keyframe)")
    print(f"  {STEPS_BACK} one-second steps back from each: {ms(steps)}, p95 "
          f"{pct(steps, 0.95) * 1000:.0f} ms ({hits_steps} of {len(steps)} from a keyframe)")
    print(f"  &within={WITHIN_S:g} 3.5 s before each: the moment shown is "
          f"{statistics.median(late):.1f} s (median), {max(late):.1f} s (most) before the "
          f"one asked")


def random_moments(args, t0: float, end: float) -> list[float]:
    rng = random.Random(args.seed)
    return [rng.uniform(t0 + 30, end) for _ in range(args.moments)]


def report_scrub(what: str, cold: float, warm: list[float]) -> None:
    print(f"{what}: first {cold * 1000:.0f} ms; then p50 {statistics.median(warm) * 1000:.0f} "
          f"ms, p95 {pct(warm, 0.95) * 1000:.0f} ms, max {max(warm) * 1000:.0f} ms")


def scrub_again(args) -> None:
    """--scrub-only: the restart half of a run's scrub, on the job it left in --db."""
    store = Store(f"sqlite:///{args.db}").start()
    try:
        job_id = next(j["id"] for j in store.jobs.newest() if j["name"] == "bench-storage")
        end = T0 + int(args.minutes * 60) + 1
        if args.at:
            moments = [T0 + a for a in args.at]
        else:
            moments = random_moments(args, T0, end)
            random.Random(args.seed).shuffle(moments)
        report_open(args, store, job_id, end)
        ingest = make_ingest(args, store, Clock(end))
        compactor = make_compactor(args, store, ingest, Clock(end))
        if compactor is not None:  # as a server's: it knows where it thinned checkpoints
            compactor.run_once()
        report_scrub(f"state?at on {args.db}", *scrub(ingest, job_id, moments, args.verbose,
                                                      T0 if args.at else None))
        store.writer.wait_idle()
        report_near(make_ingest(args, store, Clock(end)), store, job_id, moments,
                    args.ranks * args.minutes / 60)
        report_marks(args, store, job_id, end)
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--ops", type=int, default=9, help="rows per latency summary")
    parser.add_argument("--hang-at", type=float, default=30.0, help="minute the hang starts")
    parser.add_argument("--hang-for", type=float, default=3.0, help="minutes it lasts")
    parser.add_argument("--moments", type=int, default=20, help="random state?at= moments")
    parser.add_argument("--keep-full", type=float, default=900.0,
                        help="compactor's --keep-full (0: no compaction)")
    parser.add_argument("--keep-around-findings", type=float, default=300.0)
    parser.add_argument("--pack-after", type=float,
                        help="compactor's PGDASH_PACK_AFTER_S (default: the server's default; "
                             "0: no packs)")
    parser.add_argument("--checkpoint-keep", type=float, default=1800.0,
                        help="compactor's PGDASH_CHECKPOINT_KEEP_S, with --pack-after")
    parser.add_argument("--checkpoint-every", type=float, metavar="SECONDS",
                        help="PGDASH_CHECKPOINT_S: a stored state every this many seconds of "
                             "the log (default: the server's, 300; a multiple of the cell)")
    parser.add_argument("--keyframe-every", type=float, default=10.0, metavar="SECONDS",
                        help="PGDASH_KEYFRAME_S: the page's answer stored every this many "
                             "seconds (default: the server's, 10; 0: none)")
    parser.add_argument("--prepare-marks", action="store_true",
                        help="before visiting the incident marks, have the server prepare "
                             "them as the page's opening of an ended job asks")
    parser.add_argument("--no-prepare", dest="prepare_end", action="store_false",
                        help="with --end: the server does not prepare the ended job's "
                             "incidents (as a job stored by an older pgdash, or on another "
                             "server: bench.capacity --stored opens such jobs)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--end", action="store_true",
                        help="every rank exits cleanly at the end (the job ends; without it "
                             "the job is left running, its agents silent)")
    parser.add_argument("--no-export", action="store_true",
                        help="skip export / import (minutes for a 256-rank hour)")
    parser.add_argument("--verbose", action="store_true", help="each state?at= moment")
    parser.add_argument("--at", type=float, nargs="+", metavar="SECONDS",
                        help="with --scrub-only: these moments (seconds after the job's "
                             "start, in this order) instead of random ones")
    parser.add_argument("--scrub-only", action="store_true",
                        help="only scrub the job a run with the same flags left in --db (a "
                             "server started on it: its moments, as after a restart); with "
                             "PYTHONSAFEPATH=1 PYTHONPATH=<another checkout>:$PWD, that "
                             "pgdash's scrub of it")
    parser.add_argument("--db", type=Path, help="keep the database here (default: a temp dir)")
    parser.add_argument("--python-gc", action="store_true",
                        help="CPython's default garbage collection, not pgdash serve's "
                             "(dashboard.garbage: on a timer), which the bench runs under "
                             "otherwise")
    args = parser.parse_args()
    if args.hang_at + args.hang_for > args.minutes:
        parser.error("--hang-at + --hang-for must lie inside --minutes")
    if args.moments < 2 and not args.at:
        parser.error("--moments must be at least 2 (the first is timed apart from the rest)")
    if garbage is not None and not args.python_gc:  # what the server's process runs under
        garbage.tune()
        threading.Thread(target=garbage.collect_every, args=(threading.Event(),),
                         daemon=True).start()
    if args.scrub_only:
        if args.db is None or not args.db.exists():
            parser.error("--scrub-only needs --db FILE, written by a run with the same flags")
        scrub_again(args)
        return

    with tempfile.TemporaryDirectory(prefix="pgdash-bench-") as tmp:
        db = args.db or Path(tmp) / "bench.db"
        compaction = "off" if Compactor is None or not args.keep_full else \
            f"--keep-full {args.keep_full:g} --keep-around-findings {args.keep_around_findings:g}"
        if args.pack_after is not None and compaction != "off":
            compaction += (f" --pack-after {args.pack_after:g} "
                           f"--checkpoint-keep {args.checkpoint_keep:g}")
        every = "" if args.checkpoint_every is None else \
            f"; checkpoints every {args.checkpoint_every:g} s"
        print(f"bench/storage: {args.ranks} ranks, {args.minutes:g} simulated minutes, "
              f"{args.ops} latency rows a summary, hang at minute {args.hang_at:g} for "
              f"{args.hang_for:g} min; compaction {compaction}{every}; {db}", flush=True)
        run = simulate(args, db)
        store, ingest, job_id = run["store"], run["ingest"], run["job_id"]
        rank_hours = args.ranks * args.minutes / 60
        with store.engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT COUNT(*) FROM events").scalar()
            try:  # revision 0005 on (dashboard.storage.compaction's packs)
                packs = conn.exec_driver_sql(
                    "SELECT COUNT(*), COALESCE(SUM(n), 0), COALESCE(SUM(LENGTH(data)), 0) "
                    "FROM event_packs").first()
            except Exception:
                packs = None
        packed = "" if packs is None else \
            f" + {packs[1]} events in {packs[0]} packs ({packs[2] / 1e6:.1f} MB)"
        print(f"ingest: {run['ingest_s']:.0f} s wall for {args.minutes:g} simulated min; "
              f"{rows} event rows{packed} stored; findings: "
              f"{sorted({f['kind'] for f in run['findings']}) or 'none'}")
        if run["compactor"] is not None:
            print(f"compaction: {run['compact_s']:.1f} s of that in its passes (every 5 "
                  "simulated min and once at the end)")

        moments = random_moments(args, run["t0"], run["end"])
        cold, warm = scrub(ingest, job_id, moments, args.verbose)
        print(f"state?at: first {cold * 1000:.0f} ms (folds up to it); then random moments "
              f"p50 {statistics.median(warm) * 1000:.0f} ms, p95 {pct(warm, 0.95) * 1000:.0f} ms, "
              f"max {max(warm) * 1000:.0f} ms ({len(warm)} moments, forward and backwards)")
        store.writer.wait_idle()
        restarted = make_ingest(args, store, Clock(run["end"]))
        random.Random(args.seed).shuffle(moments)
        report_scrub("state?at after a restart", *scrub(restarted, job_id, moments,
                                                          args.verbose))
        store.writer.wait_idle()
        report_near(make_ingest(args, store, Clock(run["end"])), store, job_id, moments,
                    rank_hours)
        report_marks(args, store, job_id, run["end"])
        size, used = disk_bytes(db)
        with store.engine.connect() as conn:
            kept = conn.exec_driver_sql(
                "SELECT COALESCE(SUM(LENGTH(state)), 0), COUNT(*) FROM checkpoints").first() \
                if Compactor is not None else (0, 0)
        quiet = None
        compactor = run["compactor"]
        if getattr(compactor, "clock", None) is not None and compactor.policy.pack_after_s:
            # The job ended: once the compactor sees it quiet, its newest cells pack too.
            run["clock"].t = run["end"] + compactor.policy.pack_after_s + compactor.policy.cell_s
            compactor.run_once()
            store.writer.wait_idle()
            quiet = disk_bytes(db)

        if args.no_export:
            print("export / import: skipped (--no-export)")
        else:
            start = time.perf_counter()
            path = Path(tmp) / "job.jsonl"
            with open(path, "w") as out:
                for line in archive.export_lines(store, job_id):
                    out.write(line)
            exported = time.perf_counter() - start
            start = time.perf_counter()
            with open(path) as src:
                loaded = archive.Archive.read(src, str(path))
            new_id = archive.import_archive(store, loaded, run["end"])
            imported = time.perf_counter() - start
            print(f"export: {exported:.1f} s ({path.stat().st_size / 1e6:.1f} MB file); "
                  f"import: {imported:.1f} s (job {new_id}, {len(loaded.events)} events)")
        print(f"checkpoints stored: {kept[1]} ({kept[0] / 1e6:.1f} MB)")
        print(f"reference, first-schema JSON rows: "
              f"{run['json_bytes'] / rank_hours / 1e3:.0f} kB per rank-hour")
        print(f"disk: {size / rank_hours / 1e3:.0f} kB per rank-hour (file), "
              f"{used / rank_hours / 1e3:.0f} kB per rank-hour (pages in use)  "
              f"[goal <= 250 kB]; at the job's end")
        if quiet is not None:
            print(f"disk once the job has been quiet for PGDASH_PACK_AFTER_S and a cell (its "
                  f"newest cells packed too): {quiet[0] / rank_hours / 1e3:.0f} kB per rank-hour "
                  f"(file), {quiet[1] / rank_hours / 1e3:.0f} kB (pages in use)")
        store.close()


if __name__ == "__main__":
    main()
