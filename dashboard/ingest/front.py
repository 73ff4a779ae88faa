"""The listening socket: agents' compact websockets on one event loop, the rest to Werkzeug.

Werkzeug (and so Flask-SocketIO's threading mode) spends a thread per open websocket, two in
fact, with a condition-variable hand-off for every message: at 1,024 agents that is ~4,000
threads and most of the server's CPU. Agents that speak protocol v2 (``pgdash_agent.wire``: binary
MessagePack frames on a plain websocket at ``AGENT_V2_PATH``) are instead served here, all
on one asyncio loop thread, with websockets' sans-I/O protocol doing the framing.

One port serves both: the loop accepts every connection and peeks (``MSG_PEEK``, nothing is
consumed) at the request line. ``GET /agent/v2`` stays on the loop; anything else (pages, the
JSON API, browsers' and v1 agents' Socket.IO) is handed, untouched, to the Werkzeug server's
usual thread-per-request handling. Ingest work never runs on the loop thread while it waits:
batches go to the store's writer thread, and the acknowledgement is sent when the commit's
future completes, so the loop never blocks on the database.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import ssl
import threading
from typing import Any, Callable

from websockets.frames import Opcode
from websockets.protocol import State
from websockets.http11 import Request
from websockets.server import ServerProtocol

from pgdash_agent.wire import (AGENT_V2_PATH, BOARDS_FRAME, READ_FRAME, READER_PATH,
                               RELAY_FRAME_BYTES, RELAY_PATH, WireError, decode_relay,
                               decode_v2, decode_v2_batch, encode_relay, encode_v2)
from dashboard.ingest.tls import READ_BUFFER, route_tls, small_read_buffers

log = logging.getLogger("pgdash.server")
_quiet = logging.getLogger("pgdash.server.websocket")  # "connection open" per agent: noise
_quiet.setLevel(logging.WARNING)

PEEK_BYTES = 64
PEEK_TIMEOUT_S = 10.0  # a client that says nothing this long goes to Werkzeug (it times out)
_ROUTE = f"GET {AGENT_V2_PATH}".encode()
MAX_READER_REFUSALS = 16  # frames of a host reader's refused before its connection is closed
# Agents one host relay carries at once (pgdash_agent.relay: a host's ranks, 8 on a GPU node).
MAX_RELAY_CHANNELS = 64
_PATHS = (AGENT_V2_PATH, READER_PATH, RELAY_PATH)


class Front:
    """Owns the listening socket of a Werkzeug server and routes its connections.

    Args:
        wsgi_server: a bound ``werkzeug.serving.ThreadedWSGIServer``; its ``serve_forever``
            is not used (this loop accepts instead).
        ingest: the server's :class:`dashboard.ingest.pipeline.Ingest`.
        max_frame_bytes: largest v2 frame accepted (``PGDASH_MAX_MESSAGE_BYTES``).
        new_limits: makes one connection's rate limits (``PGDASH_MAX_EVENTS_PER_S``, ...).
        ssl_context: the server's TLS (``--tls-cert``): connections are decrypted on this
            loop, and those that are not v2 agents piped to Werkzeug (dashboard.ingest.tls).
    """

    def __init__(self, wsgi_server: Any, ingest: Any, max_frame_bytes: int,
                 new_limits: Callable[[], Any] | None = None,
                 ssl_context: ssl.SSLContext | None = None):
        self.wsgi = wsgi_server
        self.ssl_context = ssl_context  # --tls-cert: the loop does TLS (dashboard.ingest.tls)
        if ssl_context is not None:
            small_read_buffers()
        self.ingest = ingest
        self.max_frame_bytes = max_frame_bytes
        self.new_limits = new_limits  # one connection's rate limits (dashboard.ingest.limits)
        self.loop = asyncio.new_event_loop()
        self.read_buffer = memoryview(bytearray(READ_BUFFER))  # AgentLink.get_buffer's
        self._thread = threading.Thread(target=self._run, name="pgdash-front", daemon=True)
        self._stopped = threading.Event()

    def start(self) -> "Front":
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._stopped.wait(10)
        self.wsgi.server_close()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        listener = self.wsgi.socket
        listener.setblocking(False)
        self.loop.add_reader(listener.fileno(), self._accept, listener)
        try:
            self.loop.run_forever()
        finally:
            self.loop.remove_reader(listener.fileno())
            for task in asyncio.all_tasks(self.loop):  # connections still open: close them
                task.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.close()
            self._stopped.set()

    def _accept(self, listener: socket.socket) -> None:
        for _ in range(64):  # drain the backlog, then let the loop breathe
            try:
                conn, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("pgdash: accept failed: %s", exc)
                return
            conn.setblocking(False)
            self.loop.create_task(self._route(conn, addr))

    async def _route(self, conn: socket.socket, addr: Any) -> None:
        """Peek at the request line; v2 agents stay on this loop, the rest go to Werkzeug."""
        if self.ssl_context is not None:
            await route_tls(self, conn, addr, self.ssl_context,
                            is_agent=lambda head: head.startswith(_ROUTE),
                            enough=_enough, new_link=lambda: AgentLink(self))
            return
        head = await self._peek(conn)
        if head is None:  # closed before saying anything
            conn.close()
        elif head.startswith(_ROUTE):
            await self._serve_agent(conn)
        else:
            conn.setblocking(True)
            try:
                self.wsgi.process_request(conn, addr)  # a thread per request, as before
            except Exception:
                log.exception("pgdash: could not hand a connection to the HTTP server")
                conn.close()

    async def _peek(self, conn: socket.socket) -> bytes | None:
        """The first bytes the client sent, left unread for whoever serves it; None if it
        closed first."""
        ready = asyncio.Event()
        self.loop.add_reader(conn.fileno(), ready.set)
        try:
            deadline = self.loop.time() + PEEK_TIMEOUT_S
            while True:
                try:
                    head = conn.recv(PEEK_BYTES, socket.MSG_PEEK)
                except BlockingIOError:
                    head = b""
                except OSError:
                    return None
                else:
                    if not head:
                        return None
                    if _enough(head):
                        return head
                remaining = deadline - self.loop.time()
                if remaining <= 0:
                    return head
                if head:  # part of a line: the socket stays readable, so poll, don't spin
                    await asyncio.sleep(0.01)
                    continue
                ready.clear()
                try:
                    await asyncio.wait_for(ready.wait(), remaining)
                except asyncio.TimeoutError:
                    return head
        finally:
            self.loop.remove_reader(conn.fileno())

    async def _serve_agent(self, conn: socket.socket) -> None:
        transport, link = await self.loop.connect_accepted_socket(
            lambda: AgentLink(self), sock=conn)
        try:
            await link.closed
        finally:
            transport.close()  # also when the server stops with the agent still connected


def _enough(head: bytes) -> bool:
    """Whether a connection's first bytes tell whether it is a v2 agent."""
    return len(head) >= len(_ROUTE) or b"\n" in head


