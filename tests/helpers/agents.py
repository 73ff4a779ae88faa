"""Agents on a real server, for tests that speak the wire: a Socket.IO one (protocol v1), and
a plain websocket speaking protocol v2."""


import socketio
import websocket

from pgdash_agent.wire import (AGENT_NAMESPACE, AGENT_V2_PATH, PROTOCOL_V2, PROTOCOL_VERSION,
                               decode_v2, encode_v2)
from tests.helpers.closing import disconnect


def agent_client(url, session="s1", job="edge", rank=0, token=None, auth=None):
    client = socketio.Client(reconnection=False)
    reasons = []
    client.on("connect_error", reasons.append, namespace=AGENT_NAMESPACE)
    try:
        client.connect(url, namespaces=[AGENT_NAMESPACE], transports=["websocket"],
                       auth=auth or {"v": PROTOCOL_VERSION, "session": session, "job": job,
                                     "rank": rank, "host": "h", "pid": 1, "token": token})
    except socketio.exceptions.ConnectionError:
        disconnect(client)
        raise AssertionError(f"refused: {reasons}") from None
    return client


def send(client, events, v=PROTOCOL_VERSION):
    return client.call("batch", {"v": v, "events": events}, namespace=AGENT_NAMESPACE,
                       timeout=10)


def ev(seq, kind, body, t=100.0):
    return {"seq": seq, "t": t, "kind": kind, "body": body}


HELLO = {"job": "edge", "rank": 0, "world_size": 1, "host": "h", "pid": 1, "backend": "gloo"}


def v2_connect(server_url: str, path: str = AGENT_V2_PATH, **auth):
    ws = websocket.create_connection("ws" + server_url[len("http"):] + path, timeout=20)
    ws.send_binary(encode_v2({"auth": {"v": PROTOCOL_V2, "session": auth.pop("session", "s1"),
                                       "job": "compact", "rank": 0, "host": "h", "pid": 1,
                                       **auth}}))
    return ws, decode_v2(ws.recv())
