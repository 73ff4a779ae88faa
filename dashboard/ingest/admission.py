"""Admission: who may send into which job. The token, job and attempt assignment, and which
of an agent's events are new (de-duplication of resends, holds after a refused batch).

Ingest asks; this module decides. It runs on the store's writer thread where it touches the
log (``assign``, ``fresh``/``stored``), so assignment and de-duplication follow the log's
order. No Flask.
"""

from __future__ import annotations

import collections
import hmac
import time
from typing import Any, Callable

from pgdash_agent.wire import Ack, Auth, WireError, validate_auth

from dashboard.statuses import ENDED
from dashboard.ingest.guard import LoginGuard
from dashboard.state import JobState
from dashboard.storage.store import Store


class Refused(Exception):
    """An agent may not connect; the text tells its user what to do."""


class Admission:
    """Agent sessions and the jobs they belong to.

    Args:
        store: the database.
        token: when set, agents must present it (``PGDASH_TOKEN``).
        clock: wall clock (injected for tests).
        counters: Ingest's counters (refusals, held batches).
        state: a job's folded state by id (the state cache), to tell whether a new session
            joins the latest launch under its job name.
        created: told of each job created, with its empty state.
    """

    # A batch refused with retry=True (rate limit, failed write) leaves a gap in the session's
    # sequence. Storing a later batch first would raise the session's highest stored seq past
    # the gap, and the resent batch would then be dropped as a duplicate: lost although the
    # agent resent it. So later batches are refused too until the gap is resent, for at most
    # HOLD_S seconds (an agent that had to drop the gap's events must not be blocked forever).
    HOLD_S = 30.0

    def __init__(self, store: Store, token: str | None, clock: Callable[[], float],
                 counters: collections.Counter[str],
                 state: Callable[[int], JobState | None],
                 created: Callable[[int, JobState], None], guard: LoginGuard | None = None):
        self.store, self.token, self.clock, self.counters = store, token, clock, counters
        self.guard = guard  # failed token attempts per address, shared with the HTTP side
        self._state, self._created = state, created
        self._max_seq: dict[str, int] = {}
        self._session_jobs: dict[str, int] = {}
        self._holds: dict[str, tuple[int, float]] = {}  # session -> (first seq, until)

    def start(self) -> None:
        self._max_seq = self.store.sessions.max_seqs()

    def reset(self) -> None:
        """After a failed write: trust the log again."""
        self._session_jobs.clear()
        self._max_seq = self.store.sessions.max_seqs()

    def check(self, auth: Any, address: str | None = None) -> Auth:
        """The agent's validated hello, from client ``address`` (counted against token
        guessing, as the HTTP side counts logins: dashboard.ingest.guard).

        Raises:
            Refused: bad token or malformed auth (the message says what to fix).
        """
        try:
            auth = validate_auth(auth)
        except WireError as exc:
            self.counters["refused_connections"] += 1
            raise Refused(f"pgdash refused the agent: {exc}") from None
        offered = auth.get("token") or ""
        guard = self.guard if self.token and address is not None else None
        if guard is not None and (wait := guard.retry_after(address)) > 0:
            self.counters["refused_connections"] += 1  # before the check: a right guess
            raise Refused(f"pgdash refused the agent: {guard.message(address, wait)}")
        if self.token and not hmac.compare_digest(  # constant time: no timing oracle
                self.token.encode("utf-8"), offered.encode("utf-8", "surrogatepass")):
            self.counters["refused_connections"] += 1
            if guard is not None and offered:  # a missing token is no guess
                guard.failed(address)
            raise Refused("pgdash refused the agent: wrong or missing token; set PGDASH_TOKEN "
                          "on the training hosts to the server's --token")
        return auth

    def job_of(self, session: str) -> int | None:
        return self._session_jobs.get(session)

    def assign(self, conn, auth: Auth) -> int:
        """Writer thread: the job this session belongs to, creating it if needed."""
        session = auth["session"]
        # The agent resends from what it was acknowledged, possibly by another server
        # process: dedupe against what the log holds for it, not what this process saw.
        self._max_seq[session] = max(self._max_seq.get(session, 0),
                                     self.store.sessions.max_seq(conn, session))
        known = self._session_jobs.get(session)
        if known is None:
            self.store.jobs.lock_name(conn, auth["job"])
            row = self.store.sessions.find(conn, session)
            known = row["job_id"] if row else None
        if known is None:
            now = self.clock()
            latest = self.store.jobs.latest_named(conn, auth["job"])
            state = self._state(latest["id"]) if latest else None
            if state is not None and joins(state, auth.get("rank"), session,
                                           auth.get("attempt") or 0):
                known = latest["id"]
            else:  # first launch under this name, or a new launch reusing it
                known = self.store.jobs.create(conn, auth["job"], now)
                self._created(known, JobState(known, auth["job"]))
            self.store.sessions.create(conn, session, known, auth.get("rank"),
                                       auth.get("host"), auth.get("pid"), now)
        self._session_jobs[session] = known
        return known

    # -- de-duplication ----------------------------------------------------------------------

    def fresh(self, session: str,
              evs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
        """Writer thread: the events not stored yet (server events, seq None, always are),
        and the session's highest seq once they are."""
        last = self._max_seq.get(session, 0)
        fresh = []
        for ev in evs:
            seq = ev.get("seq")
            if seq is None:
                fresh.append(ev)
            elif seq > last:
                fresh.append(ev)
                last = seq
        return fresh, last

    def stored(self, session: str, last: int) -> None:
        """Writer thread: the session's events up to ``last`` are in the log."""
        self._max_seq[session] = last

    # -- holds -------------------------------------------------------------------------------

    def hold(self, session: str, events: Any, quiet_s: float = 0.0) -> None:
        """Refuse (retry) batches of ``session`` that start past this refused one's first seq;
        ``quiet_s``: how long its agent was told to wait before sending it again."""
        first = first_seq(events)
        if first is not None:
            now = time.monotonic()
            held = self._holds.get(session)
            if held is None or first < held[0]:
                self._holds[session] = (first, now + self.HOLD_S, now + quiet_s)
            elif now + quiet_s > held[2]:
                self._holds[session] = (held[0], held[1], now + quiet_s)

    def release(self, session: str) -> None:
        """A batch of the session committed: the gap, if any, is filled."""
        self._holds.pop(session, None)

    def held_back(self, session: str, events: Any) -> Ack | None:
        """The refusal of a batch that must wait for an earlier one, or None. It asks for the
        rest of the wait the earlier refusal asked for: an agent that took a shorter wait
        from it sent everything again at once, into a server that had just said it was full
        (21,488 retries in 150 s at 1,024 ranks, bench/capacity.py)."""
        held = self._holds.get(session)
        if held is None:
            return None
        first = first_seq(events)
        now = time.monotonic()
        if first is None or first <= held[0] or now > held[1]:
            return None
        self.counters["held_batches"] += 1
        return {"ok": False, "retry": True, "retry_after": round(max(0.1, held[2] - now), 1),
                "error": f"an earlier batch (from seq {held[0]}) was not stored yet; "
                         "send it again first"}


def first_seq(events: Any) -> int | None:
    """The lowest seq in a batch, if it has a readable one (the batch is not validated yet)."""
    try:
        seqs = [ev["seq"] for ev in events]
        return min(s for s in seqs if isinstance(s, int) and not isinstance(s, bool))
    except (TypeError, KeyError, ValueError):
        return None


def joins(state: JobState, rank: int | None, session: str, attempt: int = 0) -> bool:
    """Whether a new agent session with this rank belongs to the job's current launch.

    A later attempt (torchrun restarted the job after a failure) is the same job, even ended.
    An earlier attempt than the job's, or a rank number already held by another session of
    the same attempt, means a new launch reusing the name. A known rank joins even an ended
    job: a rank whose agent connects late (a fast job, a slow link) must not split the launch
    in two. An unknown rank joins only a job still going.
    """
    if attempt != state.attempt:
        return attempt > state.attempt
    if state.claims(rank, session, attempt):
        return False
    return rank is not None or state.status not in ENDED
