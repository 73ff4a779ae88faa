"""TLS on the front's loop: v2 agents stay fast behind ``--tls-cert``.

Without TLS the front peeks at a connection's request line and hands everything that is not a
v2 agent to Werkzeug untouched (dashboard.ingest.front). Encrypted bytes cannot be peeked at, so
with TLS the loop does the handshake itself (asyncio's TLS, memory BIOs, no thread), reads the
request line, and then either keeps the connection (``GET /agent/v2``: the same AgentLink as
in plain mode) or pipes it in plaintext to Werkzeug over a socket pair: pages, the API,
browsers' and v1 agents' Socket.IO are served by Werkzeug's threads as before, with the
client's own address (login limits and ``--trust-proxy`` read it) and ``https`` as their URL
scheme. Before, Werkzeug did the TLS and answered ``/agent/v2`` with 404, so agents fell back
to the slower protocol v1 on every secure deployment.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import Any, Callable

log = logging.getLogger("pgdash.server")

HANDSHAKE_TIMEOUT_S = 10.0
# Bytes each TLS connection reads into at a time. asyncio's TLS gives every connection a
# 256 KiB read buffer (``SSLProtocol.max_size``), zero-filled, so resident: at 1,024 agents
# over wss the server held 508 MB against 219 MB in the clear (bench/capacity.py --tls).
# Agents send ~3 kB a second; a TLS record is at most 16 kB. Larger frames are read in more
# calls. Plain connections read into one buffer of this size (dashboard.ingest.front.AgentLink).
READ_BUFFER = 32 * 1024


def small_read_buffers() -> None:
    """Give the TLS connections of this process READ_BUFFER bytes to read into, not 256 kB
    (asyncio.sslproto.SSLProtocol's class setting: its transports are made inside
    ``connect_accepted_socket``, out of reach; a Python without it keeps its own)."""
    from asyncio import sslproto

    if getattr(sslproto.SSLProtocol, "max_size", 0) > READ_BUFFER:
        sslproto.SSLProtocol.max_size = READ_BUFFER


class _Head(asyncio.Protocol):
    """Collects a new TLS connection's first bytes until the request line can be told."""

    def __init__(self, loop: asyncio.AbstractEventLoop, enough: Callable[[bytes], bool]):
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.enough = enough
        self.ready = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.enough(self.buffer) and not self.ready.done():
            self.transport.pause_reading()  # the next protocol reads on
            self.ready.set_result(True)

    def eof_received(self) -> bool:
        # A TLS close_notify: the client is gone (TLS has no half-close; asyncio closes).
        if not self.ready.done():
            self.ready.set_result(False)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.done():
            self.ready.set_result(False)


class _Pipe(asyncio.Protocol):
    """One end of a plaintext pipe: what its transport reads, the other end's writes, with
    the other end's reading paused while this end cannot keep up."""

    def __init__(self, tls: bool) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Pipe | None = None
        self.tls = tls

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.peer.transport.write(data)

    def eof_received(self) -> bool:
        other = self.peer.transport
        if other.can_write_eof():  # the client is done sending: Werkzeug reads its EOF
            other.write_eof()
            # TLS has no half-close (asyncio closes the TLS side whatever this returns); the
            # socket pair's side stays open for the answer.
            return not self.tls
        other.close()  # Werkzeug is done: the TLS side closes after what is queued
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def pause_writing(self) -> None:
        self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        self.peer.transport.resume_reading()


async def route_tls(front: Any, conn: socket.socket, addr: Any, context: ssl.SSLContext,
                    is_agent: Callable[[bytes], bool], enough: Callable[[bytes], bool],
                    new_link: Callable[[], asyncio.Protocol]) -> None:
    """Serve one accepted TCP connection of a TLS server on ``front``'s loop.

    ``is_agent(head)`` says whether the request line is a v2 agent's, ``enough(head)`` whether
    enough of it has arrived to tell; ``new_link()`` makes the agent's protocol (an AgentLink,
    whose ``closed`` future ends the connection).
    """
    loop = front.loop
    try:
        transport, head = await loop.connect_accepted_socket(
            lambda: _Head(loop, enough), sock=conn, ssl=context,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
    except (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError) as exc:
        # A scanner, a client that distrusts the certificate, plain http on an https port:
        # nothing to serve, and not worth a line per connection.
        log.debug("pgdash: TLS handshake with %s failed: %s", addr, exc)
        conn.close()
        return
    try:
        await asyncio.wait_for(asyncio.shield(head.ready), HANDSHAKE_TIMEOUT_S)
    except asyncio.TimeoutError:
        pass  # a client that says nothing: Werkzeug times it out, as in plain mode
    if transport.is_closing():  # the client left before it could be answered
        transport.close()
        return
    if is_agent(head.buffer):
        link = new_link()
        transport.set_protocol(link)
        link.connection_made(transport)
        link.data_received(head.buffer)
        transport.resume_reading()
        try:
            await link.closed
        finally:
            transport.close()
        return
    await _pipe_to_wsgi(front, transport, head.buffer, addr)


async def _pipe_to_wsgi(front: Any, transport: asyncio.Transport, said: bytes,
                        addr: Any) -> None:
    """Hand the decrypted connection to Werkzeug through a socket pair (a thread per request,
    as for plain connections), with what the client said so far first."""
    loop = front.loop
    inner, outer = socket.socketpair()
    outer.setblocking(False)
    client, server = _Pipe(tls=True), _Pipe(tls=False)
    client.transport, client.peer, server.peer = transport, server, client
    try:
        await loop.connect_accepted_socket(lambda: server, sock=outer)
    except OSError:
        inner.close()
        outer.close()
        transport.close()
        return
    transport.set_protocol(client)
    if said:
        server.transport.write(said)
    transport.resume_reading()
    try:
        front.wsgi.process_request(inner, addr)  # the client's address, not the pair's
    except Exception:
        log.exception("pgdash: could not hand a connection to the HTTP server")
        inner.close()
        server.transport.close()
