"""The book: the lifecycle of one job's findings and incidents, the same for live and replay.

``diagnose(state, now)`` says what is wrong at one moment. The book remembers across moments:
when each finding started (``first_seen``, the earliest any moment gave), when it was last
active (``last_seen``), that a finding no longer reported is resolved (kept, ``active``
false), and which incidents appeared, resolved or turned critical, for whoever is told.

**One grid of moments.** A book is ticked only on the moments ``k * diagnose_every`` (Unix
seconds of the server's clock, the clock that stamps ``received_at``), and a tick at moment T
judges the state holding exactly the events received by T. Live ingest ticks the due moments
before it folds each batch and from its timer; replay (``archive.replay``, ``state?at=``)
ticks them while folding the log with a ``Timeline`` (dashboard.diagnosis.timeline, which
also reads the book's stored log back). So both see the same states at the same moments, and
give the same findings with the same first/last-seen times. Where they may differ (the server
was behind, restarted, or clustered) is said in README, "One lifecycle".

A Book is a plain picklable object (dicts, floats, the frozen Settings): it can travel with a
checkpointed JobState. No Flask, no SQL, no clock. Also here: what a tick reports (``Change``,
``Changes``) and the rows of the history a book records (``LogRow``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, NamedTuple

from dashboard.statuses import ENDED, TextEnum
from dashboard.diagnosis.core import Finding, Settings, Severity
from dashboard.diagnosis.incidents import Incident, active_count, incidents
from dashboard.diagnosis.rules import diagnose
from dashboard.state import JobState


class Change(TextEnum):
    """What happened to a finding or an incident at one tick (str-valued, as sent)."""

    NEW = "new"  # appeared, or came back after it had resolved
    CHANGED = "changed"  # another severity or other blamed ranks
    UPDATED = "updated"  # only its text (a hang's says how long): stored, not news
    RESOLVED = "resolved"
    ESCALATED = "escalated"  # an incident that turned critical (a stall that became a hang)


class Changes(NamedTuple):
    """What one tick changed: findings to store and push, incidents to tell."""

    at: float
    findings: list[tuple[Change, Finding]]
    incidents: list[tuple[Change, Incident]]


LOG_MAX = 100_000  # rows a recording book holds until taken (LiveBooks takes them each tick)


class LogRow(NamedTuple):
    """One row of a book's history: a finding as it became at moment ``at``, or (``id`` "",
    ``finding`` None) a marker that the book judged moment ``at`` with some finding active
    or changed (every active finding was seen then)."""

    at: float
    id: str
    finding: Finding | None


def _gist(f: Finding) -> tuple:
    """What makes a finding worth pushing and storing again: what a reader acts on, not its
    last_seen nor the measurements in its evidence that move every moment. The ranks named
    as its victims count: a crash's victims' errors arrive after the crash, and the stored
    finding must name them too (a restarted server, another process of a cluster, an
    evicted job read it from the store)."""
    return (f["active"], f["severity"], f["summary"], f["ranks"], f["hint"],
            tuple((f["evidence"] or {}).get("victims") or ()))


class Book:
    """One job's findings and incidents over time.

    Args:
        settings: the rules' settings; ``settings.diagnose_every`` is the grid.
        known: findings stored by an earlier run of the server (live, after a restart):
            kept as they are, and their incidents are not news.
    """

    def __init__(self, settings: Settings = Settings(), known: Iterable[Finding] = ()):
        self.settings = settings
        self._findings: dict[str, Finding] = {f["id"]: dict(f) for f in known}
        # incident id -> (active, severity) when last told
        self._told: dict[str, tuple[bool, str]] = {
            i["id"]: (i["active"], i["severity"]) for i in incidents(self._findings.values())}
        self.active_incidents = active_count(incidents(self._findings.values()))
        self.ticked: int | None = None  # index k of the last grid moment judged
        self._applied = -1  # state.applied at the last diagnosis
        self.diagnosed = 0  # moments judged (what building the book cost)
        # What the book recorded since last taken (:meth:`record`): None while not asked
        self._log: list[LogRow] | None = None

    # -- reading -----------------------------------------------------------------------------

    def findings(self) -> list[Finding]:
        """Every finding since the book began, newest first (copies: the book changes its
        own in place, and the live feed compares what it sent with what it is given)."""
        return sorted((dict(f) for f in self._findings.values()),
                      key=lambda f: (-f["first_seen"], f["id"]))

    def incidents(self) -> list[Incident]:
        """Every incident (findings grouped by root cause), newest first."""
        return incidents(self._findings.values())

    def moment(self, k: int) -> float:
        return k * self.settings.diagnose_every

    @property
    def judged_through(self) -> float | None:
        """The last grid moment judged (None before the first)."""
        return None if self.ticked is None else self.moment(self.ticked)

    def settled(self, state: JobState) -> bool:
        """Whether an ended job's findings can no longer change: diagnosed since its last
        event, late enough that no grace period of the rules was still running."""
        return state.status in ENDED and self._applied == state.applied and \
            self.ticked is not None and \
            self.moment(self.ticked) >= (state.last_event_at or 0.0) + \
            self.settings.reconnect_grace

    def keep(self, known: Iterable[Finding]) -> None:
        """Add findings stored by an earlier run that this book does not hold (resolved:
        the log no longer shows them); what is in the book now is nobody's news."""
        for f in known:
            if f["id"] not in self._findings:
                self._findings[f["id"]] = {**f, "active": False}
        found = self.incidents()
        self._told = {i["id"]: (i["active"], i["severity"]) for i in found}
        self.active_incidents = active_count(found)

    # -- its history (the stored book log, see timeline.BookLog) -----------------------------

    def record(self) -> None:
        """Keep what the book concludes from now on, for :meth:`take_log`: the findings it
        holds when it begins (at the moment it has judged through), then at each moment it
        judges the findings that changed and, when any changed or is active, a marker of the
        moment (see dashboard.diagnosis.timeline's ``BookLog``)."""
        if self._log is None:
            self._log, self._since, self._since_taken = [], None, False
            self._begin_log()

    def _begin_log(self) -> None:
        if self._log is not None and self._since is None and self.ticked is not None:
            self._since = self.judged_through
            self._log[:0] = [LogRow(self._since, fid, f) for fid, f in self._findings.items()]

    def take_log(self) -> tuple[float | None, list[LogRow]] | None:
        """What was recorded since the last call, led (the first time only) by the moment
        the record begins: (since or None, rows); None while nothing is recorded (not
        asked, not started, or more than LOG_MAX rows were left untaken: the record stops)."""
        if self._log is None or self._since is None:
            return None
        since = None if self._since_taken else self._since
        self._since_taken = True
        out, self._log = self._log, []
        return since, out

    def stop_recording(self) -> None:
        self._log = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_log": None}  # a stored or copied book records nothing

    def __setstate__(self, data: dict[str, Any]) -> None:
        self.__dict__.update({"_log": None, **data})

    # -- ticking -----------------------------------------------------------------------------

    def start(self, at: float) -> None:
        """Begin the grid at ``at`` (the first event's arrival, or now for a book opened
        on a job already under way): moments up to it are not judged."""
        if self.ticked is None:
            self.ticked = math.floor(at / self.settings.diagnose_every)
            self._begin_log()

    def tick_before(self, state: JobState, limit: float) -> list[Changes]:
        """Judge every due moment strictly before ``limit`` (an event received at ``limit``
        is about to be folded, so ``state`` is the state at each of them)."""
        return self._tick(state, math.ceil(limit / self.settings.diagnose_every) - 1)

    def tick_through(self, state: JobState, limit: float) -> list[Changes]:
        """Judge every due moment up to ``limit`` included (no event received by then is
        missing from ``state``)."""
        return self._tick(state, math.floor(limit / self.settings.diagnose_every))

    def _tick(self, state: JobState, last: int) -> list[Changes]:
        if self.ticked is None:
            self.start(self.moment(last))
            return []
        out = []
        stride = self._stride(state)
        while self.ticked < last:
            if self.settled(state):  # nothing can change until the next event
                self.ticked = last
                break
            self.ticked += 1
            if self.ticked % stride:
                continue  # a big job: only the moments of its coarser grid are judged
            changes = self.update(state, self.moment(self.ticked))
            if changes.findings or changes.incidents:
                out.append(changes)
        return out

    def due(self, state: JobState, limit: float) -> int:
        """How many moments ``tick_through(state, limit)`` would judge, at most (an ended
        job's stop once it settles): what catching up costs."""
        if self.ticked is None:
            return 0
        every = self.settings.diagnose_every
        last = math.floor(limit / every)
        if state.status in ENDED and state.last_event_at is not None:
            last = min(last, math.ceil((state.last_event_at + self.settings.reconnect_grace)
                                       / every) + 1)
        return max(0, last - self.ticked) // self._stride(state)

    def _stride(self, state: JobState) -> int:
        """Judge every this many moments of the grid: 1, or coarser for a big job."""
        s = self.settings
        ranks = len(state.rank_index())
        if ranks <= s.large_job_ranks:
            return 1
        every = s.large_job_every if ranks <= s.huge_job_ranks else s.huge_job_every
        return max(1, round(every / s.diagnose_every))

    def update(self, state: JobState, now: float) -> Changes:
        """Fold the diagnosis at ``now`` into the book; returns what changed.

        Called by the tick methods on grid moments; callable directly at any moment (then
        the times are those of the moments it was called at)."""
        book = self._findings
        before = {fid: (f["active"], f["severity"], f["ranks"], _gist(f))
                  for fid, f in book.items()}
        current = {f["id"]: f for f in diagnose(state, now, self.settings)}
        for fid, f in current.items():
            old = book.get(fid)
            if old is not None:
                f["first_seen"] = min(f["first_seen"], old["first_seen"])
            book[fid] = f
        for fid, f in book.items():
            if fid not in current and f["active"]:
                book[fid] = {**f, "active": False}
        self._applied = state.applied
        self.diagnosed += 1
        found: list[tuple[Change, Finding]] = []
        for fid, f in book.items():
            was = before.get(fid)
            if was is not None and was[3] == _gist(f):
                continue
            if was is None or (f["active"] and not was[0]):
                change = Change.NEW
            elif not f["active"]:
                change = Change.RESOLVED
            elif (f["severity"], f["ranks"]) != (was[1], was[2]):
                change = Change.CHANGED
            else:
                change = Change.UPDATED
            found.append((change, f))
        if self._log is not None:
            self._log.extend(LogRow(now, f["id"], f) for _, f in found)
            if found or any(f["active"] for f in book.values()):
                self._log.append(LogRow(now, "", None))  # judged here: bumps last_seen
            if len(self._log) > LOG_MAX:
                self._log = None  # nobody takes it: the stored log ends where it was taken
        told = self._track_incidents() if found else []
        return Changes(now, found, told)

    def _track_incidents(self) -> list[tuple[Change, Incident]]:
        """Incidents that appeared, resolved, or turned critical since they were last told."""
        found = self.incidents()
        self.active_incidents = active_count(found)
        known = self._told
        out = []
        for inc in found:
            was = known.get(inc["id"])
            now = known[inc["id"]] = (inc["active"], inc["severity"])
            if was is None:
                event = Change.NEW if inc["active"] else None
            elif was[0] != now[0]:
                event = Change.NEW if inc["active"] else Change.RESOLVED
            elif inc["active"] and inc["severity"] == Severity.CRITICAL != was[1]:
                event = Change.ESCALATED
            else:
                event = None
            if event is not None:
                out.append((event, inc))
        for iid in set(known) - {i["id"] for i in found}:
            # merged into another incident (a hang that turned out to be a crash): over
            del known[iid]
        return out


def copy_book(book: Book) -> Book:
    """A copy whose own changes leave ``book`` alone (findings are replaced, not edited)."""
    other = Book.__new__(Book)
    other.__dict__.update(book.__dict__)
    other._findings = dict(book._findings)
    other._log = None
    other._told = dict(book._told)
    return other


def with_grid(settings: Settings, step: float) -> Settings:
    """``settings`` ticked every ``step`` seconds instead (``pgdash replay --step``)."""
    return dataclasses.replace(settings, diagnose_every=step)
