"""The agent's sender when acknowledgements are late: a server that is only behind (it still
answers pings) is waited for on the same connection; a link that answers nothing is dropped
and everything unacknowledged is sent again on a new one."""

from __future__ import annotations

import base64
import hashlib
import socket
import threading
import time

from websockets.sync.server import serve

from pgdash_agent.config import AgentConfig
from pgdash_agent.outbox import Outbox
from pgdash_agent.sender import SLOW_ACK_LIMIT, Sender
from pgdash_agent.wire import decode_v2, encode_v2
from tests.helpers.procs import wait_for

ACK_TIMEOUT_S = 0.5
# The behind server's pong must come within an ack timeout, or the link counts as dead: on a
# loaded machine a pong takes longer than half a second now and then (the test failed so).
BEHIND_ACK_TIMEOUT_S = 1.5


def _sender(url: str, ack_timeout_s: float = ACK_TIMEOUT_S) -> Sender:
    config = AgentConfig(server=url, wire="v2", ack_timeout_s=ack_timeout_s, reconnect_max_s=0.2)
    outbox = Outbox(100)
    outbox.put(time.time(), "heartbeat", {"groups": []})
    sender = Sender(config, outbox, lambda: {"session": "s", "job": "j", "rank": 0})
    sender.start()
    return sender


class BehindServer:
    """Takes the agent, never acknowledges a batch; its websocket layer answers pings."""

    def __init__(self):
        self.connections = 0
        self.batches = 0
        self.first_batch_at: float | None = None
        self.reconnected_at: float | None = None
        self._server = serve(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.socket.getsockname()[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _handle(self, ws) -> None:
        self.connections += 1
        if self.connections == 2:
            self.reconnected_at = time.monotonic()
        decode_v2(ws.recv())  # auth
        ws.send(encode_v2({"ok": True, "job": 1}))
        for _ in ws:
            self.batches += 1
            self.first_batch_at = self.first_batch_at or time.monotonic()

    def close(self) -> None:
        self._server.shutdown()


def test_a_server_that_is_only_behind_is_waited_for_on_the_same_connection():
    server = BehindServer()
    sender = _sender(server.url, BEHIND_ACK_TIMEOUT_S)
    try:
        wait_for(lambda: sender.slow_acks >= 1, 30, "a late ack noticed")
        assert "answers pings: it is behind; waiting" in sender.last_error
        # Only at SLOW_ACK_LIMIT timeouts does it give up on that connection and send again
        # (a lower bound: a busy machine makes it later, never earlier).
        wait_for(lambda: server.batches >= 2, SLOW_ACK_LIMIT * BEHIND_ACK_TIMEOUT_S + 30,
                 "the batch sent again on a new connection")
        assert server.connections == 2
        assert server.reconnected_at - server.first_batch_at >= \
            SLOW_ACK_LIMIT * BEHIND_ACK_TIMEOUT_S
        assert sender.last_error.endswith("; reconnecting")
        assert "ping" not in sender.last_error
    finally:
        sender.stop()
        server.close()


class DeadLinkServer:
    """Completes the websocket handshake and the auth, then reads and writes nothing more: a
    link that silently died (a frozen peer, a dropped route)."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # close()d
            self.connections.append(conn)
            try:
                self._handshake(conn)
            except OSError:
                continue  # close() ran, or the sender gave this link up, mid-handshake

    @staticmethod
    def _handshake(conn: socket.socket) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            chunk = conn.recv(4096)
            if not chunk:
                return
            request += chunk
        key = next(line.split(b":", 1)[1].strip() for line in request.split(b"\r\n")
                   if line.lower().startswith(b"sec-websocket-key:"))
        accept = base64.b64encode(hashlib.sha1(
            key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        conn.recv(4096)  # the auth frame
        ok = encode_v2({"ok": True, "job": 1})
        conn.sendall(bytes([0x82, len(ok)]) + ok)

    def close(self) -> None:
        self.listener.close()
        for conn in self.connections:
            conn.close()


def test_a_link_that_answers_nothing_is_dropped_and_what_was_unacknowledged_goes_again():
    server = DeadLinkServer()
    sender = _sender(server.url)
    try:
        # No ack, and no pong to the probe: a new connection, before SLOW_ACK_LIMIT.
        wait_for(lambda: len(server.connections) >= 2, 30, "a reconnect")
        assert sender.last_error.endswith("and no answer to a ping; reconnecting")
    finally:
        sender.stop()
        server.close()


def test_a_shorter_wait_asked_later_does_not_cut_short_an_earlier_one():
    """A server with no room refuses a batch and asks for a few seconds; the agent's later
    batches, refused because the first must come again first, say 0.1 s. Taking the shorter
    wait sent everything again at once into a server that had just said it was full."""
    config = AgentConfig(server="http://127.0.0.1:9", wire="v2")
    sender = Sender(config, Outbox(100), lambda: {"session": "s", "job": "j", "rank": 0})
    events = [{"seq": 1, "t": time.time(), "kind": "heartbeat", "body": {"groups": []}}]
    sender._apply_ack(events, {"ok": False, "retry": True, "retry_after": 4.0,
                               "error": "server overloaded"})
    until = sender._quiet_until
    assert until > time.monotonic() + 3.0
    later = [{"seq": 2, "t": time.time(), "kind": "heartbeat", "body": {"groups": []}}]
    sender._apply_ack(later, {"ok": False, "retry": True, "retry_after": 0.1,
                               "error": "an earlier batch was not stored yet"})
    assert sender._quiet_until == until
    assert len(sender.outbox) == 2  # both kept, to be sent again in order
