"""The Socket.IO namespaces: agents' protocol v1 (``/agent``: connect, ``batch``,
disconnect) and browsers' ``/ui`` (``watch`` a job or the jobs list; the live push sends
``job``, ``job_delta`` and ``jobs``)."""

from __future__ import annotations

import functools
from typing import Any, Callable

import msgspec
from flask import request
from engineio.base_server import BaseServer
from flask_socketio import SocketIO, join_room, leave_room, rooms

from pgdash_agent.wire import AGENT_NAMESPACE, ASK_EVENT, BATCH_EVENT, UI_NAMESPACE
from dashboard.ingest import limits
from dashboard.ingest.guard import LoginGuard
from dashboard.ingest.pipeline import Ingest, Refused
from dashboard.storage.writer import WriterStopped
from dashboard.web.joblist import jobs_payload
from dashboard.web.push import LivePush

CLIENT_DISCONNECT = BaseServer.reason.CLIENT_DISCONNECT


def register_agent_namespace(socketio: SocketIO, ingest: Ingest, guard: LoginGuard | None,
                             new_limits: Callable[[], limits.ConnectionLimits]) -> None:
    """Protocol v1: agents' batches as Socket.IO events, acknowledged once committed."""
    sessions: dict[str, tuple[str, int]] = {}  # sid -> (session, job id)
    rates: dict[str, limits.ConnectionLimits] = {}  # sid -> its rate limits
    asks: dict[str, Callable[[dict[str, Any]], None]] = {}  # sid -> the server's questions

    @socketio.on("connect", namespace=AGENT_NAMESPACE)
    def agent_connect(auth=None):
        try:
            address = guard.address(request.remote_addr, request.headers) if guard else \
                request.remote_addr
            sessions[request.sid] = ingest.connect(auth, address)
            rates[request.sid] = new_limits()
            asks[request.sid] = functools.partial(socketio.emit, ASK_EVENT, to=request.sid,
                                                  namespace=AGENT_NAMESPACE)
            ingest.asks.link(sessions[request.sid][0], asks[request.sid])
        except (Refused, WriterStopped) as exc:  # ingest's refusal log says a Refused once
            from flask_socketio import ConnectionRefusedError

            raise ConnectionRefusedError(
                str(exc) if isinstance(exc, Refused) else
                "the server is stopping; the agent connects again by itself") from None

    @socketio.on(BATCH_EVENT, namespace=AGENT_NAMESPACE)
    def agent_batch(payload=None):
        known = sessions.get(request.sid)
        if known is None:
            return {"ok": False, "error": "not connected: reconnect", "retry": True}
        ingest.counters["batches_v1"] += 1
        refusal = _over_rate(rates.get(request.sid), payload)
        if refusal is not None:
            ingest.counters["rate_limited_batches"] += 1
            ingest.hold(known[0], payload.get("events") if isinstance(payload, dict) else None,
                        refusal.retry_after)
            return {"ok": False, "error": refusal.reason, "retry": True,
                    "retry_after": refusal.retry_after}
        ack = ingest.batch(known[0], known[1], payload)
        # The job's id lets the agent name its page (v2 says it in the handshake).
        return {**ack, "job": known[1]} if ack.get("ok") else ack

    @socketio.on("disconnect", namespace=AGENT_NAMESPACE)
    def agent_disconnect(reason=None):
        rates.pop(request.sid, None)
        known = sessions.pop(request.sid, None)
        ask = asks.pop(request.sid, None)
        if known is not None:
            if ask is not None:
                ingest.asks.unlink(known[0], ask)
            # python-socketio's reason: the agent's own disconnect packet (best effort: its
            # client may close the socket before the packet is out), or its transport
            # closing under it (a killed process), a ping timeout...
            ingest.disconnect(known[0], goodbye=reason == CLIENT_DISCONNECT)


def _over_rate(rate: limits.ConnectionLimits | None, payload: Any) -> limits.Refusal | None:
    """Charge a batch to its connection's limits (before validation: garbage costs too)."""
    if rate is None:
        return None
    events = payload.get("events") if isinstance(payload, dict) else None
    count = len(events) if isinstance(events, list) else 1
    size = 0
    if rate.counts_bytes:  # what its JSON weighs (msgspec: a few us, json.dumps ~0.1 ms)
        try:
            size = len(msgspec.json.encode(payload, enc_hook=str))
        except (TypeError, ValueError, RecursionError, msgspec.EncodeError):
            size = 0  # unserialisable: validation refuses it anyway
    return rate.admit(count, size)


def register_ui_namespace(socketio: SocketIO, ingest: Ingest, pusher: LivePush) -> None:
    """Browsers watch the jobs list or one job; the live push sends them what changes."""
    @socketio.on("watch", namespace=UI_NAMESPACE)
    def ui_watch(what=None):
        if not isinstance(what, dict):
            return {"ok": False, "error": 'send {"jobs": true} or {"job": <id>}'}
        for room in rooms(namespace=UI_NAMESPACE):  # one watch per connection
            if room != request.sid:
                leave_room(room, namespace=UI_NAMESPACE)
        if what.get("jobs") is True:
            join_room("jobs", namespace=UI_NAMESPACE)
            socketio.emit("jobs", jobs_payload(ingest), to=request.sid, namespace=UI_NAMESPACE)
            return {"ok": True}
        job_id = what.get("job")
        if isinstance(job_id, bool) or not isinstance(job_id, int):
            return {"ok": False, "error": f"job must be an integer id, got {job_id!r:.40}"}
        if not pusher.watch(job_id, request.sid):
            return {"ok": False, "error": f"no job with id {job_id}"}
        return {"ok": True}
