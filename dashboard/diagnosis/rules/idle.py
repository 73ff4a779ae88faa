"""Rule for a job whose every rank stopped issuing collectives, none inside one: the `stall`
and the `hang` that no wait in a collective shows. Every rank blocked on the same shared thing
(a lock on a shared file, a dead NFS server, a remote data service), or ranks that wait for
one another outside torch.distributed (``store.get`` for a key another rank sets, a file
another rank writes) while that rank is stuck elsewhere.

Nobody waits in a collective, so the rules of rules.hangs see nothing: the job just stops.
What shows it is progress: each heartbeat's collective counts (``JobState.moved_at``: when each
rank's last moved). A job may also pause on purpose (an evaluation without collectives, a
checkpoint written by every rank), so the threshold grows with the longest pause the job
has taken so far (``JobState.longest_pause``), and the verdict is a warning before it is
critical.

Which ranks are at fault is not known from progress alone: the stall names none at first,
and its incident asks every rank for a snapshot (dashboard.ingest.asks). Where most ranks'
training threads stand at one line and a few elsewhere, the few are named (the others wait
for them); where all stand at one line, or the snapshots do not come within PLACES_WAIT_S,
every rank is.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from dashboard.statuses import RankStatus
from dashboard.diagnosis.core import Finding, Settings, Severity, finding
from dashboard.diagnosis.text import agree, ranks_label, stack_commands, them
from dashboard.state import JobState, RankState

# A pause this many times the job's longest so far is a stall (at least --stall-after where
# no rank works, and the 30 s a stall in a barrier waits where one does: ranks that wait for
# rank 0's checkpoint or evaluation) ...
PAUSE_FACTOR = 3.0
# ... and a hang once it lasted this many times --hang-after (a long evaluation or checkpoint
# the job never paused for before stays a warning meanwhile).
HANG_FACTOR = 5.0
# A rank that used this share of a core since its collectives stopped, or read and wrote
# this many bytes a second (a checkpoint written to slow storage; the agent's own traffic is
# a few kB a second), is working (an evaluation, a checkpoint without collectives), not
# blocked: when every rank is, no finding.
BUSY_CORES = 0.25
BUSY_IO_BPS = 1e6
# How long the stall names no rank while the snapshots its incident asked for come in (one
# is asked when it opens: dashboard.ingest.asks); then, without them, it names every rank.
PLACES_WAIT_S = 15.0


def idle(state: JobState, now: float, s: Settings, stopping: bool = False) -> list[Finding]:
    """The finding at ``now``; ``stopping``: at the moment a job that stood still was stopped
    (rules.hangs.job_stop), its ranks ending from then on count as still there."""
    moved = state.moved_at
    if not moved:
        return []
    quiet_since = max(moved.values())  # (cheap first: most judgements end here)
    pause = PAUSE_FACTOR * state.longest_pause
    if now - quiet_since < max(s.stall_after, pause):
        return []
    ranks = state.ranks()
    if len(ranks) < (state.world_size or 0) or any(
            not _there(r, now, stopping) or r.rank not in moved for r in ranks):
        return []  # not all running, or one never moved: other rules' ground
    # How long every rank's heartbeats have shown its counts still (a silent rank shows
    # nothing: rank_lost's ground; a server behind its agents judges what it has read) ...
    quiet = min(now, min(r.last_seen for r in ranks)) - quiet_since
    # ... while they are not all working (older agents say nothing of their CPU: for them,
    # the hang's threshold). Where none works (no CPU, no I/O anywhere) nothing can be on its
    # way: --stall-after; where one does (rank 0 writing a checkpoint while the others wait
    # for it in store.get), the 30 s a barrier gives it ...
    use = {r.rank: _use(state.cpu_since_move.get(r.rank)) for r in ranks}
    working = [_working(u) for u in use.values()]
    if all(working):
        return []
    if any(u is None for u in use.values()):
        stall_after = max(s.hang_after, pause)
    elif any(working):
        stall_after = max(s.stall_barrier_after, pause)
    else:
        stall_after = max(s.stall_after, pause)
    if quiet < stall_after:
        return []
    # ... and none is inside a collective or a point-to-point op (the hang rules' ground).
    if any(_inside(row) for row in state.progress.values()):
        return []
    hang_after = max(HANG_FACTOR * s.hang_after, stall_after)
    critical = quiet >= hang_after
    everyone = [r.rank for r in ranks]
    places = _places(state, everyone, quiet_since)
    if len(places) < len(everyone) and quiet < stall_after + PLACES_WAIT_S:
        blamed, where_text = [], (f"{ranks_label(everyone)} {agree(everyone, 'is', 'are')} "
                                  "all outside collectives (where each stands is asked)")
    else:
        blamed, where_text = _blamed(everyone, places)
    kind, severity = ("hang", Severity.CRITICAL) if critical else ("stall", Severity.WARNING)
    summary = (f"No rank has entered a collective for {quiet:.0f} s, and none is inside one"
               + (f" (the longest pause before: {state.longest_pause:.0f} s)"
                  if state.longest_pause >= 1 else "")
               + f": {where_text}.")
    hint = ("Every rank stopped outside torch.distributed, so no collective timeout will "
            "ever end this. ")
    if blamed and len(blamed) < len(everyone):
        hint += (f"The others wait for {them(blamed)} outside torch.distributed (a key of the "
                 "store, a file, a queue it should fill): find why it is stuck where it "
                 "stands. ")
    else:
        hint += ("When every rank stands still outside collectives, they usually wait on one "
                 "shared thing: a lock on a shared file, a filesystem that stopped answering "
                 "(NFS, Lustre: `dmesg -T | grep -i 'not responding'`), a remote data or "
                 "logging service, a subprocess. ")
    hint += (f"{stack_commands(state, blamed or everyone).capitalize()} show where. If the "
             "ranks are meant to wait there (a download every rank makes, a rate limit), this "
             "clears when they go on, and later pauses as long are not flagged.")
    evidence: dict[str, Any] = {"quiet_since": quiet_since, "longest_pause": state.longest_pause,
                                "stall_after": stall_after, "hang_after": hang_after,
                                "cpu_cores": {str(k): None if u is None else round(u[0], 3)
                                              for k, u in use.items()},
                                "io_bps": {str(k): None if u is None else round(u[1])
                                           for k, u in use.items()},
                                "places": {str(k): v for k, v in places.items()}}
    first_seen = quiet_since + (hang_after if critical else stall_after)
    return [finding(kind, severity, blamed, None, summary, hint, evidence, first_seen,
                    key="idle")]


def exit_held(state: JobState, now: float, s: Settings) -> list[Finding]:
    """Ranks whose script ended (the main thread returned) while their process lives on, for
    as long as a stall: Python waits for every non-daemon thread before it exits (a metrics
    uploader blocked on a queue nobody closes), so the launcher waits for the process, and
    the job never ends. Named after --stall-after (10 s; 30 s where no thread holds it: an
    exit handler, such as a logger's last upload, runs), critical after HANG_FACTOR x
    --hang-after, as the idle job. A process that works meanwhile (a last upload, a checkpoint written
    by a thread) is not held: like the idle rule, a quarter of a core or 1 MB/s of I/O."""
    held = {}
    for r in state.ranks():
        done = r.main_done
        if done is None or r.status != RankStatus.RUNNING or r.rank is None:
            continue
        waited = min(now, r.last_seen) - done[0]
        # No thread holds it: an exit handler runs (a logger's last upload): a barrier's 30 s
        after = s.stall_after if r.holding else s.stall_barrier_after
        if waited < after or _working(_use(done)):
            continue
        if any(_inside(row) for (g, rank), row in state.progress.items() if rank == r.rank):
            continue  # a thread inside a collective: the hang rules' ground
        held[r.rank] = (waited, r, after)
    if not held:
        return []
    ranks = sorted(held)
    waited = min(w for w, _, _ in held.values())
    critical = waited >= HANG_FACTOR * s.hang_after
    threads = sorted({name for _, r, _ in held.values() for name in r.holding})
    names = ", ".join(f"'{n}'" for n in threads[:4]) + (" and more" if len(threads) > 4 else "")
    what = (f"Python waits for {agree(threads, 'its', 'their')} non-daemon "
            f"{agree(threads, 'thread', 'threads')} {names} to end before exiting"
            if threads else "no Python thread holds it (a C extension's thread, or an exit "
            "handler that does not return)")
    kind, severity = ("hang", Severity.CRITICAL) if critical else ("stall", Severity.WARNING)
    summary = (f"{ranks_label(ranks).capitalize()} finished {agree(ranks, 'its', 'their')} "
               f"script {waited:.0f} s ago (the main thread returned), but "
               f"{agree(ranks, 'its process has', 'their processes have')} not exited: "
               f"{what}; the launcher waits for {them(ranks)}.")
    hint = ("A thread started without `daemon=True` keeps the interpreter alive after the "
            "script ends. Stop it before the end (put a sentinel on the queue it reads, or set "
            "an Event it checks, then `join()` it), or start it with `daemon=True` if its work "
            f"may be lost at exit. {stack_commands(state, ranks).capitalize()} show where it "
            "waits.")
    first_seen = max(r.main_done[0] + (HANG_FACTOR * s.hang_after if critical else after)
                     for _, r, after in held.values())
    return [finding(kind, severity, ranks, None, summary, hint,
                    {"main_done_at": {str(k): r.main_done[0] for k, (_, r, _) in held.items()},
                     "holding": {str(k): list(r.holding) for k, (_, r, _) in held.items()}},
                    first_seen, key="exit_held")]


def works(state: JobState, rank: int) -> tuple[float, float] | None:
    """A rank's (share of a core, I/O bytes a second) since its collectives last moved, where
    that is work (rank 0's evaluation while the others wait for it at a barrier; a loop that
    never ends looks the same); None where it is not, or its agent does not say."""
    use = _use(state.cpu_since_move.get(rank))
    return use if _working(use) else None


def work_text(uses: list[tuple[float, float] | None]) -> str:
    """What the busiest of these uses (of :func:`works`) was: a share of a core, or else
    bytes of I/O a second."""
    cores = max(u[0] for u in uses if u is not None)
    if cores >= BUSY_CORES:
        return f"{cores:.0%} of a core"
    return f"{max(u[1] for u in uses if u is not None) / 1e6:.1f} MB/s of I/O"


def _use(kept: list[float] | None) -> tuple[float, float] | None:
    """(share of a core, bytes read and written a second) of a process between two
    readings, ``[t, CPU s, I/O bytes]`` then the same again (``JobState.cpu_since_move``:
    since its collectives last moved; ``RankState.main_done``: since its script ended).
    None: its agent does not say, or not over 5 s yet."""
    if kept is None or len(kept) < 6 or kept[3] - kept[0] < 5.0:
        return None
    span = kept[3] - kept[0]
    return (kept[4] - kept[1]) / span, (kept[5] - kept[2]) / span


def _working(use: tuple[float, float] | None) -> bool:
    """Whether that use is work (a quarter of a core, or 1 MB/s of I/O), not a block."""
    return use is not None and (use[0] >= BUSY_CORES or use[1] >= BUSY_IO_BPS)


def _there(r: RankState, now: float, stopping: bool) -> bool:
    if r.status == RankStatus.RUNNING:
        return r.left_at is None
    return stopping and r.status in (RankStatus.LOST, RankStatus.FAILED) and \
        r.exit_at is not None and r.exit_at >= now


def _inside(row: dict[str, Any]) -> bool:
    return (row.get("entered", 0) > row.get("completed", 0)
            or row.get("fr_enqueued", 0) > row.get("fr_completed", 0)
            or bool(row.get("p2p_op") and row.get("p2p_n")))


def _places(state: JobState, ranks: list[int], since: float) -> dict[int, str]:
    """rank -> where its training thread stood in its newest snapshot taken after ``since``
    ("file:line in function: code"), for the ranks that answered one."""
    newest: dict[int, dict[str, Any]] = {}
    wanted = set(ranks)
    for answers in state.snapshots.values():
        for rank, answer in answers.items():
            if rank in wanted and answer.get("t", 0) >= since and \
                    answer["t"] >= newest.get(rank, {}).get("t", 0):
                newest[rank] = answer
    out = {}
    for rank, answer in newest.items():
        where = _training_frame(answer)
        if where is not None:
            out[rank] = where
    return out


def _training_frame(answer: dict[str, Any]) -> str | None:
    """The innermost frame of the training code (not a library's) of the snapshot's
    training thread."""
    thread = next((t for t in answer.get("threads") or () if t.get("training")), None)
    frames = (thread or {}).get("frames") or []
    frame = next((f for f in reversed(frames) if not f.get("library")),
                 frames[-1] if frames else None)
    if frame is None:
        return None
    code = f": {frame['code'].strip()}" if frame.get("code") else ""
    return f"{frame['file']}:{frame['line']} in {frame['function']}{code}"


def _blamed(ranks: list[int], places: dict[int, str]) -> tuple[list[int], str]:
    """The ranks at fault and where they stand: those away from where most of the ranks
    wait, when most wait at one place and every rank's place is known; else every rank."""
    if len(places) == len(ranks) and len(ranks) > 2:
        common, count = Counter(places.values()).most_common(1)[0]
        odd = sorted(r for r in ranks if places[r] != common)
        if odd and count > len(ranks) / 2:
            waiting = [r for r in ranks if r not in odd]
            where = ", ".join(f"rank {r} is at {places[r]}" for r in odd[:3])
            return odd, (f"{ranks_label(waiting)} {agree(waiting, 'waits', 'wait')} at "
                         f"{common}, while {where}")
    common = Counter(places.values()).most_common(1)
    if common and common[0][1] == len(ranks):
        return ranks, f"every rank stands at {common[0][0]}"
    return ranks, f"{ranks_label(ranks)} {agree(ranks, 'is', 'are')} all outside collectives"
