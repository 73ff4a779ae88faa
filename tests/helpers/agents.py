"""A Socket.IO agent (protocol v1) on a real server, for tests that speak the wire."""


import socketio

from pgdash_agent.wire import AGENT_NAMESPACE, PROTOCOL_VERSION


def agent_client(url, session="s1", job="edge", rank=0, token=None, auth=None):
    client = socketio.Client(reconnection=False)
    reasons = []
    client.on("connect_error", reasons.append, namespace=AGENT_NAMESPACE)
    try:
        client.connect(url, namespaces=[AGENT_NAMESPACE], transports=["websocket"],
                       auth=auth or {"v": PROTOCOL_VERSION, "session": session, "job": job,
                                     "rank": rank, "host": "h", "pid": 1, "token": token})
    except socketio.exceptions.ConnectionError:
        client.disconnect()
        raise AssertionError(f"refused: {reasons}") from None
    return client


def send(client, events, v=PROTOCOL_VERSION):
    return client.call("batch", {"v": v, "events": events}, namespace=AGENT_NAMESPACE,
                       timeout=10)


def ev(seq, kind, body, t=100.0):
    return {"seq": seq, "t": t, "kind": kind, "body": body}


HELLO = {"job": "edge", "rank": 0, "world_size": 1, "host": "h", "pid": 1, "backend": "gloo"}
