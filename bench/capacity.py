"""How many ranks does one pgdash server hold? Freshness, acks, CPU and memory per rank.

What runs: a real ``pgdash serve`` process (this repository's, on 127.0.0.1, a fresh SQLite
file), and N simulated agents in one asyncio process speaking the real agent protocol over
real websockets (the ``websockets`` package): ``--wire v1`` is the Socket.IO ``/agent``
namespace every agent up to 0.1 speaks, ``--wire v2`` the compact path beside it
(``pgdash_agent.wire`` ``AGENT_V2_PATH``, MessagePack frames), ``--wire relay`` that path
through a relay per host of ``--per-host`` ranks (8), as the agents' host reader starts it by
default in jobs of 1,024 ranks or more (``pgdash_agent.relay``: one websocket per host, each rank's frames held up to
``HOLD_S`` to travel with its neighbours'; bytes on the wire are then the relay's frames). Each simulated agent sends what
the real agent sends **at its defaults** (``pgdash_agent.config.AgentConfig``, read here, so
the figures follow them): at start hello, the rendezvous and its process groups of a DP x PP x
TP mesh; then, at its own random phase, every heartbeat period (``PGDASH_INTERVAL_S``, 1 s) a
heartbeat (progress per group), a latency summary (``coll_stats``: ``--ops`` rows with
histograms) and a GPU reading, and a latency summary every ``PGDASH_STATS_INTERVAL_S`` (0.5 s)
between (``bench.common.agent_schedule``): about 4.7 kB of JSON per rank-second, what the
agent sends on a GPU host. It sends them as the agent's sender does: through the agent's own
bounded ``Outbox`` (readings wait for the heartbeat: one batch per rank-second), at most
``PGDASH_MAX_INFLIGHT_BATCHES`` unacknowledged batches; when an acknowledgement is
``PGDASH_ACK_TIMEOUT_S`` late (counted: "ack timeouts"), v2 pings the server and waits while
it answers (up to ``SLOW_ACK_LIMIT`` timeouts), v1 reconnects with the agent's backoff and
resends what was not acknowledged.

Measured per N, over ``--seconds`` of steady state after everybody connected:

* **freshness**: every ``--probe`` seconds, ``GET /api/jobs/<id>``; for each rank, the probe
  time minus its ``last_seen`` (the agent's time of its newest event the server has folded).
  A server that keeps up shows 0-1 s (ranks report once a second); p95 over all samples.
* **ack**: seconds from sending a batch to its acknowledgement (it is sent after the batch
  is committed to the database); p95.
* **server CPU**: user+system CPU seconds of the server process over the window (from
  ``/proc``), as CPU-seconds per rank-hour, and as a share of one core.
* **bytes on the wire**: websocket payload bytes per rank-second, agents to server and back
  (the frames' payloads, without TCP, TLS or websocket framing).
* **cost per rank** (a second table): CPU-s per rank-hour, those bytes, RSS over the ranks
  and what each rank added to the RSS of the row of fewer ranks before it.
* **RSS** and threads of the server process at the end; **findings** (warning or critical)
  the healthy job raised; **lag** the server reported (``/metrics``); reconnects.
* **bench agents stalled**: simulated ranks whose loop ran ``STALL_REPORT_S`` or more late
  (this process starved: beside a CPU hog at 1,024 ranks, all of them, by 20-40 s), and the
  longest. Such a rank sends nothing meanwhile: a ``rank_lost`` on it is the bench's own.

Reference in the same run: the first N given (e.g. 64) is a load any version holds, so a
busy machine shows up as worse figures there too.

A server that keeps history (``--stored FILE``, SQLite only): each run's database starts as a
copy of FILE (ended jobs a ``python -m bench.storage ... --end --no-prepare --db FILE`` left),
and every configuration runs twice, one after the other: "stored", those jobs left alone, and
"opened", each ended job of 128 ranks or more opened as the page opens it when the measured
window begins (``GET /api/jobs/<id>``, then ``/incidents``: the server folds the job, then
prepares its incidents in the background, dashboard.history.incident_frames), not waited
for: what that costs the live job, in one run. The row says how long the opening took and
how many incident marks the server prepared in the window.

Several server processes (issue 11): ``--processes 1,2`` runs every N on K = 1 and then 2
``pgdash serve --db postgresql+psycopg://... --queue redis://...`` processes sharing one
database and one Redis (the K = 1 row runs the same cluster code path, so the rows differ only
in the process count: the reference in the same run). Agent r connects to process r mod K, as
a round-robin load balancer would place them. Freshness is probed on EVERY process's job API
(each must show all ranks, also those connected to the other process), acks and CPU are per
process (with the seconds per second its threads waited, runnable, for a CPU: on a shared
machine what a server got is not what it needed), and the CPU of PostgreSQL, Redis and the
bench's own agents is reported too: on a small machine they share the cores with the
servers. ``--db``/``--queue`` name servers you
run; without ``--db`` the bench starts a throwaway PostgreSQL and redis-server on loopback
(``tests/helpers/realservers.py``: Debian's ``postgresql`` and ``redis-server`` packages), a
fresh database per run. A run is **held** when every rank connected, the worst p95 freshness over
the processes is at most ``--goal`` (2 s, issue 13's goal) and the healthy job raised no
finding.

A measurement, not a test: exit status 0 whatever the figures. From the repository root::

    python -m bench.capacity                         # 256 and 1,024 ranks, v2
    python -m bench.capacity --ranks 64,256,1024 --wire v1 --seconds 40
    python -m bench.capacity --ranks 1024 --wire v2,relay --seconds 60 --settle 20
    python -m bench.capacity --ranks 1024 --wire relay --seconds 120 --stored job.db
    python -m bench.capacity --processes 1,2 --ranks 256,512     # throwaway PostgreSQL+Redis
    python -m bench.capacity --processes 1,2 --ranks 512 \
        --db postgresql+psycopg://pgdash@127.0.0.1:5432/pgdash --queue redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from typing import Any
from pathlib import Path

import websockets

from bench.common import (OPS_PER_SECOND, ROOT, agent_schedule, fmt, members, mesh_groups, pct,
                          second_events, snapshot_answer, start_events, start_servers,
                          stop_servers, summary_event)
from pgdash_agent import relay, wire
from pgdash_agent.config import AgentConfig
from pgdash_agent.outbox import Outbox
from pgdash_agent.sender import SLOW_ACK_LIMIT

TICK = os.sysconf("SC_CLK_TCK")
STALL_REPORT_S = 10.0  # a simulated rank whose loop ran this late is counted as stalled


# -- simulated agents -----------------------------------------------------------------------

class AckTimeout(Exception):
    """No acknowledgement within the agent's ``ack_timeout_s``: it drops the connection."""


