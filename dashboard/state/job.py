"""JobState: the derived state of one job, a pure fold over its event log.

No Flask, no SQL, no clock: ``apply`` takes stored events in log order, and everything the API
and the page show is computed from what was applied. Live mode and replay feed the same events,
so they see the same state. The data and one handler per event kind are the Fold's
(dashboard.state.fold); JobState adds the small read surface (ranks, groups, the job's and
attempts' status, per-group indexes). The rows the API and the page show, and the display
states judged at a moment, are in dashboard.web.views.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Hashable

from dashboard.state.fold import Fold
from dashboard.state.latency import LatencyStats
from dashboard.state.records import RankState, rank_row, status_of

MEMO_ENTRIES = 16  # JobState.memo()'s keys, at most


class JobState(Fold):
    """Everything known about one job after the events applied so far, and what is asked of
    it."""

    def ranks(self) -> list[RankState]:
        """One entry per rank: the latest session that claimed it, in rank order."""
        return list(self.rank_index().values())

    def rank_index(self) -> dict[int, RankState]:
        """Rank -> the latest session of the current attempt that claimed it, in rank order
        (read-only). Earlier attempts' ranks are history (see attempt_rows), not diagnosed.

        Which session holds a rank changes only with the events that may change the summary,
        so it is remembered likewise: diagnosis asks once per group, hundreds of times.
        """
        memo = self._ranks_memo
        if memo is not None and memo[0] == self._summary_version:
            return memo[1]
        index = self._ranks_of(self.attempt)
        self._ranks_memo = (self._summary_version, index)
        return index

    def _ranks_of(self, attempt: int) -> dict[int, RankState]:
        by_rank: dict[int, RankState] = {}
        for r in self.sessions.values():
            if r.rank is not None and r.attempt == attempt:
                by_rank[r.rank] = r
        return {k: by_rank[k] for k in sorted(by_rank)}

    @property
    def world_size(self) -> int | None:
        return self.summary()["world_size"]

    @property
    def backend(self) -> str | None:
        return self.summary()["backend"]

    @property
    def status(self) -> str:
        return self.summary()["status"]

    @property
    def ended_at(self) -> float | None:
        return self.summary()["ended_at"]

    def summary(self) -> dict[str, Any]:
        """The job as /api/jobs lists it; the properties above read it.

        World size and backend are what most ranks say; how the job was launched (command,
        launcher, launcher_id) is what rank 0 of the current attempt said, else the first
        session of it that said it; ``attempt`` is the current attempt. Ingest asks before
        and after every batch, so at 1,024 ranks it is one pass over the sessions, remembered
        until an event that may change it is applied (not the routine heartbeats and
        summaries of a running job: see ROUTINE_KINDS).
        """
        memo = self._summary_memo
        if memo is not None and memo[0] == self._summary_version:
            return dict(memo[1])
        by_rank = self.rank_index()
        sizes: dict[int, int] = {}
        backends: dict[str, int] = {}
        for r in self.sessions.values():
            if r.attempt != self.attempt:
                continue
            if r.world_size:
                sizes[r.world_size] = sizes.get(r.world_size, 0) + 1
            if r.backend:
                backends[r.backend] = backends.get(r.backend, 0) + 1
        world_size = max(sizes, key=sizes.get) if sizes else None  # first of the most common
        backend = max(backends, key=backends.get) if backends else None
        status, ended_at = status_of(by_rank, world_size, self.last_event_at)
        launched = by_rank.get(0)
        if launched is None or launched.launcher is None:
            launched = next((r for r in self.sessions.values()
                             if r.attempt == self.attempt and r.launcher is not None), None)
        summary = {"id": self.job_id, "name": self.name, "status": status,
                   "world_size": world_size, "backend": backend,
                   "started_at": self.started_at, "ended_at": ended_at,
                   "attempt": self.attempt,
                   **{key: getattr(launched, key, None)
                      for key in ("command", "launcher", "launcher_id")}}
        self._summary_memo = (self._summary_version, summary)
        return dict(summary)

    def attempt_rows(self) -> list[dict[str, Any]]:
        """Each attempt of the job (torchrun restarts it after a failure), oldest first:
        when it started and ended, how it ended, and its ranks. An earlier attempt that never
        ended by itself was ended by the restart: it failed."""
        rows = []
        for attempt in sorted({r.attempt for r in self.sessions.values()} | {self.attempt}):
            ranks = self._ranks_of(attempt)
            members = [r for r in self.sessions.values() if r.attempt == attempt]
            sizes = collections.Counter(r.world_size for r in members if r.world_size)
            world_size = sizes.most_common(1)[0][0] if sizes else None
            status, ended_at = status_of(ranks, world_size, self.last_event_at)
            if attempt < self.attempt:
                following = min(a for a in self.attempt_started if a > attempt)
                if status not in ("finished", "failed"):
                    status, ended_at = "failed", self.attempt_started[following]
            starts = [r.first_seen for r in members if r.first_seen is not None]
            rows.append({"attempt": attempt, "started_at": min(starts) if starts else None,
                         "ended_at": ended_at, "status": status, "world_size": world_size,
                         "ranks": [rank_row(r) for r in ranks.values()]})
        return rows

    def current_init(self) -> dict[str, dict[str, Any]]:
        """Session -> rendezvous timeline, for the sessions of the current attempt."""
        return {session: entry for session, entry in self.init.items()
                if self.sessions[session].attempt == self.attempt}

    def op_stats(self, families: dict[str, str] | None = None
                 ) -> dict[tuple[str, str, str], tuple[LatencyStats, set[str], set[int]]]:
        """(family, op, source) -> (every rank's statistics merged, its groups, its ranks)."""
        families = self.families() if families is None else families
        table = self.collectives
        labels = [(families.get(g, g), o, src) for g, o, _rk, src in table.keys()]
        merged = table.merged(labels)
        members: dict[tuple[str, str, str], tuple[set[str], set[int]]] = {
            label: (set(), set()) for label in merged}
        for label, (g, _o, rk, _src) in zip(labels, table.keys()):
            groups, ranks = members[label]
            groups.add(g)
            ranks.add(rk)
        return {label: (stats, *members[label]) for label, stats in merged.items()}

    def families(self) -> dict[str, str]:
        """Group name -> its family: the description it shares with others, else its name."""
        return dict(self.family_of)

    def last_error(self, rank: int) -> dict[str, Any] | None:
        """The latest error of that rank in the current attempt."""
        return next((e for e in reversed(self.errors) if e.get("rank") == rank
                     and e.get("attempt", 0) == self.attempt), None)

    def progress_of(self, group: str) -> dict[int, dict[str, Any]]:
        """Progress rows of one group by rank (read-only; indexed once per state version)."""
        return self.grouped("progress").get(group, {})

    def fr_tallies_of(self, group: str) -> dict[int, collections.deque]:
        """Flight Recorder busy tallies of one group by rank (read-only, indexed likewise)."""
        return self.grouped("fr_tallies").get(group, {})

    def flight_only(self, group: str) -> bool:
        """Whether the group's collectives were seen only by the Flight Recorder (DDP's, in
        C++), not by the agent's Python wrappers."""
        rows = self.progress_of(group).values()
        return not any(row["entered"] for row in rows) and any(
            row.get("fr_enqueued") for row in rows)

    def grouped(self, table: str) -> dict[str, dict[int, Any]]:
        """One of the per (group, rank) tables (``progress``, ``fr_tallies``) as
        group -> rank -> value (read-only; indexed once per state version)."""
        # Diagnosis asks per group for hundreds of groups at 1,024 ranks: one pass, not one
        # per group.
        def build() -> dict[str, dict[int, Any]]:
            grouped: dict[str, dict[int, Any]] = collections.defaultdict(dict)
            for (group, rank), value in getattr(self, table).items():
                grouped[group][rank] = value
            return grouped

        return self.memo(("grouped", table), build)

    def memo(self, key: Hashable, build: Callable[[], Any], at: Any = None) -> Any:
        """``build()``, remembered until the next event is applied (for read-only indexes
        that views and diagnosis would otherwise rebuild per group); with ``at`` (a moment),
        for that ``at`` only: a key holds one, its latest (a quiet job is judged at ever new
        moments, and a 1,024-rank job's windows are ~10 MB)."""
        if len(self._memo) >= MEMO_ENTRIES:
            self._memo.clear()
        held = self._memo.get(key)
        if held is None or held[0] != at:
            held = self._memo[key] = (at, build())
        return held[1]

    def claims(self, rank: int | None, session: str, attempt: int = 0) -> bool:
        """Whether another session of that attempt already holds ``rank`` in this job."""
        if rank is None:
            return False
        return any(r.rank == rank and s != session and r.attempt == attempt
                   for s, r in self.sessions.items())
