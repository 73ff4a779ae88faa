"""The server's questions to agents: snapshots of ranks, asked on the connections they hold.

Each connected agent's connection registers a ``send`` here (the v2 front's AgentLink, the v1
Socket.IO namespace); :meth:`Asks.request` sends ``{"ask", "what": "snapshot", "at",
"reason"}`` (``pgdash_agent.wire.ASK_EVENT``) to the sessions of the ranks asked, and remembers
the request (which ranks, which were not connected, when) so that the answers, which arrive as
``snapshot`` events in the agents' streams and are folded like any other
(``JobState.snapshots``), can be read against it. Requests are bounded per job and rate-limited:
a flood of requests costs the agents nothing beyond one answer per rank and interval.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
import uuid
from typing import Any, Callable

from dashboard.statuses import RankStatus

ENDED = (RankStatus.EXITED, RankStatus.FAILED)  # a rank whose exit the server has folded

MAX_REQUESTS = 32  # requests remembered per job (the answers are in the log regardless)
MAX_JOBS = 256  # jobs whose requests are remembered, the most recently asked
MIN_INTERVAL_S = 1.0  # between two requests of one job that ask the same rank
ANSWER_WAIT_S = 5.0  # after this long, a rank that has not answered "did not answer"
VICTIMS = 3  # ranks snapshotted with an incident beside the blamed ones
AUTO_EVERY_S = 10.0  # at most one request with an incident per job this often
MAX_AUTO_LAG_S = 2.0  # no request with an incident while ingest is this far behind
MAX_RANKS_WHEN_BEHIND = 64  # ranks one request may ask meanwhile
READ_WAIT_S = 5.0  # a request waits this long for the job's state, then says the server is busy
MAX_REMEMBERED = 65_536  # (job, rank) ask times kept for the rate limit before pruning
# Answers read as they arrive, before the writer has stored and folded them (all requests
# together, the newest kept): a request's view shows them at once, not after the backlog.
MAX_EARLY = 256
# A rank asked here that has not answered this long after the request is read from outside
# by a rank of its host whose agent did answer (wire.ASKS "peer"; its own interpreter may be
# blocked in C with the GIL held), this many such ranks a request at most.
PEER_AFTER_S = 3.0
MAX_PEER_ASKS = 8
# Clustered, a rank asked through another process whose agent's events are timed this long
# after the request (its own clock: a heartbeat a second) was heard since: not silent.
HEARD_MARGIN_S = 1.0


class TooSoon(Exception):
    """A request came less than MIN_INTERVAL_S after the last one for these ranks."""


@dataclasses.dataclass
class Request:
    """One snapshot request: who was asked, who could not be, when and why."""

    id: str
    job_id: int
    asked_at: float
    reason: str
    asked: list[int]  # ranks whose agent was sent the question
    not_connected: list[int]  # ranks not asked: no connection here, or their exit folded
    native: bool = False  # native frames asked for too (py-spy: it pauses each rank briefly)
    relayed: list[int] = dataclasses.field(default_factory=list)  # of asked: through Redis
    # session -> rank, of the ranks asked on a connection this process holds
    sessions: dict[str, int] = dataclasses.field(default_factory=dict, repr=False)
    peers: dict[int, int] = dataclasses.field(default_factory=dict)  # silent rank -> reader
    # silent ranks asked of their host's reader process (peers names the rank that started
    # it), not of another rank's agent
    host_read: set[int] = dataclasses.field(default_factory=set, repr=False)
    # silent rank -> why no rank of its host was asked to read it (ask_peers); "*": all
    unread: dict[int | str, str] = dataclasses.field(default_factory=dict, repr=False)

    def row(self) -> dict[str, Any]:
        return {"id": self.id, "asked_at": self.asked_at, "reason": self.reason,
                "asked": self.asked, "not_connected": self.not_connected,
                "native": self.native, "relayed": self.relayed}


@dataclasses.dataclass(eq=False)
class ReaderLink:
    """A host reader's connection (pgdash_agent.reader): the host and job it reads, the rank
    whose session started it, and the questions it was sent that it has not answered."""

    job_id: int
    host: str
    session: str
    rank: int | None
    pid: int
    send: Callable[[dict[str, Any]], None]
    # (request id, rank) asked of it and not answered, the oldest first (MAX_PEER_ASKS x 4)
    asked: collections.OrderedDict = dataclasses.field(
        default_factory=collections.OrderedDict, repr=False)


class Busy(Exception):
    """Many ranks asked while ingest is behind: their answers would deepen its backlog."""


class UnknownRanks(ValueError):
    """Ranks asked for that the job does not have."""


class Asks:
    """Sessions' ways to be asked, and the requests made of each job.

    Args:
        read: ``read(job_id, view, timeout=None)`` runs ``view(state)`` on the job's live
            JobState (None for an unknown job), raising TimeoutError when the state is not
            free within ``timeout`` seconds: Ingest.read.
        clock: wall clock (the requests' times; injected for tests).
        lag: how far ingest is behind its agents (seconds).
        relay: clustered, ``relay(sessions, message, reader)`` hands a question for agents
            connected to no connection here (or, ``reader`` (job, host), for that host's
            reader) to the other processes (Membership.publish_ask); each delivers it to those
            it holds (:meth:`deliver`). None: one process.
    """

    def __init__(self, read: Callable[[int, Callable[[Any], Any]], Any],
                 clock: Callable[[], float] = time.time,
                 lag: Callable[[], float] = lambda: 0.0,
                 relay: Callable[..., None] | None = None,
                 schedule: Callable[[float, Callable[[], None]], None] | None = None):
        self.read = read
        self.clock = clock
        self.lag = lag
        self.relay = relay
        self.schedule = schedule or _later
        self._auto_at: dict[int, float] = {}  # job -> its last request with an incident
        self._lock = threading.Lock()
        self._links: dict[str, Callable[[dict[str, Any]], None]] = {}
        self._readers: dict[tuple[int, str], list[ReaderLink]] = {}  # (job, host) -> newest last
        # job -> its requests, the jobs asked most recently last (MAX_JOBS of them)
        self._requests: collections.OrderedDict[int, collections.OrderedDict[str, Request]] = \
            collections.OrderedDict()
        self._last_asked: dict[tuple[int, int], float] = {}  # (job, rank) -> when
        # (request id, rank) -> its answer as the fold files it, received, maybe not folded
        self._early: collections.OrderedDict[tuple[str, int], dict[str, Any]] = \
            collections.OrderedDict()
        self.counters = collections.Counter()

    def link(self, session: str, send: Callable[[dict[str, Any]], None]) -> None:
        """``send(message)`` reaches the agent of ``session``; it must not block."""
        with self._lock:
            self._links[session] = send

    def unlink(self, session: str, send: Callable[[dict[str, Any]], None]) -> None:
        """The connection of ``send`` ended (not one the session made since, if any)."""
        with self._lock:
            if self._links.get(session) is send:
                del self._links[session]

    def linked(self, session: str) -> bool:
        return session in self._links

    def link_reader(self, reader: ReaderLink) -> None:
        """A host reader connected: asked for the silent ranks of its host that no other
        rank's agent there can read (:meth:`ask_peers`)."""
        with self._lock:
            self._readers.setdefault((reader.job_id, reader.host), []).append(reader)

    def unlink_reader(self, reader: ReaderLink) -> None:
        with self._lock:
            links = self._readers.get((reader.job_id, reader.host), [])
            if reader in links:
                links.remove(reader)
            if not links:
                self._readers.pop((reader.job_id, reader.host), None)

    def _has_reader(self, job_id: int) -> bool:
        with self._lock:  # (the connections' threads link and unlink meanwhile)
            return any(job == job_id for job, _ in self._readers)

    def readers_connected(self) -> int:
        with self._lock:
            return sum(len(links) for links in self._readers.values())

    def reader_asked(self, reader: ReaderLink, request_id: str, rank: int) -> bool:
        """Whether ``reader`` was asked to read ``rank`` for ``request_id`` (and not answered
        yet): a reading nobody asked for is refused."""
        with self._lock:
            return reader.asked.pop((request_id, rank), None) is not None

    def request(self, job_id: int, ranks: list[int] | None, reason: str,
                force: bool = False, native: bool = False) -> Request | None:
        """Ask the agents of ``ranks`` (None: every rank) of the job's current attempt for a
        snapshot (``native``: with native frames, where py-spy can take them); None when the
        job is unknown.

        Raises:
            UnknownRanks: some of ``ranks`` are not the job's.
            Busy: more than MAX_RANKS_WHEN_BEHIND ranks asked while ingest is behind.
            TooSoon: every rank asked was asked less than MIN_INTERVAL_S ago (unless
                ``force``, which the server's own requests with an incident use).
        """
        try:
            found = self.read(job_id, lambda state: {
                rank: (r.session, r.status) for rank, r in state.rank_index().items()},
                timeout=READ_WAIT_S)
        except TimeoutError:
            # A server far behind its agents holds the job's state for long stretches (it
            # judges the moments it owes): seen at 1,024 ranks, a request waited 60 s.
            self.counters["snapshot_requests_busy"] += 1
            raise Busy(f"the server is catching up with this job's agents (its state was not "
                       f"free for {READ_WAIT_S:g} s): ask again in a few seconds") from None
        if found is None:
            return None
        sessions = {rank: session for rank, (session, _) in found.items()}
        # A rank whose exit is folded is not asked (its connection may outlive it a moment):
        # the answer shows it as gone, with its last stack.
        ended = {rank for rank, (_, status) in found.items() if status in ENDED}
        lag = self.lag()
        if not force and lag > MAX_AUTO_LAG_S and len(ranks if ranks is not None
                                                      else sessions) > MAX_RANKS_WHEN_BEHIND:
            self.counters["snapshot_requests_busy"] += 1
            raise Busy(f"ingest is {lag:.0f} s behind the agents: answers from this many ranks "
                       f"would add to its backlog; ask for the blamed ranks, or at most "
                       f"{MAX_RANKS_WHEN_BEHIND}, until it catches up")
        if ranks is not None:
            unknown = sorted(set(ranks) - set(sessions))
            if unknown:
                raise UnknownRanks(f"job {job_id} has no rank {unknown[0]}"
                                   f"{f' (nor {len(unknown) - 1} more)' if len(unknown) > 1 else ''}"
                                   f": its ranks are 0-{max(sessions)}" if sessions else
                                   f"job {job_id} has no ranks yet")
            sessions = {rank: sessions[rank] for rank in ranks}
        return self._send(job_id, sessions, reason, force, native, ended)

    def on_incident(self, event: str, job: dict[str, Any], incident: dict[str, Any]) -> None:
        """An ``on_incident`` listener: when an incident opens, snapshot its blamed ranks and
        a few of the others (its victims, where everybody waits for the blamed); one that
        blames no rank yet (rules.idle: where each rank stands decides), the first ranks."""
        if event != "new" or (not incident.get("ranks") and incident.get("severity") == "info"):
            return
        # Never a burden on a server that is behind (the answers would come late, and their
        # load could make ranks look silent), nor more than one a job every AUTO_EVERY_S (a
        # burst of incidents, as when a node dies, asks once).
        now = self.clock()
        if self.lag() > MAX_AUTO_LAG_S or now - self._auto_at.get(job["id"], -1e18) < \
                AUTO_EVERY_S:
            self.counters["snapshot_auto_skipped"] += 1
            return
        self._auto_at[job["id"]] = now
        if len(self._auto_at) > MAX_JOBS:
            self._auto_at = {j: t for j, t in self._auto_at.items() if now - t < AUTO_EVERY_S}
        known = self.read(job["id"], lambda state: list(state.rank_index())) or []
        has = set(known)  # the blamed ranks the job has (init_incomplete's never arrived)
        named = incident.get("ranks") or []
        blamed = [rank for rank in named if rank in has][:VICTIMS * 4]
        others = [rank for rank in known if rank not in named][:VICTIMS if named else VICTIMS * 5]
        if blamed or others:
            self.request(job["id"], blamed + others, f"incident {incident['id']}", force=True)

    def _send(self, job_id: int, sessions: dict[int, str], reason: str,
              force: bool, native: bool = False, ended: set[int] = frozenset()) -> Request:
        now = self.clock()
        with self._lock:
            if not force and sessions and all(
                    now - self._last_asked.get((job_id, rank), -1e18) < MIN_INTERVAL_S
                    for rank in sessions):
                self.counters["snapshot_requests_too_soon"] += 1
                raise TooSoon(f"these ranks were asked less than {MIN_INTERVAL_S:g} s ago: "
                              "wait for their answers")
            request = Request(uuid.uuid4().hex[:12], job_id, now, reason, [], [], native)
            sends, elsewhere = [], []
            for rank, session in sorted(sessions.items()):
                send = self._links.get(session)
                if (send is None and self.relay is None) or rank in ended:
                    request.not_connected.append(rank)
                    continue
                request.asked.append(rank)
                self._last_asked[(job_id, rank)] = now
                if send is None:  # another process may hold it: "no answer" if none does
                    request.relayed.append(rank)
                    elsewhere.append(session)
                else:
                    request.sessions[session] = rank
                    sends.append(send)
            if len(self._last_asked) > MAX_REMEMBERED:  # only the last second matters
                self._last_asked = {key: t for key, t in self._last_asked.items()
                                    if now - t < MIN_INTERVAL_S}
            kept = self._requests.setdefault(job_id, collections.OrderedDict())
            self._requests.move_to_end(job_id)
            while len(self._requests) > MAX_JOBS:
                self._requests.popitem(last=False)
            kept[request.id] = request
            while len(kept) > MAX_REQUESTS:
                kept.popitem(last=False)
            self.counters["snapshot_requests"] += 1
        message = {"ask": request.id, "what": "snapshot", "at": now, "reason": reason[:200]}
        if native:
            message["native"] = True
        self._send_all(sends, message)
        # Silent ranks are read from outside later: by a rank of their host that answered,
        # or by a host reader (also where no rank of the job is connected here: a restarted
        # server whose ranks are all blocked hears only from their readers), here or through
        # the processes that hold them.
        if sends or elsewhere or self._has_reader(job_id):
            self.schedule(PEER_AFTER_S, lambda: self.ask_peers(request))
        if elsewhere:
            try:
                self.relay(elsewhere, message)
                self.counters["asks_relayed"] += len(elsewhere)
            except Exception:
                self.counters["asks_failed"] += len(elsewhere)
        return request

    def ask_peers(self, request: Request) -> None:
        """Have each rank asked here that has not answered read from outside by a rank of its
        host whose agent did (MAX_PEER_ASKS at most): a ``peer`` question naming the silent
        rank's pid, answered with py-spy's dump (pgdash_agent.native.peer_dump). Runs on a
        timer's thread PEER_AFTER_S after the request; never raises. Not while ingest is
        behind: answers may then be late, and py-spy would stop a rank that is only slow."""
        if self.lag() > MAX_AUTO_LAG_S:
            self.counters["snapshot_peer_asks_skipped"] += 1
            request.unread["*"] = ("the server was behind its agents, and py-spy would stop "
                                   "a rank that is only slow: nobody was asked to read it")
            return
        request.unread.pop("*", None)
        try:
            early = self.early(request)
            silent = self.read(request.job_id,
                               lambda state: silent_ranks(state, request, early),
                               timeout=READ_WAIT_S)
        except Exception:  # a busy or stopping server: those ranks just read "no answer"
            self.counters["snapshot_peer_asks_failed"] += 1
            return
        sends, relays = [], []
        with self._lock:
            for rank, pid, host, readers in silent or []:
                question = {"ask": request.id, "what": "peer", "pid": pid, "rank": rank,
                            "at": self.clock(), "reason": request.reason[:200]}
                # Another rank's agent of its host that answered, else the host's reader.
                reader = next(((peer, self._links[s]) for peer, s in readers
                               if s in self._links), None)
                host_reader = (self._readers.get((request.job_id, host)) or [None])[-1]
                if reader is None and host_reader is None and self.relay is None:
                    request.unread[rank] = (
                        "no other rank of its host answered (alone there, or all silent), and "
                        "no host reader of it is connected here (pgdash_agent.reader: it needs "
                        "py-spy on the host and protocol v2, and PGDASH_HOST_READER and "
                        "PGDASH_PEER_READ left on), so nobody there could read it"
                        if not readers else
                        "the ranks of its host that answered have disconnected since, and no "
                        "host reader of it is connected here")
                    continue
                if len(sends) + len(relays) >= MAX_PEER_ASKS:
                    request.unread[rank] = (f"only {MAX_PEER_ASKS} silent ranks are read "
                                            "from outside per request")
                    continue
                if reader is None and host_reader is None:
                    # Clustered: through the process that holds the connection of a rank of
                    # its host that answered, else through whichever holds the host's reader.
                    if readers:
                        request.peers[rank] = readers[0][0]
                        relays.append(([readers[0][1]], question, None))
                    else:
                        request.unread[rank] = (
                            "no other rank of its host answered (alone there, or all silent), "
                            "and no host reader of it is connected to this server process: "
                            "the others were asked to have theirs read it (its reading shows "
                            "here if one is connected there)")
                        relays.append(([], question, (request.job_id, host)))
                    continue
                if reader is None:
                    reader = (host_reader.rank, host_reader.send)
                    request.host_read.add(rank)
                    self._reader_asked(host_reader, request.id, rank)
                request.peers[rank] = reader[0]
                sends.append((reader[1], question))
        for send, message in sends:
            self._send_all([send], message)
            self.counters["snapshot_peer_asks"] += 1
        for sessions, message, host_reader in relays:
            try:
                self.relay(sessions, message, host_reader)
                self.counters["snapshot_peer_asks_relayed"] += 1
            except Exception:
                self.counters["asks_failed"] += 1

    @staticmethod
    def _reader_asked(reader: ReaderLink, request_id: str, rank: int) -> None:
        """Lock held: ``reader`` is sent this question (its reading is taken: reader_asked)."""
        reader.asked[(request_id, rank)] = True
        while len(reader.asked) > 4 * MAX_PEER_ASKS:
            reader.asked.popitem(last=False)

    def arrived(self, session: str, job_id: int, events: list[dict[str, Any]]) -> None:
        """Any thread: validated events of ``session`` came in, to be stored and folded
        behind whatever the writer has queued. An answer to a request made here is kept as it
        is, so that the request's view shows it now (:meth:`early`), not after the backlog:
        at 1,024 ranks, ~1.5 s."""
        answers = [ev for ev in events if ev["kind"] == "snapshot"]
        if not answers:
            return
        with self._lock:
            kept = self._requests.get(job_id, {})
            for ev in answers:
                if ev["body"].get("for_rank") is not None:
                    continue  # a reading of another rank: shown once folded
                request = kept.get(ev["body"]["ask"])
                rank = None if request is None else request.sessions.get(session)
                if rank is None:
                    continue  # not asked here, or not of this session
                key = (request.id, rank)
                self._early[key] = dict(ev["body"], t=ev["t"], session=session)
                self._early.move_to_end(key)
                while len(self._early) > MAX_EARLY:
                    self._early.popitem(last=False)

    def early(self, request: Request) -> dict[int, dict[str, Any]]:
        """The answers to ``request`` received here, folded or not yet (rank -> answer)."""
        with self._lock:
            return {rank: answer for (request_id, rank), answer in self._early.items()
                    if request_id == request.id}

    def deliver(self, sessions: list[str], message: dict[str, Any],
                reader: tuple[int, str] | None = None) -> None:
        """A question another process relayed: send it to the agents of ``sessions`` that
        hold a connection here (the others are somebody else's), or to the host reader of
        ``reader`` (job, host) if it is connected here (a ``peer`` question)."""
        with self._lock:
            sends = [self._links[s] for s in sessions if s in self._links]
            link = (self._readers.get(tuple(reader)) or [None])[-1] if reader else None
            if link is not None and message.get("what") == "peer":
                self._reader_asked(link, str(message.get("ask")), message.get("rank"))
                sends.append(link.send)
        self._send_all(sends, message)

    def _send_all(self, sends: list[Callable[[dict[str, Any]], None]],
                  message: dict[str, Any]) -> None:
        for send in sends:
            try:
                send(message)
                self.counters["asks_sent"] += 1
            except Exception:
                self.counters["asks_failed"] += 1

    def requests(self, job_id: int) -> list[Request]:
        """The job's requests remembered here, newest first."""
        with self._lock:
            return list(reversed(self._requests.get(job_id, {}).values()))

    def get(self, job_id: int, request_id: str) -> Request | None:
        with self._lock:
            return self._requests.get(job_id, {}).get(request_id)


__all__ = ["ANSWER_WAIT_S", "Asks", "Busy", "ReaderLink", "Request", "TooSoon", "UnknownRanks"]


def _later(delay: float, call: Callable[[], None]) -> None:
    timer = threading.Timer(delay, call)
    timer.daemon = True
    timer.start()


def silent_ranks(state: Any, request: Request, early: dict[int, dict[str, Any]]
                 ) -> list[tuple[int, int, str, list[tuple[int, str]]]]:
    """The ranks of a request that have not answered, each as (rank, pid, host, [(rank,
    session) of the ranks of its host that answered]): those asked on a connection here, and those
    whose connection is gone while their process may live on (lost: a v1 agent blocked with
    the GIL held cannot answer Socket.IO's pings either), and those asked through another
    process (clustered)."""
    answered = set(state.snapshots.get(request.id, {})) | set(early)
    relayed = set(request.relayed)
    index = state.rank_index()
    by_host: dict[str, list[tuple[int, str]]] = {}
    for rank in sorted(answered):
        r = index.get(rank)
        if r is not None and r.host:
            by_host.setdefault(r.host, []).append((rank, r.session))
    out = []
    for rank in sorted((set(request.sessions.values()) | set(request.not_connected)
                        | relayed) - answered):
        r = index.get(rank)
        if r is None or r.pid is None or r.status not in (RankStatus.RUNNING, RankStatus.LOST):
            continue
        if rank in relayed and r.last_seen > request.asked_at + HEARD_MARGIN_S:
            # Its agent spoke since the question (through another process): alive, and its
            # answer may just not be folded here yet. py-spy would pause it for nothing.
            continue
        out.append((rank, r.pid, r.host, by_host.get(r.host, [])))
    return out