class Agent:
    """One simulated rank, sending what the agent sends at its defaults and as its sender does:
    its events numbered once in the agent's own bounded ``Outbox`` (readings waiting for the
    heartbeat), batches of at most ``max_batch_events`` with at most ``max_inflight_batches``
    unacknowledged, retries as the server asks, and when an ack is ``ack_timeout_s`` late a
    ping on v2 (waiting while it is answered) or a reconnect with the agent's backoff, with
    everything unacknowledged sent again on the new connection."""

    def __init__(self, bench: "Bench", rank: int):
        self.bench, self.rank = bench, rank
        # round robin, as a TCP balancer places them (through relays: their hosts)
        self.server = (rank // bench.per_host if bench.relays else rank) % len(bench.ws_urls)
        self.ws_url = bench.ws_urls[self.server]
        self.session = uuid.uuid4().hex
        self.outbox = Outbox(bench.agent.max_buffered_events)
        self.sent: dict[int, tuple[float, list]] = {}  # batch id -> (send time, its events)
        self.next_id = 0
        self.wake = asyncio.Event()
        self.late_batch: float | None = None  # send time of the late batch counted last
        self.probed_at: float | None = None  # when the link was last pinged (v2)
        self.quiet_until = 0.0  # monotonic: the server asked for nothing before then
        self.ws = None
        self.ever_connected = False
        # The longest this simulated rank's loop ran late (its process starved, or collecting
        # garbage): a rank whose agent stalled past lost_after looks lost for the bench's own
        # sake, not the server's (reported beside the findings).
        self.stalled = 0.0

    def auth(self) -> dict:
        b = self.bench
        return {"v": wire.PROTOCOL_VERSION, "session": self.session, "job": b.job,
                "rank": self.rank, "host": f"node{self.rank // 8:04d}", "pid": 10_000 + self.rank}

    def answer(self, ask: dict) -> None:
        """A snapshot of this rank, sent in the stream (pgdash_agent.snapshots)."""
        self.bench.asked += 1
        self.put(snapshot_answer(self.rank, self.bench.member[self.rank], ask))

    def put(self, events) -> None:
        for kind, body, t in events:
            self.outbox.put(t, kind, body)
        self.wake.set()

    async def produce(self, stop: asyncio.Event, rng: random.Random) -> None:
        """The agent's loop: a heartbeat period after period, at this rank's own phase."""
        b = self.bench
        groups = b.member[self.rank]
        self.put(start_events(self.rank, b.world, b.job, groups))
        await asyncio.sleep(rng.random())
        step, period_start = 0, time.monotonic()
        while not stop.is_set():
            step += 0 if b.hung else 1  # hung: every group stays where it stopped
            for offset, beat in b.schedule:
                delay = period_start + offset - time.monotonic()
                if delay > 0:
                    try:
                        await asyncio.wait_for(stop.wait(), timeout=delay)
                        return
                    except asyncio.TimeoutError:
                        pass
                self.stalled = max(self.stalled, time.monotonic() - (period_start + offset))
                span = b.stats_span
                if b.hung:  # nothing completes: a heartbeat and a GPU reading, no summary
                    if beat:
                        self.put([e for e in second_events(self.rank, step, groups, b.ops,
                                                           rng, span=span)
                                  if e[0] != "coll_stats"])
                    continue
                self.put(second_events(self.rank, step, groups, b.ops, rng, span=span) if beat
                         else [summary_event(groups, b.ops, rng, span)])
            period_start += b.agent.interval_s

    async def run(self, stop: asyncio.Event) -> None:
        b = self.bench
        rng = random.Random(self.rank)
        producer = asyncio.create_task(self.produce(stop, rng))
        backoff = 0.25
        try:
            while not stop.is_set():
                try:
                    await self._connect()
                    self.probed_at = None
                    backoff = 0.25
                    if not self.ever_connected:
                        self.ever_connected = True
                        b.connected += 1
                    reader = asyncio.create_task(self._read())
                    try:
                        await self._pump(stop, reader)
                    finally:
                        reader.cancel()
                except (OSError, websockets.ConnectionClosed, asyncio.TimeoutError,
                        AckTimeout) as exc:
                    if isinstance(exc, AckTimeout):  # the agent leaves: it says goodbye
                        await self._goodbye()
                    b.reconnects += 1
                    b.last_error = f"{type(exc).__name__}: {exc}"
                    self._requeue()
                    await asyncio.sleep(backoff * (0.5 + rng.random()))
                    backoff = min(backoff * 2, b.agent.reconnect_max_s)
                finally:
                    if self.ws is not None:
                        await self.ws.close()
                        self.ws = None
        finally:
            producer.cancel()

    async def _goodbye(self) -> None:
        """What the agent sends before closing a connection it gives up on (the websocket's
        close frame, sent by ``ws.close()``, says it on v2)."""

    async def _pump(self, stop: asyncio.Event, reader: asyncio.Task) -> None:
        cfg = self.bench.agent
        while not stop.is_set():
            if reader.done():  # the connection closed under us
                reader.result()
                raise OSError("the server closed the connection")
            now = time.monotonic()
            oldest = min((sent for sent, _ in self.sent.values()), default=now)
            if now - oldest > cfg.ack_timeout_s:
                await self._late(oldest, now)
            else:
                self.probed_at = None
            while len(self.sent) < cfg.max_inflight_batches and self.outbox.due(cfg.interval_s) \
                    and now >= self.quiet_until:
                events = self.outbox.take(cfg.max_batch_events)
                if not events:
                    break
                await self._send(events)
            self.wake.clear()
            # Wake for the next ack check (the oldest batch's, or the next probe's), or when
            # the server's retry_after is over; a put or an ack wakes it sooner.
            wake_at = [max(sent, self.probed_at or sent) + cfg.ack_timeout_s
                       for sent, _ in self.sent.values()]
            if now < self.quiet_until:
                wake_at.append(self.quiet_until)
            timeout = max(0.01, min(wake_at) - now) if wake_at else 1.0
            try:
                await asyncio.wait_for(self.wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass

    async def _late(self, oldest: float, now: float) -> None:
        """An acknowledgement is late: as the agent's sender does (``Sender._why_drop``), v2
        probes the link with a ping every ack timeout and keeps waiting while the server
        answers, up to ``SLOW_ACK_LIMIT`` timeouts; v1 reconnects at once."""
        cfg, b = self.bench.agent, self.bench
        if self.late_batch != oldest:
            self.late_batch = oldest
            b.ack_timeouts += 1
        if not isinstance(self, CompactAgent) or now - oldest > SLOW_ACK_LIMIT * cfg.ack_timeout_s:
            raise AckTimeout(f"no acknowledgement within {now - oldest:.0f} s")
        if self.probed_at is None or now - self.probed_at > cfg.ack_timeout_s:
            self.probed_at = now
            pong = await self.ws.ping()
            await asyncio.wait_for(pong, cfg.ack_timeout_s)  # TimeoutError: a dead link

    def _requeue(self) -> None:
        pending = [ev for _id in sorted(self.sent) for ev in self.sent[_id][1]]
        self.sent.clear()
        self.outbox.requeue(pending)

    def _acked(self, batch_id: int, ack: Any) -> None:
        """As the agent's sender applies an acknowledgement (``Sender._apply_ack``): a batch
        the server asks to have again goes back to the outbox, and nothing is sent for the
        ``retry_after`` it says."""
        entry = self.sent.pop(batch_id, None)
        if entry is None:
            return
        if isinstance(ack, dict) and not ack.get("ok") and ack.get("retry"):
            self.outbox.requeue(entry[1])
            self.bench.retries += 1
            wait = ack.get("retry_after")
            if isinstance(wait, (int, float)) and wait > 0:
                self.quiet_until = max(self.quiet_until,
                                       time.monotonic() + min(float(wait), 30.0))
        elif self.bench.measuring:
            self.bench.acks[self.server].append(time.monotonic() - entry[0])
        self.wake.set()


class SocketIOAgent(Agent):
    """Protocol v1: Engine.IO 4 / Socket.IO 5 frames, the ``/agent`` namespace, JSON."""

    async def _connect(self) -> None:
        self.ws = await websockets.connect(f"{self.ws_url}/socket.io/?EIO=4&transport=websocket",
                                           max_size=None, open_timeout=60, ping_interval=None,
                                           ssl=self.bench.ssl)
        opened = await asyncio.wait_for(self.ws.recv(), 60)
        if not opened.startswith("0"):
            raise OSError(f"unexpected Engine.IO open {opened[:60]!r}")
        await self.ws.send(f"40{wire.AGENT_NAMESPACE}," + json.dumps(self.auth()))
        while True:
            reply = await asyncio.wait_for(self.ws.recv(), 60)
            if reply == "2":
                await self.ws.send("3")
            elif reply.startswith(f"40{wire.AGENT_NAMESPACE},"):
                return
            else:
                raise OSError(f"connect refused: {reply[:200]}")

    async def _send(self, events) -> None:
        self.next_id += 1
        self.sent[self.next_id] = (time.monotonic(), events)
        payload = json.dumps([wire.BATCH_EVENT, {"v": wire.PROTOCOL_VERSION, "events": events}])
        frame = f"42{wire.AGENT_NAMESPACE},{self.next_id}{payload}"
        self.bench.count(len(frame), 0)  # JSON as json.dumps writes it: ASCII, a byte a char
        await self.ws.send(frame)

    async def _goodbye(self) -> None:
        """Socket.IO's disconnect packet, as pgdash_agent.sender's client writes it first."""
        try:
            await asyncio.wait_for(self.ws.send(f"41{wire.AGENT_NAMESPACE},"), 1.0)
        except (OSError, websockets.ConnectionClosed, asyncio.TimeoutError):
            pass

    async def _read(self) -> None:
        prefix = f"43{wire.AGENT_NAMESPACE},"
        async for frame in self.ws:
            self.bench.count(0, len(frame))
            if frame == "2":
                await self.ws.send("3")
            elif frame.startswith(f'42{wire.AGENT_NAMESPACE},["{wire.ASK_EVENT}"'):
                self.answer(json.loads(frame[len(f"42{wire.AGENT_NAMESPACE},"):])[1])
            elif frame.startswith(prefix):
                rest = frame[len(prefix):]
                digits = len(rest) - len(rest.lstrip("0123456789"))
                args = json.loads(rest[digits:] or "[]")
                self._acked(int(rest[:digits]), args[0] if args else None)


class CompactAgent(Agent):
    """Protocol v2: a plain websocket, one MessagePack frame per batch (pgdash_agent.wire)."""

    async def _connect(self) -> None:
        self.ws = await websockets.connect(f"{self.ws_url}{wire.AGENT_V2_PATH}", max_size=None,
                                           open_timeout=60, ping_interval=None,
                                           ssl=self.bench.ssl)
        await self.ws.send(wire.encode_v2({"auth": {**self.auth(), "v": 2}}))
        reply = wire.decode_v2(await asyncio.wait_for(self.ws.recv(), 60))
        if not reply.get("ok"):
            raise OSError(f"connect refused: {reply}")

    async def _send(self, events) -> None:
        self.next_id += 1
        self.sent[self.next_id] = (time.monotonic(), events)
        frame = wire.encode_v2({"id": self.next_id, "events": events})
        self.bench.count(len(frame), 0)
        await self.ws.send(frame)

    async def _read(self) -> None:
        async for frame in self.ws:
            self.bench.count(0, len(frame))
            ack = wire.decode_v2(frame)
            if wire.ASK_EVENT in ack:  # the server's question: answered as the agent does
                self.answer(ack)
            elif isinstance(ack.get("id"), int):
                self._acked(ack["id"], ack)


class HostRelay:
    """A host's relay as pgdash_agent.relay runs it: one websocket to ``RELAY_PATH`` carrying
    the frames of the host's agents (each agent connection a channel), a frame held up to
    ``relay.HOLD_S`` for the others (an agent's hello and a closed connection go at once); it
    answers its agents' pings itself. Bytes on the wire are counted here: what the server
    gets and sends."""

    def __init__(self, bench: "Bench", host: int):
        self.bench, self.host = bench, host
        self.ws_url = bench.ws_urls[host % len(bench.ws_urls)]
        self.ws = None
        self.lock = asyncio.Lock()
        self.channels: dict[int, asyncio.Queue] = {}
        self.next = 0
        self.pending: list = []
        self.gone: list = []
        self.any, self.now = asyncio.Event(), asyncio.Event()
        self.tasks: list[asyncio.Task] = []

    async def up(self) -> None:
        """Connected to the server (again, after losing it)."""
        async with self.lock:
            if self.ws is not None:
                return
            ws = await websockets.connect(f"{self.ws_url}{wire.RELAY_PATH}", max_size=None,
                                          open_timeout=60, ping_interval=None,
                                          ssl=self.bench.ssl)
            auth = {"v": 2, "session": f"relay-{self.host}", "job": self.bench.job,
                    "host": f"node{self.host:04d}", "pid": 1, "reader": 1 + self.host}
            await ws.send(wire.encode_v2({"auth": auth}))
            reply = wire.decode_v2(await asyncio.wait_for(ws.recv(), 60))
            if not reply.get("ok"):
                raise OSError(f"relay refused: {reply}")
            self.ws = ws
            self.tasks = [asyncio.create_task(self._flush_loop(ws)),
                          asyncio.create_task(self._down(ws))]

    def open(self) -> tuple[int, asyncio.Queue]:
        self.next += 1
        inbox: asyncio.Queue = asyncio.Queue()
        self.channels[self.next] = inbox
        return self.next, inbox

    def carry(self, number: int, frame: bytes, now: bool = False) -> None:
        self.pending.append((number, frame))
        if now:
            self.now.set()
        self.any.set()

    def close(self, number: int) -> None:
        if self.channels.pop(number, None) is not None:
            self.gone.append((number, True))
            self.now.set()
            self.any.set()

    async def _flush_loop(self, ws) -> None:
        while True:
            await relay.held(self.any, self.now, relay.HOLD_S)
            frames, self.pending = self.pending, []
            gone, self.gone = self.gone, []
            if frames or gone:
                data = wire.encode_relay(frames, gone)
                self.bench.count(len(data), 0)
                try:
                    await ws.send(data)
                except websockets.ConnectionClosed:
                    return

    async def _down(self, ws) -> None:
        try:
            async for frame in ws:
                self.bench.count(0, len(frame))
                carried = wire.decode_relay(frame)
                for number, data in carried.relay:
                    inbox = self.channels.get(number)
                    if inbox is not None:
                        inbox.put_nowait(data)
                for number, _reason in carried.closed:
                    inbox = self.channels.pop(number, None)
                    if inbox is not None:
                        inbox.put_nowait(None)
        except websockets.ConnectionClosed:
            pass
        finally:  # lost: its agents' connections end with it
            self.ws = None
            self.tasks[0].cancel()
            channels, self.channels = self.channels, {}
            for inbox in channels.values():
                inbox.put_nowait(None)


class _Link:
    """What RelayedAgent has for a websocket: the relay answers pings; closing says goodbye."""

    def __init__(self, relay: HostRelay, number: int):
        self.relay, self.number = relay, number

    async def ping(self):
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def close(self) -> None:
        self.relay.close(self.number)


class RelayedAgent(CompactAgent):
    """Protocol v2 through its host's relay (``--wire relay``): ``--per-host`` ranks a host."""

    async def _connect(self) -> None:
        host = self.bench.relays[self.rank // self.bench.per_host]
        await host.up()
        number, self.inbox = host.open()
        self.ws = _Link(host, number)
        host.carry(number, wire.encode_v2({"auth": {**self.auth(), "v": 2}}), now=True)
        reply = await asyncio.wait_for(self.inbox.get(), 60)
        if reply is None or not wire.decode_v2(reply).get("ok"):
            raise OSError(f"connect refused: {reply}")

    async def _send(self, events) -> None:
        self.next_id += 1
        self.sent[self.next_id] = (time.monotonic(), events)
        self.ws.relay.carry(self.ws.number, wire.encode_v2({"id": self.next_id,
                                                            "events": events}))

    async def _read(self) -> None:
        while (frame := await self.inbox.get()) is not None:
            ack = wire.decode_v2(frame)
            if wire.ASK_EVENT in ack:
                self.answer(ack)
            elif isinstance(ack.get("id"), int):
                self._acked(ack["id"], ack)
        raise websockets.ConnectionClosedError(None, None)


async def launch(bench: "Bench", wire_name: str,
                 stop: asyncio.Event) -> tuple[list["Agent"], list[asyncio.Task]]:
    """Start the bench's simulated agents as a launch does: the ranks arrive over a few
    seconds (64 every 0.2 s). They run until ``stop`` is set. Returns (agents, tasks)."""
    cls = {"v2": CompactAgent, "v1": SocketIOAgent, "relay": RelayedAgent}[wire_name]
    if wire_name == "relay":
        bench.relays = [HostRelay(bench, host)
                        for host in range(-(-bench.world // bench.per_host))]
    agents, tasks = [], []
    for rank in range(bench.world):
        agents.append(cls(bench, rank))
        tasks.append(asyncio.create_task(agents[-1].run(stop)))
        if rank % 64 == 63:
            await asyncio.sleep(0.2)
    return agents, tasks


class Bench:
    def __init__(self, urls: list[str], world: int, ops: int, job: str,
                 ssl_context: ssl.SSLContext | None = None, per_host: int = 8):
        self.urls = urls
        self.ws_urls = ["ws" + u[len("http"):] for u in urls]  # https -> wss
        self.ssl = ssl_context  # --tls: the agents trust the servers' certificate
        self.world, self.ops, self.job = world, ops, job
        self.member = members(mesh_groups(world), world)
        self.connected = self.reconnects = self.ack_timeouts = self.retries = 0
        self.asked = 0  # snapshot questions answered (bench.snapshots)
        self.agent = AgentConfig()  # what a real agent does at its defaults
        self.schedule = agent_schedule(self.agent)
        self.stats_span = self.agent.interval_s / len(self.schedule)
        self.last_error: str | None = None
        self.acks: dict[int, list[float]] = {i: [] for i in range(len(urls))}
        self.measuring = False
        # Websocket payload bytes while measuring, agents to servers and back (frames'
        # payloads: no TCP, TLS or websocket framing).
        self.bytes_up = self.bytes_down = 0
        self.hung = False  # the job hangs: agents send what a hung rank sends (bench.snapshots)
        self.per_host = per_host  # --wire relay: ranks a host, one relay each
        self.relays: list[HostRelay] = []

    def count(self, up: int, down: int) -> None:
        if self.measuring:
            self.bytes_up += up
            self.bytes_down += down


# -- the servers under test -----------------------------------------------------------------

CONTEXT: ssl.SSLContext | None = None  # --tls: how the bench trusts its servers


def get(url: str, timeout: float = 30.0):
    with urllib.request.urlopen(url, timeout=timeout, context=CONTEXT) as resp:
        body = resp.read()
    return body if url.endswith("/metrics") else json.loads(body)


def proc_stats(pid: int) -> tuple[float, int, int]:
    """(CPU seconds, RSS bytes, threads) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICK
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(next(line.split()[1] for line in status.splitlines()
                   if line.startswith("VmRSS:"))) * 1024
    threads = int(next(line.split()[1] for line in status.splitlines()
                       if line.startswith("Threads:")))
    return cpu, rss, threads


def runq_wait(pid: int) -> float:
    """Seconds the process's threads have spent runnable but waiting for a CPU
    (``/proc/PID/task/*/schedstat``, second field). Per second of wall time, it tells a
    server short of CPU because the machine is busy apart from a server that is idle: on a
    shared machine its own CPU share is what it got, not what it needed."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[1])
        except (OSError, IndexError, ValueError):  # a thread gone meanwhile
            continue
    return total / 1e9


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its children alive now (PostgreSQL's backends are
    children of the postmaster; one per connection, so they come and go)."""
    return sum((int(fields[11]) + int(fields[12])) / TICK for _, fields in _tree(pid))


def tree_pids(pid: int) -> list[int]:
    """A process and its children alive now."""
    return [p for p, _ in _tree(pid)]


def _tree(pid: int) -> list[tuple[int, list[str]]]:
    """(pid, /proc/PID/stat fields after the command) of a process and its children."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(stat.parent.name) == pid or int(fields[1]) == pid:
            found.append((int(stat.parent.name), fields))
    return found


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


class Engines:
    """Where a run's servers store and talk: a SQLite file per run (one process), or a
    PostgreSQL database and Redis shared by K processes, given or started here."""

    def __init__(self, args, workdir: Path):
        self.args, self.workdir = args, workdir
        self.pg = self.redis = None
        self.queue = args.queue
        if args.processes and not args.db:
            from tests.helpers.realservers import PostgresServer, RedisServer, postgres_bin

            bin_dir = postgres_bin()
            redis_bin = shutil.which("redis-server")
            if bin_dir is None or not (bin_dir / "postgres").exists() or redis_bin is None:
                raise SystemExit("bench/capacity.py: --processes without --db starts a throwaway "
                                 "PostgreSQL and redis-server, and this machine lacks "
                                 f"{'initdb/postgres' if bin_dir is None else 'redis-server'}: "
                                 "install Debian's postgresql and redis-server packages, or "
                                 "give --db postgresql+psycopg://... and --queue redis://...")
            self.pg = PostgresServer(bin_dir).start()
            if not self.queue:
                self.redis = RedisServer(redis_bin).start()
                self.queue = self.redis.url

    def db_url(self, world: int, k: int, label: str = "") -> str:
        if self.pg is not None:
            return self.pg.new_database()  # every run on an empty database, like the SQLite runs
        if self.args.db:
            return self.args.db  # yours: runs share it, each under its own job name
        path = self.workdir / f'capacity-{world}{label}.db'
        if self.args.stored:  # a server that keeps history: its ended jobs
            shutil.copyfile(self.args.stored, path)
        return f"sqlite:///{path}"

    def pids(self) -> dict[str, int]:
        """Engine processes whose CPU is measured (those started here)."""
        out = {}
        if self.pg is not None and self.pg.proc is not None:
            out["postgres"] = self.pg.proc.pid
        if self.redis is not None and self.redis.proc is not None:
            out["redis"] = self.redis.proc.pid
        return out

    def stop(self) -> None:
        for srv in (self.redis, self.pg):
            if srv is not None:
                srv.stop()


def open_stored(url: str, live_job: str, opened: dict[int, float | None]) -> None:
    """Open every ended job of 128 ranks or more as the page does (the job, then its
    incidents: the server prepares them in the background), one after the other; ``opened``
    gets each job's seconds until both answered (None while waiting)."""
    for job in get(url + "/api/jobs")["jobs"]:
        if job["name"] != live_job and job["ended_at"] and (job["world_size"] or 0) >= 128:
            opened[job["id"]] = None
            t0 = time.monotonic()
            get(f"{url}/api/jobs/{job['id']}", 600)
            get(f"{url}/api/jobs/{job['id']}/incidents", 600)
            opened[job["id"]] = time.monotonic() - t0


async def run_one(world: int, k: int, args, workdir: Path, engines: Engines,
                  root: Path = ROOT, label: str = "", wire_name: str = "v2",
                  opens: bool = False) -> dict:
    db = engines.db_url(world, k, label)
    extra = [*(["--queue", engines.queue] if engines.queue else []), *args.server_args.split(),
             *(["--tls-cert", str(args.tls[0]), "--tls-key", str(args.tls[1])]
               if args.tls else [])]
    servers = start_servers(k, db, extra, workdir, f"{world}-k{k}{label}", root)
    urls = [srv.url for srv in servers]
    pids = [srv.proc.pid for srv in servers]
    try:
        bench = Bench(urls, world, args.ops, f"capacity-{world}-k{k}-{uuid.uuid4().hex[:6]}",
                      CONTEXT, args.per_host)
        stop = asyncio.Event()
        t_connect = time.monotonic()
        agents, tasks = await launch(bench, wire_name, stop)
        while bench.connected < world and time.monotonic() - t_connect < 120:
            await asyncio.sleep(0.5)
        connect_s = time.monotonic() - t_connect
        all_connected = bench.connected >= world
        await asyncio.sleep(args.settle)
        job = next((j for j in get(urls[0] + "/api/jobs")["jobs"] if j["name"] == bench.job),
                   None)
        job_id = job["id"] if job else None
        engine_pids = engines.pids()
        cpu0 = [proc_stats(pid)[0] for pid in pids]
        wait0 = [runq_wait(pid) for pid in pids]
        engine_cpu0 = {name: tree_cpu(pid) for name, pid in engine_pids.items()}
        own_cpu0 = time.process_time()
        t0 = time.monotonic()
        bench.measuring = True
        bench.bytes_up = bench.bytes_down = 0
        reconnects0, timeouts0, retries0 = bench.reconnects, bench.ack_timeouts, bench.retries
        ages: list[list[float]] = [[] for _ in urls]
        lags: list[list[float]] = [[] for _ in urls]
        owned: list[float | None] = [None] * k
        loop = asyncio.get_running_loop()
        probe_errors: list[str] = []
        prepared0 = metric(get(urls[0] + "/metrics").decode(),
                           "pgdash_incident_marks_prepared_total") or 0.0
        opened: dict[int, float | None] = {}  # as a user opens them: not waited for
        if opens:
            threading.Thread(target=open_stored, args=(urls[0], bench.job, opened),
                             daemon=True).start()

        async def probe(i: int, url: str) -> None:
            try:
                detail = await loop.run_in_executor(None, get, f"{url}/api/jobs/{job_id}")
            except (OSError, ValueError) as exc:  # a server too busy to answer: all stale
                probe_errors.append(f"p{i + 1} job: {type(exc).__name__}: {exc}")
                ages[i].extend([float("inf")] * world)
                return
            now = time.time()
            ages[i].extend(now - r["last_seen"] for r in detail["ranks"] if r["last_seen"])
            ages[i].extend([float("inf")] * (world - len(detail["ranks"])))
            try:
                text = (await loop.run_in_executor(None, get, url + "/metrics")).decode()
            except (OSError, ValueError) as exc:
                probe_errors.append(f"p{i + 1} metrics: {type(exc).__name__}: {exc}")
                return
            lag = metric(text, "pgdash_ingest_lag_seconds")
            if lag is not None:
                lags[i].append(lag)
            owned[i] = metric(text, "pgdash_cluster_owned_jobs")

        while time.monotonic() - t0 < args.seconds:
            await asyncio.sleep(args.probe)
            # Every process at the same moment: each must show every rank, wherever it is
            # connected.
            await asyncio.gather(*(probe(i, url) for i, url in enumerate(urls)))
        window = time.monotonic() - t0
        after = [proc_stats(pid) for pid in pids]
        waited = [(runq_wait(pid) - w0) / window for pid, w0 in zip(pids, wait0)]
        engine_cpu = {name: (tree_cpu(pid) - engine_cpu0[name]) / window
                      for name, pid in engine_pids.items()}
        own_cpu = (time.process_time() - own_cpu0) / window
        bench.measuring = False
        prepared = (metric(get(urls[0] + "/metrics").decode(),
                           "pgdash_incident_marks_prepared_total") or 0.0) - prepared0
        kinds: set[str] = set()
        for url in urls:  # stored findings are shared; each process is asked all the same
            try:
                findings = get(f"{url}/api/jobs/{job_id}/findings", 120)["findings"]
            except (OSError, ValueError) as exc:
                findings = [{"kind": f"unreadable ({type(exc).__name__})",
                             "severity": "warning"}]
            kinds |= {f"{f['kind']}:{f['severity']}" for f in findings
                      if f["severity"] in ("warning", "critical")}
        reconnects, timeouts, retries = bench.reconnects, bench.ack_timeouts, bench.retries
        # A rolling restart: SIGTERM with every agent still connected, until the process exits
        # (the agents' reconnections after it are not counted above).
        stop_s = await loop.run_in_executor(None, sigterm_seconds, servers)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        cpu = [(a[0] - c0) / window for a, c0 in zip(after, cpu0)]
        per = [{
            "process": i + 1, "ranks_connected_here": sum(1 for a in agents if a.server == i),
            "fresh_p50": pct(ages[i], 0.5), "fresh_p95": pct(ages[i], 0.95),
            "ack_p95": pct(bench.acks[i], 0.95), "acks": len(bench.acks[i]),
            "cpu_core": cpu[i], "runq_wait": waited[i],
            "rss_mb": after[i][1] / 2**20, "threads": after[i][2],
            "lag_max": max(lags[i]) if lags[i] else None,
            "owns_job": None if owned[i] is None else owned[i] > 0,
        } for i in range(k)]
        all_acks = [a for i in range(k) for a in bench.acks[i]]
        worst_p95 = max((p["fresh_p95"] for p in per if p["fresh_p95"] is not None),
                        default=None)
        row = {
            "ranks": world, "processes": k, "store": db.split(":", 1)[0], "server": label,
            "connected": all_connected, "connect_s": connect_s,
            "fresh_p50": max((p["fresh_p50"] for p in per if p["fresh_p50"] is not None),
                             default=None),
            "fresh_p95": worst_p95,
            "ack_p95": pct(all_acks, 0.95), "acks": len(all_acks),
            "cpu_core": sum(cpu), "cpu_rank_hour": sum(cpu) / world * 3600,
            "up_bytes_rank_s": bench.bytes_up / world / window,
            "down_bytes_rank_s": bench.bytes_down / world / window,
            "rss_mb": sum(p["rss_mb"] for p in per), "threads": sum(p["threads"] for p in per),
            "lag_max": max((p["lag_max"] for p in per if p["lag_max"] is not None),
                           default=None),
            "engine_cpu_core": engine_cpu, "bench_cpu_core": own_cpu,
            "findings": sorted(kinds),
            "agents_stalled": sum(a.stalled >= STALL_REPORT_S for a in agents),
            "agent_stall_max": max((a.stalled for a in agents), default=0.0),
            "reconnects": reconnects - reconnects0,
            "ack_timeouts": timeouts - timeouts0, "retries": retries - retries0,
            "last_error": bench.last_error,
            "probe_errors": probe_errors[:3] + ([f"... {len(probe_errors)} in all"]
                                               if len(probe_errors) > 3 else []),
            "per_process": per, "stop_s": stop_s,
            "stored_opened": dict(opened), "marks_prepared": prepared,
        }
        row["held"] = bool(all_connected and worst_p95 is not None
                           and worst_p95 <= args.goal and not row["findings"])
        return row
    finally:
        stop_servers(servers)


def sigterm_seconds(servers: list) -> float | None:
    """Seconds from SIGTERM to exit of the slowest server (None: one had to be killed)."""
    t0 = time.monotonic()
    for srv in servers:
        srv.proc.terminate()
    try:
        for srv in servers:
            srv.proc.wait(timeout=max(0.1, 30 - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        return None
    return time.monotonic() - t0


def stopped(seconds: float | None) -> str:
    return "killed after 30 s" if seconds is None else f"{seconds:.1f} s"


def parse_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"bench/capacity.py: {flag} takes comma-separated whole numbers, "
                         f"got {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"bench/capacity.py: {flag} needs numbers of at least 1, got {text!r}")
    return values


def check_engines(args, processes: list[int]) -> None:
    """Refuse, with what to do, the combinations the servers would refuse later."""
    if args.db and not args.db.startswith("postgresql"):
        if max(processes) > 1 or args.queue:
            raise SystemExit("bench/capacity.py: --db must be a PostgreSQL URL "
                             "(postgresql+psycopg://USER@HOST:PORT/DB) with --processes above 1 "
                             f"or --queue; got {args.db!r}. SQLite is a one-process store.")
    if args.queue and not args.queue.startswith(("redis://", "rediss://", "unix://")):
        raise SystemExit(f"bench/capacity.py: --queue must be a redis:// URL, got {args.queue!r}")
    if args.db and max(processes) > 1 and not args.queue:
        raise SystemExit(f"bench/capacity.py: --processes {max(processes)} needs --queue "
                         "redis://HOST:PORT/DB: several pgdash serve processes share job "
                         "ownership and live pushes through Redis. Give --queue, or leave out "
                         "--db and the bench starts a throwaway PostgreSQL and Redis itself.")


def table(rows: list[dict]) -> None:
    cluster = any(r["processes"] > 1 or r["store"] != "sqlite" for r in rows)
    if not cluster:
        print("| ranks | all connected | freshness p50 / p95 | ack p95 | server CPU | CPU-s per "
              "rank-hour | RSS | threads | lag max | findings | ack timeouts / retries / reconnects "
              f"| SIGTERM to exit | bench agents stalled >= {STALL_REPORT_S:.0f} s (longest) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['ranks']}{' ' + r['server'] if r['server'] else ''} "
                  f"| {'yes' if r['connected'] else 'NO'} "
                  f"({r['connect_s']:.0f} s) | {fmt(r['fresh_p50'])} / {fmt(r['fresh_p95'])} s "
                  f"| {fmt(r['ack_p95'])} s | {fmt(100 * r['cpu_core'], '.0f')}% of a core "
                  f"| {fmt(r['cpu_rank_hour'])} | {fmt(r['rss_mb'], '.0f')} MB | {r['threads']} "
                  f"| {fmt(r['lag_max'])} s | {', '.join(r['findings']) or 'none'} "
                  f"| {r['ack_timeouts']} / {r['retries']} / {r['reconnects']} "
                  f"| {stopped(r.get('stop_s'))} "
                  f"| {r['agents_stalled']} ({fmt(r['agent_stall_max'], '.1f')} s) |")
        for r in rows:
            if r["stored_opened"]:
                took = ", ".join(f"job {job} in {'(still loading)' if s is None else fmt(s)} s"
                                 for job, s in r["stored_opened"].items())
                print(f"{r['ranks']} {r['server']}: opened stored {took}; incident marks "
                      f"prepared in the window: {r['marks_prepared']:.0f}")
        cost_table(rows)
        return
    print("| K | ranks | process | ranks on it | owns job | freshness p50 / p95 on its API "
          "| ack p95 | CPU | waited for a CPU | RSS | lag max |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        for p in r["per_process"]:
            owns = {None: "?", True: "yes", False: "no"}[p["owns_job"]]
            print(f"| {r['processes']} | {r['ranks']} | #{p['process']} "
                  f"| {p['ranks_connected_here']} | {owns} "
                  f"| {fmt(p['fresh_p50'])} / {fmt(p['fresh_p95'])} s | {fmt(p['ack_p95'])} s "
                  f"| {fmt(100 * p['cpu_core'], '.0f')}% "
                  f"| {fmt(p.get('runq_wait'), '.2f')} s/s | {fmt(p['rss_mb'], '.0f')} MB "
                  f"| {fmt(p['lag_max'])} s |")
    print()
    print("| K | ranks | all connected | worst p95 fresh | held (p95 <= goal, no finding) "
          "| servers' CPU | CPU-s per rank-hour | PostgreSQL CPU | Redis CPU | bench agents' CPU "
          "| findings | ack timeouts / retries / reconnects |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        eng = r["engine_cpu_core"]
        print(f"| {r['processes']} | {r['ranks']} | {'yes' if r['connected'] else 'NO'} "
              f"({r['connect_s']:.0f} s) | {fmt(r['fresh_p95'])} s "
              f"| {'yes' if r['held'] else 'NO'} | {fmt(100 * r['cpu_core'], '.0f')}% "
              f"| {fmt(r['cpu_rank_hour'])} "
              f"| {fmt(100 * eng['postgres'], '.0f') + '%' if 'postgres' in eng else '-'} "
              f"| {fmt(100 * eng['redis'], '.0f') + '%' if 'redis' in eng else '-'} "
              f"| {fmt(100 * r['bench_cpu_core'], '.0f')}% "
              f"| {', '.join(r['findings']) or 'none'} | {r['ack_timeouts']} / {r['retries']} / {r['reconnects']} |")
    for k in sorted({r["processes"] for r in rows}):
        held = [r["ranks"] for r in rows if r["processes"] == k and r["held"]]
        print(f"K={k}: largest N held: {max(held) if held else 'none of those tried'}")


def cost_table(rows: list[dict]) -> None:
    """What each rank costs as the ranks grow: server CPU, websocket payload bytes each way,
    and memory, both RSS over ranks and what each rank added to the run of fewer ranks before
    it (the server's own base left out)."""
    print("\n| ranks | CPU-s per rank-hour | bytes per rank-second, agent to server / back "
          "| RSS per rank | RSS each rank added since the row above |")
    print("|---|---|---|---|---|")
    before: dict[str, dict] = {}
    sides = list(dict.fromkeys(r["server"] or "" for r in rows))  # as run: before, after
    for r in sorted(rows, key=lambda r: (sides.index(r["server"] or ""), r["ranks"])):
        prev = before.get(r["server"] or "")
        added = (f"{(r['rss_mb'] - prev['rss_mb']) * 1024 / (r['ranks'] - prev['ranks']):.0f} KB"
                 if prev and r["ranks"] > prev["ranks"] else "-")
        print(f"| {r['ranks']}{' ' + r['server'] if r['server'] else ''} "
              f"| {fmt(r['cpu_rank_hour'])} | {r['up_bytes_rank_s']:,.0f} / "
              f"{r['down_bytes_rank_s']:,.0f} | {r['rss_mb'] * 1024 / r['ranks']:,.0f} KB "
              f"| {added} |")
        before[r["server"] or ""] = r


def make_certificate(workdir: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (the openssl CLI), trusted by the bench."""
    global CONTEXT
    from tests.helpers.tls import make_cert

    cert, key = make_cert(workdir)
    CONTEXT = ssl.create_default_context(cafile=str(cert))
    return cert, key


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="64,256,1024",
                   help="comma-separated numbers of simulated ranks; the first is the reference")
    p.add_argument("--wire", default="v2",
                   help="v1, v2, relay (v2 through a relay per host: pgdash_agent.relay), or "
                        "several (v2,relay): how the simulated agents reach the server")
    p.add_argument("--per-host", type=int, default=8,
                   help="with --wire relay: ranks per host, one relay each (8: a GPU node)")
    p.add_argument("--tls", action="store_true",
                   help="serve https and wss (a self-signed certificate made here), as "
                        "`pgdash serve --tls-cert` does")
    p.add_argument("--seconds", type=float, default=30.0, help="measured window per N")
    p.add_argument("--settle", type=float, default=10.0,
                   help="seconds after all connected before measuring")
    p.add_argument("--probe", type=float, default=2.0, help="seconds between freshness probes")
    p.add_argument("--ops", type=int, default=OPS_PER_SECOND,
                   help="coll_stats rows per rank-second")
    p.add_argument("--server-args", default="", help="extra arguments to pgdash serve")
    p.add_argument("--keep", metavar="DIR", help="keep the databases and server logs in DIR")
    p.add_argument("--processes", metavar="K[,K...]",
                   help="comma-separated numbers of pgdash serve processes sharing PostgreSQL "
                        "and Redis, each N run on each K (e.g. 1,2); without --db, a throwaway "
                        "PostgreSQL and redis-server are started here")
    p.add_argument("--db", metavar="URL",
                   help="postgresql+psycopg://USER@HOST:PORT/DB the servers share (yours; runs "
                        "share it under distinct job names)")
    p.add_argument("--stored", metavar="FILE",
                   help="a SQLite file with ended jobs each run's database starts as a copy "
                        "of; every run is made twice: those jobs left alone, then opened as "
                        "the page opens them (their incidents prepared in the background)")
    p.add_argument("--queue", metavar="URL",
                   help="redis://HOST:PORT/DB between the processes (needed with K > 1)")
    p.add_argument("--goal", type=float, default=2.0,
                   help="p95 freshness (s) a held run stays within (issue 13: 2 s)")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON to FILE")
    p.add_argument("--compare", metavar="DIR",
                   help="another checkout (e.g. `git worktree add /tmp/before HEAD~3`): each run "
                        "is made against its server ('before') and then this one's ('after'), "
                        "with the same simulated agents (this checkout's agent's behaviour)")
    args = p.parse_args()
    wires = args.wire.split(",")
    if not wires or any(w not in ("v1", "v2", "relay") for w in wires):
        p.error(f"--wire takes v1, v2, relay or several of them, not {args.wire!r}")
    if args.per_host < 1:
        p.error("--per-host must be at least 1")
    worlds = parse_list(args.ranks, "--ranks")
    processes = parse_list(args.processes, "--processes") if args.processes else [1]
    check_engines(args, processes)
    if args.stored and (args.db or args.processes):
        p.error("--stored is a SQLite file: it goes without --db and --processes")
    if args.stored and not Path(args.stored).is_file():
        p.error(f"--stored {args.stored}: no such file (make one with python -m "
                "bench.storage --ranks 1024 --minutes 3 --end --no-prepare --db FILE)")
    where = ("SQLite" if not (args.processes or args.db) else
             f"PostgreSQL{' + Redis' if args.queue or not args.db else ''}"
             f" ({'yours' if args.db else 'throwaway, started here'})")
    print(f"pgdash capacity: wire {args.wire}{' over TLS' if args.tls else ''}, "
          f"{args.seconds:.0f} s measured per run, "
          f"{os.cpu_count()} CPUs; simulated agents in this process (asyncio), each server in "
          f"its own process; store {where}; processes {','.join(map(str, processes))}",
          flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pgdash-capacity-") as tmp:
        if args.keep:
            tmp = args.keep
            Path(tmp).mkdir(parents=True, exist_ok=True)
        engines = Engines(args, Path(tmp))
        args.tls = make_certificate(Path(tmp)) if args.tls else None
        try:
            servers = [(Path(args.compare).resolve(), "before"), (ROOT, "after")] \
                if args.compare else [(ROOT, "")]
            for world in worlds:
                for k in processes:
                    for (root, label), wire_name, opens in itertools.product(
                            servers, wires, [False, True] if args.stored else [False]):
                        if len(wires) > 1:
                            label = f"{label}-{wire_name}" if label else wire_name
                        if args.stored:
                            label = "-".join(filter(None, (label, "opened" if opens
                                                           else "stored")))
                        row = asyncio.run(run_one(world, k, args, Path(tmp), engines, root,
                                                  label, wire_name, opens))
                        rows.append(row)
                        print(json.dumps(row), flush=True)
        finally:
            engines.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print()
    table(rows)


if __name__ == "__main__":
    main()
