"""The sender thread: the only owner of the agent's Socket.IO client.

python-socketio's ``emit`` is not thread-safe and does not buffer while disconnected, so one
thread owns the client, sends batches from the :class:`~agent.outbox.Outbox`, keeps at most a
few unacknowledged batches on the wire (Socket.IO has no backpressure of its own), and after any
disconnect puts every unacknowledged event back in the outbox to be sent again. The server
drops what it already stored, so delivery is exactly-once as far as the stored log is concerned.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import random
import threading
import time
from typing import Any, Callable

from pgdash_agent.compact import NotServed
from pgdash_agent.config import AgentConfig
from pgdash_agent.outbox import Outbox
from pgdash_agent.wire import (AGENT_NAMESPACE, ASK_EVENT, BATCH_EVENT, PROTOCOL_VERSION, Ack,
                               Event)

log = logging.getLogger("pgdash.agent")

# An ack this many PGDASH_ACK_TIMEOUT_S late drops the connection even from a server that
# answers pings (a batch it may have lost is sent again on a new one).
SLOW_ACK_LIMIT = 6
# Its host's relay (pgdash_agent.relay): a rank connected to the server itself (the relay was
# not there yet: the host's first rank starts it as the ranks attach, and a rank's first
# reports do not wait for it) looks for it this often, and moves to it once nothing it sent
# is unacknowledged; after the relay failed it (it could not connect through it, or an ack
# came late through it), it goes to the server itself for this long.
RELAY_LOOK_S = 2.0
RELAY_AVOID_S = 60.0
GOODBYE_WAIT_S = 1.0  # how long a v1 disconnect waits for its goodbye to be written


def socketio_client(ca_file: str | None = None):
    """A protocol v1 client: python-socketio, the ``/agent`` namespace."""
    import socketio  # imported here so that merely importing the agent stays cheap

    class Client(socketio.Client):
        def disconnect(self) -> None:
            """Say goodbye before closing: the server gives a rank whose agent closed its
            connection a silent rank's patience, one whose socket merely closed (a killed
            process) 1.5 s (dashboard.diagnosis.core). python-socketio queues its disconnect
            packet and closes the socket at once, so the packet reached the server 8 times in
            20; here the packet is written first (GOODBYE_WAIT_S at most)."""
            try:
                from socketio import packet

                for namespace in self.namespaces:
                    self._send_packet(self.packet_class(packet.DISCONNECT, namespace=namespace))
                queued = self.eio.queue
                deadline = time.monotonic() + GOODBYE_WAIT_S
                while queued.unfinished_tasks and time.monotonic() < deadline:
                    time.sleep(0.01)
                self.eio.disconnect()
            except Exception:  # another python-socketio: its own disconnect
                super().disconnect()
            finally:
                # Where the read thread took the server's close frame first, websocket-client
                # marked the connection closed and left its socket open (to the garbage
                # collector: a ResourceWarning in the training process). A no-op otherwise.
                try:
                    ws = getattr(self.eio, "ws", None)
                    if ws is not None:
                        ws.shutdown()
                except Exception:
                    pass

    # wss:// is verified against the system's CAs, or only against PGDASH_CA_FILE when set.
    extra = {"sslopt": {"ca_certs": ca_file}} if ca_file else {}
    return Client(reconnection=False, handle_sigint=False, logger=False,
                  engineio_logger=False, websocket_extra_options=extra)


def _tls_problem(server: str, ca_file: str | None) -> str | None:
    """Why a TLS handshake with ``server`` fails, if it does (the Socket.IO client only says
    "Connection error"). Runs on the sender thread after a failed connect, never in training."""
    import socket
    import ssl
    from urllib.parse import urlparse

    url = urlparse(server)
    try:
        context = ssl.create_default_context(cafile=ca_file)
        with socket.create_connection((url.hostname, url.port or 443), timeout=5) as sock:
            with context.wrap_socket(sock, server_hostname=url.hostname):
                return None
    except ssl.SSLCertVerificationError as exc:
        hint = ("PGDASH_CA_FILE does not hold the CA that signed it" if ca_file else
                "if it is self-signed, set PGDASH_CA_FILE to the CA (or certificate) file")
        return f"the server's certificate is not trusted ({exc.verify_message}): {hint}"
    except ssl.SSLError as exc:
        return f"TLS handshake failed: {exc.reason or exc}"
    except (OSError, ValueError):
        return None


def compact_client(ca_file: str | None = None):
    """A protocol v2 client: MessagePack frames on a plain websocket (pgdash_agent.compact)."""
    from pgdash_agent.compact import CompactClient

    # wss:// is verified against the system's CAs, or only against PGDASH_CA_FILE when set.
    return CompactClient(sslopt={"ca_certs": ca_file} if ca_file else None)


class Sender(threading.Thread):
    """Sends the outbox to the server; reconnects with backoff; never raises."""

    def __init__(self, config: AgentConfig, outbox: Outbox, auth: Callable[[], dict[str, Any]],
                 client_factory: Callable[[], Any] | None = None,
                 on_ask: Callable[[Any], None] | None = None):
        super().__init__(name="pgdash-sender", daemon=True)
        self.config = config
        self.outbox = outbox
        self._auth = auth
        self._on_ask = on_ask  # the server's questions (pgdash_agent.snapshots), on the client's thread
        # PGDASH_WIRE: v2 (the compact path) unless told otherwise; "auto" falls back to v1
        # for good when the server is too old to serve v2.
        self._may_fall_back = client_factory is None and config.wire == "auto"
        if client_factory is None:
            kind = socketio_client if config.wire == "v1" else compact_client
            client_factory = functools.partial(kind, config.ca_file)
        self._client_factory = client_factory
        self.wire = config.wire
        self._client = None
        self._acks: queue.Queue[tuple[int, Any]] = queue.Queue()
        self._inflight: dict[int, tuple[float, list[Event]]] = {}
        self._batch_id = 0
        self._stopping = threading.Event()
        self._lost = threading.Event()  # set by the client's thread when this connection ends
        self.connected = False
        self.rejected = 0  # events the server refused as invalid (never resent)
        self.last_error: str | None = None
        # The server said no to the last connection attempt (wrong token, too many guesses):
        # a flush at exit then cannot deliver anything, and does not wait for it.
        self.refused = False
        # The server took this agent and said (or could not say: an older server) which job
        # it stored it under: its id is in the v2 handshake's answer and in v1 acks.
        self.accepted = False
        self.job_id: int | None = None
        self._warned = False
        self._quiet_until = 0.0  # monotonic; the server asked us to wait (rate limit)
        self._probed_at: float | None = None  # monotonic: the last liveness probe (_why_drop)
        self.slow_acks = 0  # times an ack was late from a server that still answered
        # Where its host's relay listens, when it has one (set before start: pgdash_agent.core);
        # whether this connection goes through it; when to look for it or try it again.
        self.relay_path: str | None = None
        self.relayed = False
        self._relay_look_at = 0.0
        self._relay_avoid_until = 0.0

    # -- public, any thread ------------------------------------------------------------------

    def idle(self) -> bool:
        """True when everything put so far has been acknowledged."""
        return not self._inflight and len(self.outbox) == 0 and self._acks.empty()

    def stop(self) -> None:
        self._stopping.set()
        with self.outbox.ready:
            self.outbox.ready.notify_all()

    # -- the thread --------------------------------------------------------------------------

    def run(self) -> None:
        backoff = 0.25
        while not self._stopping.is_set():
            try:
                if not self.connected:
                    if self._connect():
                        backoff = 0.25
                    else:
                        self._stopping.wait(backoff * (0.5 + random.random()))
                        backoff = min(backoff * 2, self.config.reconnect_max_s)
                    continue
                self._pump()
            except Exception as exc:  # never let the thread die: training must not notice
                self._note_error(f"sender: {type(exc).__name__}: {exc}")
                self._drop_connection()
        self._drop_connection()

    def _pump(self) -> None:
        self._handle_acks()
        if self._lost.is_set():
            self._drop_connection()
            return
        now = time.monotonic()
        oldest = min((sent for sent, _ in self._inflight.values()), default=None)
        if oldest is None or now - oldest <= self.config.ack_timeout_s:
            self._probed_at = None  # acks are on time (again)
        elif (why := self._why_drop(now, oldest)) is not None:
            self._note_error(why)
            if self.relayed:  # the relay answers pings, not its server: go there directly
                self._relay_avoid_until = now + RELAY_AVOID_S
            self._drop_connection()
            return
        if oldest is None and self.relay_path is not None and not self.relayed \
                and now >= self._relay_look_at:
            self._relay_look_at = now + RELAY_LOOK_S
            if self._relay() is not None:  # its host's relay is there now: move to it
                self._drop_connection()
                return
        linger = self.config.interval_s
        while len(self._inflight) < self.config.max_inflight_batches and \
                now >= self._quiet_until and self.outbox.due(linger):
            events = self.outbox.take(self.config.max_batch_events)
            if not events:
                break
            self._send(events)
        self.outbox.wait(0.05, linger, hold=len(self._inflight) >= self.config.max_inflight_batches
                         or time.monotonic() < self._quiet_until)

    def _why_drop(self, now: float, oldest: float) -> str | None:
        """Why a connection whose acknowledgement is late is given up, or None while it still
        reaches a live server that is only behind: a v2 link is probed with a websocket ping,
        and while the server answers within ack_timeout_s its batches are waited for (up to
        SLOW_ACK_LIMIT timeouts), not sent again on a new connection: a reconnect per agent
        would add an admission and a resend to an overloaded server's work. A v1 client has
        no probe: dropped at the first timeout, as before."""
        client, timeout = self._client, self.config.ack_timeout_s
        late = f"no acknowledgement within {now - oldest:.0f} s (PGDASH_ACK_TIMEOUT_S)"
        probe = getattr(client, "probe", None)
        if probe is None or now - oldest > SLOW_ACK_LIMIT * timeout:
            return f"{late}; reconnecting"
        probed = self._probed_at
        if probed is not None and client.heard_at < probed:
            if now - probed <= timeout:
                return None  # the answer to the probe may still come
            return f"{late} and no answer to a ping; reconnecting"
        if probed is None or now - probed > timeout:
            self.slow_acks += probed is None
            self.last_error = f"{late}, but the server answers pings: it is behind; waiting"
            self._probed_at = now
            probe()
        return None

    def _send(self, events: list[Event]) -> None:
        self._batch_id += 1
        batch_id = self._batch_id
        self._inflight[batch_id] = (time.monotonic(), events)
        self._client.emit(BATCH_EVENT, {"v": PROTOCOL_VERSION, "events": events},
                          namespace=AGENT_NAMESPACE,
                          callback=lambda ack=None, _id=batch_id: self._on_ack(_id, ack))

    def _on_ack(self, batch_id: int, ack: Any) -> None:  # runs on the client's thread
        self._acks.put((batch_id, ack))
        with self.outbox.ready:
            self.outbox.ready.notify_all()

    def _handle_acks(self) -> None:
        while True:
            try:
                batch_id, ack = self._acks.get_nowait()
            except queue.Empty:
                return
            entry = self._inflight.pop(batch_id, None)
            if entry is None:
                continue  # ack of a batch already requeued after a disconnect
            self._apply_ack(entry[1], ack)

    def _apply_ack(self, events: list[Event], ack: Ack | Any) -> None:
        if not isinstance(ack, dict):
            self.outbox.requeue(events)
            return
        if ack.get("ok"):
            self._note_job(ack.get("job"))
            self.accepted = True
            rejected = ack.get("rejected") or []
            if rejected:
                self.rejected += len(rejected)
                self._note_error(f"server rejected {len(rejected)} event(s): {rejected[0]}")
            return
        if ack.get("retry"):
            self.outbox.requeue(events)
            wait = ack.get("retry_after")
            if isinstance(wait, (int, float)) and not isinstance(wait, bool) and wait > 0:
                # Rate-limited or overloaded: send nothing for a while (bounded, whatever the
                # server says), and never less than an earlier refusal asked.
                self._quiet_until = max(self._quiet_until,
                                        time.monotonic() + min(float(wait), 30.0))
            self._note_error(f"server asked to retry: {ack.get('error')}")
        else:
            self.rejected += len(events)
            self._note_error(f"server refused a batch: {ack.get('error')}")

    def _connect(self) -> bool:
        # One event per connection: a late disconnect of the one before (its reader thread
        # ending after this one connected) must not end this one.
        self._lost = lost = threading.Event()
        client = self._client_factory()

        @client.on("disconnect", namespace=AGENT_NAMESPACE)
        def _on_disconnect(*_args):
            lost.set()
            with self.outbox.ready:
                self.outbox.ready.notify_all()

        if self._on_ask is not None:
            client.on(ASK_EVENT, self._on_ask, namespace=AGENT_NAMESPACE)
        refusals: list[Any] = []  # the server's reason, when it refuses us
        client.on("connect_error", refusals.append, namespace=AGENT_NAMESPACE)
        via = self._relay()
        try:
            client.connect(self.config.server, namespaces=[AGENT_NAMESPACE],
                           auth=self._auth(), transports=["websocket"],
                           wait_timeout=self.config.connect_timeout_s,
                           **({} if via is None else {"via": via}))
        except Exception as exc:
            if via is not None and not refusals:  # the relay's fault: the server itself
                self._relay_avoid_until = time.monotonic() + RELAY_AVOID_S
                try:
                    client.disconnect()
                except Exception:
                    pass
                return self._connect()
            if self._may_fall_back and isinstance(exc, NotServed):
                log.info("pgdash: %s is an older server; speaking protocol v1 to it",
                         self.config.server)
                self._client_factory = functools.partial(socketio_client, self.config.ca_file)
                self._may_fall_back, self.wire = False, "v1"
                return self._connect()
            self.refused = bool(refusals)
            reason = refusals[-1] if refusals else f"{type(exc).__name__}: {exc}"
            if isinstance(reason, dict):
                reason = reason.get("message", reason)
            if str(self.config.server).startswith("https://"):
                reason = _tls_problem(self.config.server, self.config.ca_file) or reason
            if self.refused:
                self._note_error(f"cannot connect to {self.config.server} (PGDASH_SERVER): "
                                 f"{reason}")
            else:
                self._note_error(f"cannot reach the pgdash server at {self.config.server} "
                                 f"({reason}); training continues, and the agent keeps "
                                 "trying. Start the server with `pgdash serve`, or set "
                                 "PGDASH_SERVER to where it runs")
            try:
                client.disconnect()
            except Exception:
                pass
            return False
        self._client = client
        self._probed_at = None
        self.relayed = via is not None
        self._relay_look_at = time.monotonic() + RELAY_LOOK_S
        self.connected = True
        self.refused = False
        self._note_job(getattr(client, "job_id", None))
        self.accepted = self.accepted or self.job_id is not None
        self._warned = False
        log.info("pgdash: connected to %s", self.config.server)
        return True

    def _relay(self) -> str | None:
        """Where to connect through its host's relay now, or None: to the server itself (no
        relay here yet, it failed lately, protocol v1)."""
        where = self.relay_path
        if where is None or self.wire == "v1" or time.monotonic() < self._relay_avoid_until:
            return None
        return where if os.path.exists(where) else None

    def _note_job(self, job_id: Any) -> None:
        if isinstance(job_id, int) and not isinstance(job_id, bool) and job_id > 0:
            self.job_id = job_id

    def _drop_connection(self) -> None:
        """Forget the connection; everything unacknowledged goes back to the outbox."""
        self._handle_acks()
        pending = [ev for _id in sorted(self._inflight) for ev in self._inflight[_id][1]]
        self._inflight.clear()
        self.outbox.requeue(pending)
        client, self._client = self._client, None
        self.connected = False
        if client is not None:
            try:
                client.disconnect()
            except Exception:
                pass

    def _note_error(self, message: str) -> None:
        self.last_error = message
        if not self._warned:  # one line per outage, not one per retry
            log.warning("pgdash: %s", message)
            self._warned = True
