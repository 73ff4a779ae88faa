"""What a server says on its console: each incident as it opens, turns critical or resolves
(``pgdash serve``), and each refused agent once, then a count, instead of a line per retry.

A refused agent reconnects with backoff for as long as it runs (``PGDASH_RECONNECT_MAX_S``,
10 s), so one wrong ``PGDASH_TOKEN`` on a node would otherwise print the same line every few
seconds per rank. :class:`RefusalLog` prints the first refusal of each agent session with its
reason, then at most one line per ``PGDASH_REFUSAL_REPORT_S`` with the number of refusals since,
and a last one when the server stops.
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time
from typing import Any, Callable

log = logging.getLogger("pgdash.console")

# What an incident event is called on the console (dashboard.diagnosis.book.Change values).
OPENED, ESCALATED, RESOLVED = "new", "escalated", "resolved"
WORDS = {OPENED: "opened", ESCALATED: "now critical", RESOLVED: "resolved"}

REFUSED_PREFIX = "pgdash refused the agent: "  # how dashboard.ingest.admission words a refusal


def stamp(at: float) -> str:
    """The local time a console line starts with."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def incident_line(event: str, job: dict[str, Any], incident: dict[str, Any],
                  at: float) -> str:
    """One incident event as one line, like ``pgdash demo`` prints them: time, job, what
    happened, severity and class (with the kind of its root-cause finding), the ranks at
    fault, the summary; the next step where it opens."""
    cls = incident["id"].split(":", 1)[0]
    kind = cls if cls == incident["kind"] else f"{cls} ({incident['kind']})"
    ranks = incident.get("ranks") or []
    fault = (f", at fault: rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
             if ranks else "")
    name = job.get("name") or "?"
    line = (f"{stamp(at)} pgdash: job {name} "
            f"(id {job.get('id')}): incident {WORDS.get(event, event)}: "
            f"{incident['severity'].upper()} {kind}{fault}: {incident['summary']}")
    if event != RESOLVED and incident.get("hint"):
        line += f" Next step: {incident['hint']}"
    return one_line(line)


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines from a rank's error text, a job
    name) made one space: a console line is one line."""
    return " ".join(text.split())


class IncidentLog:
    """``on_incident`` listener that logs each incident event as :func:`incident_line`.

    Args:
        emit: where a line goes (default: the ``pgdash.console`` logger, at warning level
            for opened and escalated incidents, info for resolved ones).
        clock: wall clock for the line's time (injected for tests).
    """

    def __init__(self, emit: Callable[[str, str], None] | None = None,
                 clock: Callable[[], float] = time.time):
        self._emit = emit or _log_incident
        self._clock = clock

    def __call__(self, event: str, job: dict[str, Any], incident: dict[str, Any]) -> None:
        self._emit(event, incident_line(event, job, incident, self._clock()))


def _log_incident(event: str, line: str) -> None:
    log.log(logging.INFO if event == RESOLVED else logging.WARNING, "%s", line)


def listeners(*funcs: Callable[..., Any] | None) -> Callable[..., None] | None:
    """One ``on_incident`` callable that tells each of ``funcs`` (None ones left out) in
    turn; None when there are none. One listener's exception does not keep the others
    from being told; the first is raised after all were (ingest counts it)."""
    chosen = [f for f in funcs if f is not None]
    if not chosen:
        return None
    if len(chosen) == 1:
        return chosen[0]

    def tell(*args: Any) -> None:
        failed: Exception | None = None
        for f in chosen:
            try:
                f(*args)
            except Exception as exc:
                failed = failed or exc
        if failed is not None:
            raise failed

    return tell


def agent_identity(auth: Any, address: str | None) -> str:
    """Who an agent is, by what its (possibly malformed) hello says; never its token."""
    what, where = [], []
    if isinstance(auth, dict):
        rank, job, host, pid = (auth.get(k) for k in ("rank", "job", "host", "pid"))
        if isinstance(rank, int) and not isinstance(rank, bool):
            what.append(f"of rank {rank}")
        if isinstance(job, str) and job:
            what.append(f"of job {job[:80]!r}")
        if isinstance(host, str) and host:
            where.append(f"host {host[:80]}")
        if isinstance(pid, int) and not isinstance(pid, bool):
            where.append(f"pid {pid}")
    if address:
        where.append(f"from {address}")
    who = "the agent " + " ".join(what) if what else "an agent"
    return f"{who} ({', '.join(where)})" if where else who


def _kind(reason: str) -> str:
    """A reason without its numbers: "try again in 41 s" and "in 40 s" are one reason."""
    return re.sub(r"\d+", "N", reason)


class _Refused:
    __slots__ = ("who", "reason", "last", "reported", "pending")

    def __init__(self, who: str, reason: str, now: float):
        self.who, self.reason = who, reason
        self.last = self.reported = now
        self.pending = 0  # refusals since the last line about this agent


class RefusalLog:
    """Logs refused agents: the first refusal of each agent session with its reason, then at
    most one line per ``every_s`` counting the refusals since (with the reason, when it
    changed: a wrong token that turned into "too many failed attempts").

    Args:
        every_s: least seconds between two count lines of one agent
            (``PGDASH_REFUSAL_REPORT_S``); an agent refused for none of that long is
            forgotten once counted.
        max_agents: agents remembered at once (``PGDASH_REFUSAL_MAX_AGENTS``); past it the
            oldest is reported and forgotten (and counted: ``forgotten``).
        emit: where a line goes (default: the ``pgdash.console`` logger, warning level).
        clock: monotonic seconds (injected for tests).
        wall: wall-clock seconds, for the time a line starts with (injected for tests).
    """

    def __init__(self, every_s: float = 60.0, max_agents: int = 1024,
                 emit: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        if not every_s > 0:
            raise ValueError(f"PGDASH_REFUSAL_REPORT_S must be a positive number of seconds, "
                             f"got {every_s!r:.40}")
        if max_agents < 1:
            raise ValueError(f"PGDASH_REFUSAL_MAX_AGENTS must be a positive integer, got "
                             f"{max_agents!r:.40}")
        self.every_s = every_s
        self.max_agents = max_agents
        self._emit = emit or (lambda line: log.warning("%s", line))
        self._clock, self._wall = clock, wall
        self._agents: collections.OrderedDict[Any, _Refused] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.counters: collections.Counter[str] = collections.Counter()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def refused(self, auth: Any, address: str | None, message: str) -> None:
        """One refusal of the agent whose hello was ``auth``, from ``address``, told
        ``message`` (as dashboard.ingest.admission words it)."""
        reason = message[len(REFUSED_PREFIX):] if message.startswith(REFUSED_PREFIX) else message
        session = auth.get("session") if isinstance(auth, dict) else None
        kind = _kind(reason)
        key = session if isinstance(session, str) and session else ("?", address, kind)
        lines = []
        with self._lock:
            now = self._clock()
            self.counters["refusals"] += 1
            known = self._agents.get(key)
            if known is None:
                who = agent_identity(auth, address)
                self._agents[key] = _Refused(who, reason, now)
                lines.append(f"{stamp(self._wall())} pgdash: refused {who}: {reason} "
                             f"(further refusals of it are "
                             f"counted: one line per {self.every_s:g} s at most)")
                while len(self._agents) > self.max_agents:
                    _, oldest = self._agents.popitem(last=False)
                    self.counters["forgotten"] += 1
                    if oldest.pending:
                        lines.append(self._count_line(oldest, now))
            else:
                known.pending += 1
                known.last = now
                changed = _kind(known.reason) != kind
                known.reason = reason
                self._agents.move_to_end(key)
                if changed or now - known.reported >= self.every_s:
                    lines.append(self._count_line(known, now, changed))
        for line in lines:
            self._emit(one_line(line))
        self._start()

    def _count_line(self, agent: _Refused, now: float, changed: bool = False) -> str:
        """The line that reports an agent's pending refusals (lock held); resets them."""
        n, agent.pending, agent.reported = agent.pending, 0, now
        why = f"; now: {agent.reason}" if changed else ""
        return (f"{stamp(self._wall())} pgdash: refused {agent.who} {n} time"
                f"{'s' if n != 1 else ''} more (the last one {now - agent.last:.0f} s ago){why}")

    def tick(self) -> None:
        """Report the pending counts that are due; forget agents quiet for ``every_s``."""
        lines = []
        with self._lock:
            now = self._clock()
            for key, agent in list(self._agents.items()):
                if agent.pending and now - agent.reported >= self.every_s:
                    lines.append(self._count_line(agent, now))
                elif not agent.pending and now - agent.last >= self.every_s:
                    del self._agents[key]
        for line in lines:
            self._emit(one_line(line))

    def close(self) -> None:
        """Stop the timer and report every pending count (the server is stopping)."""
        self._stop.set()
        lines = []
        with self._lock:
            now = self._clock()
            for agent in self._agents.values():
                if agent.pending:
                    lines.append(self._count_line(agent, now))
            self._agents.clear()
        for line in lines:
            self._emit(one_line(line))

    def _start(self) -> None:
        """The timer, started with the first refusal (most servers never refuse anyone)."""
        if self._thread is not None or self._stop.is_set():
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pgdash-refusals",
                                                daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.every_s / 4)):
            self.tick()
