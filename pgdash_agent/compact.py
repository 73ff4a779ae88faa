"""The agent's client for protocol v2: MessagePack frames on a plain websocket.

It offers the few calls of ``socketio.Client`` that :class:`pgdash_agent.sender.Sender` makes
(``on``, ``connect``, ``emit`` with an acknowledgement callback, ``disconnect``), so the sender
keeps one code path for both protocols. A server too old for v2 answers the upgrade with 404:
``connect`` then raises :class:`NotServed` and the sender falls back to Socket.IO (v1).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from pgdash_agent.wire import AGENT_V2_PATH, ASK_EVENT, PROTOCOL_V2, decode_v2, encode_v2


class NotServed(ConnectionError):
    """The server does not speak protocol v2 (an older pgdash): use v1."""


class Refused(ConnectionError):
    """The server refused this agent (bad token, bad auth); the text says why."""


def _websocket_url(server: str, path: str = AGENT_V2_PATH) -> str:
    base = server.rstrip("/")
    if base.startswith("https://"):
        return "wss://" + base[len("https://"):] + path
    if base.startswith("http://"):
        return "ws://" + base[len("http://"):] + path
    raise ValueError(f"PGDASH_SERVER must start with http:// or https://, got {server!r}")


def _unix(where: str, timeout: float) -> Any:
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(where)
    except OSError:
        sock.close()
        raise
    return sock


class CompactClient:
    """One v2 connection, owned by the sender thread; a reader thread delivers acks."""

    def __init__(self, sslopt: dict[str, Any] | None = None, path: str = AGENT_V2_PATH):
        self._sslopt = sslopt or {}
        self._path = path  # AGENT_V2_PATH, or READER_PATH for a host reader
        self._ws = None
        self._handlers: dict[str, Callable[..., Any]] = {}
        self._callbacks: dict[int, Callable[[Any], None]] = {}
        self._next_id = 0
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self.connected = False
        self.job_id: Any = None  # the server's id of this agent's job (its answer to auth)
        self.heard_at = 0.0  # monotonic: when the server last sent anything (an ack, a pong)

    def on(self, event: str, handler: Callable[..., Any] | None = None, namespace: str | None = None):
        """Register a handler (``disconnect``, ``connect_error`` or ``ask``), as socketio.Client
        does."""
        if handler is None:
            def decorator(fn):
                self._handlers[event] = fn
                return fn

            return decorator
        self._handlers[event] = handler
        return handler

    def connect(self, server: str, *, auth: dict[str, Any], wait_timeout: float = 5.0,
                via: str | None = None, **_ignored: Any) -> None:
        """Connect to ``server``, or through its host's relay listening at ``via`` (a Unix
        socket: pgdash_agent.relay), which carries this connection to it."""
        import websocket  # websocket-client, a dependency of python-socketio's client

        try:
            if via is None:
                ws = websocket.create_connection(_websocket_url(server, self._path),
                                                 timeout=wait_timeout,
                                                 sslopt=self._sslopt, enable_multithread=True)
            else:
                ws = websocket.create_connection(f"ws://localhost{self._path}",
                                                 timeout=wait_timeout,
                                                 socket=_unix(via, wait_timeout),
                                                 enable_multithread=True)
        except websocket.WebSocketBadStatusException as exc:
            if exc.status_code == 404:
                raise NotServed(f"{server} does not serve {self._path}") from None
            raise
        try:
            ws.send_binary(encode_v2({"auth": {**auth, "v": PROTOCOL_V2}}))
            reply = decode_v2(ws.recv())
        except Exception:
            ws.close()
            raise
        if not (isinstance(reply, dict) and reply.get("ok")):
            ws.close()
            reason = reply.get("error") if isinstance(reply, dict) else repr(reply)
            handler = self._handlers.get("connect_error")
            if handler is not None:
                handler({"message": reason})
            raise Refused(str(reason))
        ws.settimeout(None)
        self.job_id = reply.get("job")
        self._ws = ws
        self.connected = True
        self._reader = threading.Thread(target=self._read, name="pgdash-acks", daemon=True)
        self._reader.start()

    def emit(self, event: str, data: dict[str, Any], namespace: str | None = None,
             callback: Callable[[Any], None] | None = None) -> None:
        with self._lock:
            self._next_id += 1
            batch_id = self._next_id
            if callback is not None:
                self._callbacks[batch_id] = callback
        self._ws.send_binary(encode_v2({"id": batch_id, "events": data["events"]}))

    def send(self, message: dict[str, Any]) -> None:
        """Send one frame that wants no acknowledgement (a host reader's reading)."""
        self._ws.send_binary(encode_v2(message))

    def probe(self) -> None:
        """Ask the server for a sign of life: a websocket ping, whose pong sets heard_at. The
        server's websocket layer answers it even while its writer is behind."""
        ws = self._ws
        if ws is not None:
            ws.ping()

    def disconnect(self) -> None:
        """Say goodbye (a close frame, sent within a second) and close the socket, without
        waiting for the server's answer: on a dead link websocket-client's close() waits for
        it behind the reader thread forever, and the sender thread with it."""
        ws, self._ws = self._ws, None
        if ws is None:
            return
        try:
            ws.settimeout(1)
            ws.send_close()
        except Exception:
            pass
        try:
            ws.abort()  # wakes the reader thread, which ends
        finally:
            ws.shutdown()
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout=1)

    def _read(self) -> None:
        from websocket import ABNF

        ws = self._ws
        try:
            while ws is not None and ws.connected:
                opcode, frame = ws.recv_data(control_frame=True)
                self.heard_at = time.monotonic()
                if opcode == ABNF.OPCODE_CLOSE or (opcode == ABNF.OPCODE_BINARY and not frame):
                    break
                if opcode != ABNF.OPCODE_BINARY:
                    continue  # a pong (or the ping websocket-client has answered)
                ack = decode_v2(frame)
                if not isinstance(ack, dict):
                    continue
                if ASK_EVENT in ack:  # a question, not an acknowledgement (pgdash_agent.snapshots)
                    handler = self._handlers.get(ASK_EVENT)
                    if handler is not None:
                        handler(ack)
                    continue
                batch_id = ack.pop("id", None)
                with self._lock:
                    callback = self._callbacks.pop(batch_id, None)
                if callback is not None:
                    callback(ack)
        except Exception:
            pass  # a closed or broken connection: the sender requeues what was not acked
        finally:
            self.connected = False
            handler = self._handlers.get("disconnect")
            if handler is not None:
                handler()
