"""Closing the test process's own connections to a server for sure. A socket left open is
closed by the garbage collector, later, and its ResourceWarning then fails whichever test is
running at that moment (pytest's PytestUnraisableExceptionWarning)."""

from __future__ import annotations


def disconnect(client) -> None:
    """``client.disconnect()`` of a python-socketio client (websocket transport), then its
    socket closed whatever happened before.

    disconnect() queues Engine.IO's close packet, then closes the websocket; the server
    answers that packet with a close frame at once. When the client's read loop takes that
    frame first (the disconnecting thread lost the CPU: a busy machine, agents closed on
    several threads at once), websocket-client marks the connection closed without closing
    its socket, and the ``ws.close()`` that follows returns early: the socket is left to the
    garbage collector. So is the socket of a connection whose read loop gave up by itself (a
    timeout, a close by the server), after which disconnect() does nothing at all."""
    try:
        client.disconnect()
    finally:
        ws = getattr(client.eio, "ws", None)  # engineio's websocket-client WebSocket
        if ws is not None:
            ws.shutdown()  # closes the socket if it is still open; a no-op otherwise