class AgentLink(asyncio.BufferedProtocol):
    """One v2 agent connection: handshake, auth, then batches in and acks out.

    Read into the front's one buffer (``get_buffer``), not a new one per read: asyncio's
    plain transports otherwise allocate 256 KiB for every read and shrink it to what came,
    and blocks that size are mappings of their own (dashboard.allocator), so each of the
    ~1,000 reads a second at 1,024 agents cost a mapping made and unmade. The loop fills
    the buffer and calls ``buffer_updated`` before it reads another connection, so one
    buffer serves all of them."""

    def __init__(self, front: Front):
        self._agent(front)
        self.ws = ServerProtocol(max_size=front.max_frame_bytes, logger=_quiet)
        self.transport: asyncio.Transport | None = None
        self.closed = front.loop.create_future()
        self.address: str | None = None  # the client's, for token guessing (dashboard.ingest.guard)
        # A host reader's connection (READER_PATH: pgdash_agent.reader): once admitted, the
        # session of the rank that started it, and its link in the server's questions.
        self.is_reader = False
        self.reader: Any = None
        self.reader_refusals = 0
        # A host relay's (RELAY_PATH: pgdash_agent.relay): once admitted, the agents it
        # carries by channel, and what is to be sent to them at the end of this loop turn.
        self.is_relay = False
        self.relay_admitted = False
        self.channels: dict[int, Channel] = {}
        self._carried: list[tuple[int, bytes]] = []
        self._closing: list[tuple[int, str]] = []

    def _agent(self, front: Front) -> None:
        """What this link knows of the agent it serves."""
        self.front = front
        self.ingest = front.ingest
        self.rate = front.new_limits() if front.new_limits is not None else None
        self.session: str | None = None
        self.job_id: int | None = None
        self._admitting = False

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.front.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(self.front.read_buffer[:nbytes]))

    def data_received(self, data: bytes) -> None:
        self.ws.receive_data(data)
        for event in self.ws.events_received():
            if isinstance(event, Request):
                self._handshake(event)
            elif event.opcode is Opcode.BINARY or event.opcode is Opcode.TEXT:
                self._frame(event.data if event.opcode is Opcode.BINARY
                            else event.data.decode("utf-8", "replace"))
        self._flush()

    def eof_received(self) -> bool | None:
        self.ws.receive_eof()
        self._flush()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.reader is not None:
            self.ingest.asks.unlink_reader(self.reader)
            self.reader = None
        if self.relay_admitted:
            self.relay_admitted = False
            self.ingest.counters["relays_lost"] += 1
        channels, self.channels = self.channels, {}
        for channel in channels.values():  # the relay went without saying: as if killed
            channel._ended(goodbye=False)
        # a close frame received: the agent closed it itself
        self._ended(goodbye=self.ws.close_rcvd is not None)
        if not self.closed.done():
            self.closed.set_result(None)

    def _ended(self, goodbye: bool) -> None:
        """The agent's connection ended; ``goodbye``: it closed it itself (alive)."""
        if self.session is not None:
            self.ingest.agent_connections -= 1
            session, self.session = self.session, None
            self.ingest.asks.unlink(session, self._ask)
            self.ingest.disconnect(session, goodbye=goodbye)  # queued, never waited for

    def _open(self) -> bool:
        """Whether what is sent to the agent can still reach it."""
        return self.transport is not None and not self.transport.is_closing()

    # -- websocket ---------------------------------------------------------------------------

    def _flush(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        for data in self.ws.data_to_send():
            if data:
                self.transport.write(data)
            else:  # the protocol is done with this connection
                self.transport.close()
                return

    def _send(self, message: dict[str, Any]) -> None:
        if self._open():
            self.ws.send_binary(encode_v2(message))
            self._flush()

    def _close(self, reason: str) -> None:
        if self.ws.state is not State.OPEN:  # the agent left first (it gave up waiting)
            if self.transport is not None:
                self.transport.close()
            return
        self.ws.send_close(1008, reason[:120])
        self._flush()

    def _handshake(self, request: Request) -> None:
        path = request.path.split("?", 1)[0]
        if path not in _PATHS:
            self.ws.send_response(self.ws.reject(404, "no such endpoint\n"))
            return
        self.is_reader = path == READER_PATH
        self.is_relay = path == RELAY_PATH
        if self.is_relay:  # several agents' frames, or one of the largest alone
            self.ws.max_size = self.front.max_frame_bytes + 2 * RELAY_FRAME_BYTES
        guard = self.ingest.admission.guard
        if self.transport is not None:
            peer = self.transport.get_extra_info("peername")
            remote = peer[0] if peer else None
            self.address = guard.address(remote, request.headers) if guard else remote
        self.ws.send_response(self.ws.accept(request))

    # -- pgdash ------------------------------------------------------------------------------

    def _frame(self, frame: bytes | str) -> None:
        self.ingest.counters["received_bytes"] += len(frame)
        if self.is_reader:
            self._reader_message(frame)
        elif self.is_relay:
            self._relay_message(frame)
        else:
            self._message(frame)

    def _message(self, frame: bytes | str) -> None:
        # An admitted agent's batch, all valid: its events come checked (wire.decode_v2_batch).
        batch = decode_v2_batch(frame) if self.session is not None else None
        if batch is None:
            message = self._map_of(frame, "rejected_batches")
            if message is None:
                return
            if self.session is None:
                self._admit(message.get("auth"))
                return
            batch = message.get("id"), message.get("events")
        batch_id, events = batch
        if isinstance(batch_id, bool) or not isinstance(batch_id, int):
            self._send({"ok": False, "error": "a v2 batch needs an integer id", "retry": False})
            return
        self.ingest.counters["batches_v2"] += 1
        if self.rate is not None:  # charged before validation: garbage costs too
            refusal = self.rate.admit(len(events) if isinstance(events, list) else 1,
                                      len(frame))
            if refusal is not None:
                self.ingest.counters["rate_limited_batches"] += 1
                self.ingest.hold(self.session, events, refusal.retry_after)
                self._send({"id": batch_id, "ok": False, "error": refusal.reason,
                            "retry": True, "retry_after": refusal.retry_after})
                return
        ack, pending = self.ingest.batch_nowait(self.session, self.job_id, events)
        if pending is None:
            self._send({"id": batch_id, **ack})
            return
        pending.add_done_callback(
            lambda fut: self._hand_back(self._committed, batch_id, events, ack, fut))

    def _map_of(self, frame: bytes | str, counter: str) -> dict[str, Any] | None:
        """The frame's map; None when it is not one (the client is told why, ``counter``
        counts what did not decode)."""
        try:
            message = decode_v2(frame)
        except WireError as exc:
            self.ingest.counters[counter] += 1
            self._send({"ok": False, "error": str(exc), "retry": False})
            return None
        if not isinstance(message, dict):
            self._send({"ok": False, "error": "a v2 frame must be a map", "retry": False})
            return None
        return message

    def _hand_back(self, *call) -> None:
        """Writer thread: pass a commit's outcome to the loop. A stopping server has closed
        its loop while the writer drains: the agent was not acknowledged and resends, so
        there is nothing to do (and a traceback per queued batch would slow the drain)."""
        try:
            self.front.loop.call_soon_threadsafe(*call)
        except RuntimeError:
            pass

    def _committed(self, batch_id: int, events: list, ack: dict[str, Any],
                   fut: concurrent.futures.Future) -> None:
        try:
            stored = fut.result()
        except Exception as exc:
            self._send({"id": batch_id, **self.ingest.write_failed(self.session, events, exc)})
            return
        self._send({"id": batch_id, **self.ingest.committed(self.session, ack, stored)})

    def _admit(self, auth: Any) -> None:
        """Admit the agent on the loop: the checks are quick, and the job is known when the
        writer has placed the session (no thread waits for it: a pool of threads each waiting
        on a writer behind its backlog kept agents out of an overloaded server)."""
        if self._admitting:
            self._send({"ok": False, "error": "wait for the answer to auth", "retry": True})
            return
        from dashboard.ingest.pipeline import Refused

        try:
            session, job = self.ingest.connect_nowait(auth, self.address)
        except Refused as exc:  # ingest's refusal log says it, once per agent
            self._send({"ok": False, "error": str(exc), "retry": False})
            self._close("refused")
            return
        except Exception as exc:
            self._refuse_for(exc)
            return
        self._admitting = True
        job.add_done_callback(lambda fut: self._hand_back(self._admitted, session, fut))

    def _refuse_for(self, exc: BaseException) -> None:
        self._send({"ok": False, "error": f"server error: {exc}", "retry": True})
        self._close("server error")

    def _admitted(self, session: str, job: concurrent.futures.Future) -> None:
        self._admitting = False
        try:
            job_id = job.result()
        except Exception as exc:
            self._refuse_for(exc)
            return
        if not self._open():
            self.ingest.disconnect(session)
            return
        self.session, self.job_id = session, job_id
        self.ingest.agent_connections += 1
        self._send({"ok": True, "job": job_id})
        self.ingest.asks.link(session, self._ask)

    def _reader_message(self, frame: bytes | str) -> None:
        """A host reader's frame: its hello, then readings (pgdash_agent.wire.Read)."""
        message = self._map_of(frame, "rejected_readings")
        if message is None:
            return
        if self.reader is None:
            from dashboard.ingest.pipeline import Refused

            try:
                self.reader = self.ingest.connect_reader(message.get("auth"), self.address,
                                                         self._ask)
            except Refused as exc:
                self._send({"ok": False, "error": str(exc), "retry": False})
                self._close("refused")
                return
            except Exception as exc:  # its session not readable now (a database error)
                self._refuse_for(exc)
                return
            self._send({"ok": True, "job": self.reader.job_id})
            return
        if self.rate is not None:  # as an agent's batches are (a reader answers questions:
            refusal = self.rate.admit(1, len(frame))  # a few a minute)
            if refusal is not None:
                self.ingest.counters["rate_limited_batches"] += 1
                self._refused_reading(refusal.reason)
                return
        if BOARDS_FRAME in message:
            error = self.ingest.reader_boards(self.reader, message[BOARDS_FRAME])
        elif READ_FRAME in message:
            error = self.ingest.reader_read(self.reader, message[READ_FRAME])
        else:
            error = f"a host reader sends only {READ_FRAME!r} and {BOARDS_FRAME!r} frames"
        if error is not None:
            self._refused_reading(error)

    def _refused_reading(self, error: str) -> None:
        """A host reader's frame refused: it is told why; one that keeps sending what is
        refused (it answers only what it is asked) is let go."""
        self.reader_refusals += 1
        self._send({"ok": False, "error": error, "retry": False})
        if self.reader_refusals >= MAX_READER_REFUSALS:
            self._close("too many refused frames")

    def _ask(self, message: dict[str, Any]) -> None:
        """The server's question to this agent (dashboard.ingest.asks), from any thread."""
        self._hand_back(self._send, message)

    # -- a host relay (pgdash_agent.relay) ---------------------------------------------------

    def _relay_message(self, frame: bytes | str) -> None:
        """A host relay's frame: its hello, then its agents' frames (wire.RelayFrame), each
        served by that agent's Channel as its own connection's would be."""
        if not self.relay_admitted:
            message = self._map_of(frame, "rejected_relay_frames")
            if message is None:
                return
            from dashboard.ingest.pipeline import Refused

            try:
                self.ingest.connect_relay(message.get("auth"), self.address)
            except Refused as exc:
                self._send({"ok": False, "error": str(exc), "retry": False})
                self._close("refused")
                return
            self.relay_admitted = True
            self._send({"ok": True})
            return
        try:
            carried = decode_relay(frame)
        except WireError as exc:
            self.ingest.counters["rejected_relay_frames"] += 1
            self._send({"ok": False, "error": str(exc), "retry": False})
            return
        for number, inner in carried.relay:
            channel = self.channels.get(number)
            if channel is None:
                if len(self.channels) >= MAX_RELAY_CHANNELS:
                    self._closing.append((number, f"this relay carries {MAX_RELAY_CHANNELS} "
                                                  "agents already: connect to the server"))
                    self._carry_soon()
                    continue
                channel = self.channels[number] = Channel(self, number)
            channel._message(inner)
        for number, goodbye in carried.gone:
            channel = self.channels.pop(number, None)
            if channel is not None:
                channel._ended(goodbye)

    def _carry(self, number: int, data: bytes) -> None:
        """Send ``data`` to the relay's agent on channel ``number``, with whatever else this
        turn of the loop sends it (the acks of one commit go in one frame)."""
        self._carried.append((number, data))
        self._carry_soon()

    def _carry_soon(self) -> None:
        if len(self._carried) + len(self._closing) == 1:
            self.front.loop.call_soon(self._carry_now)

    def _carry_now(self) -> None:
        carried, self._carried = self._carried, []
        closing, self._closing = self._closing, []
        if (carried or closing) and self._open():
            self.ws.send_binary(encode_relay(carried, closed=closing))
            self._flush()


class Channel(AgentLink):
    """One agent carried by a host relay: served as an agent's own connection is, its frames
    inside the relay's (``_carry``)."""

    def __init__(self, relay: AgentLink, number: int):
        self._agent(relay.front)
        self.relay, self.number = relay, number
        self.address = relay.address
        self.transport = relay.transport
        self.is_reader = self.is_relay = False

    def _open(self) -> bool:
        return self.relay.channels.get(self.number) is self and self.relay._open()

    def _admitted(self, session: str, job: concurrent.futures.Future) -> None:
        super()._admitted(session, job)
        if self.session is not None:
            self.ingest.counters["relayed_agents"] += 1

    def _ended(self, goodbye: bool) -> None:
        if self.session is not None:
            self.ingest.counters["relayed_agents"] -= 1
        super()._ended(goodbye)

    def _send(self, message: dict[str, Any]) -> None:
        if self._open():
            self.relay._carry(self.number, encode_v2(message))

    def _close(self, reason: str) -> None:
        if self.relay.channels.get(self.number) is self:
            self.relay._closing.append((self.number, reason[:120]))
            self.relay._carry_soon()
            del self.relay.channels[self.number]
            self._ended(goodbye=False)
