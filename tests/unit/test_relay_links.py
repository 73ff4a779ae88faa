"""The agent's sender and its host's relay (pgdash_agent.relay): it reports to the server at
once, moves to the relay when one appears, and goes back to the server when the relay goes or
fails it; the relay's frames are checked like any other."""

from __future__ import annotations

import os
import threading
import time

import pytest
from websockets.sync.server import serve, unix_serve

from pgdash_agent import sender as sender_module
from pgdash_agent.config import RELAY_AUTO_RANKS, AgentConfig, relays
from pgdash_agent.outbox import Outbox
from pgdash_agent.sender import Sender
from pgdash_agent.wire import WireError, decode_relay, decode_v2, encode_relay, encode_v2
from tests.helpers.procs import wait_for


class Acks:
    """A v2 endpoint that takes the agent and acknowledges every batch (the server, or what
    a relay looks like to the agent), on TCP or on a Unix socket."""

    def __init__(self, unix: str | None = None):
        self.connections = 0
        self.batches = 0
        self._server = (unix_serve(self._handle, unix) if unix else
                        serve(self._handle, "127.0.0.1", 0))
        if unix is None:
            self.url = f"http://127.0.0.1:{self._server.socket.getsockname()[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _handle(self, ws) -> None:
        self.connections += 1
        decode_v2(ws.recv())  # auth
        ws.send(encode_v2({"ok": True, "job": 1}))
        for frame in ws:
            self.batches += 1
            ws.send(encode_v2({"id": decode_v2(frame)["id"], "ok": True, "stored": 1}))

    def close(self) -> None:
        self._server.shutdown()


@pytest.fixture
def fast_looks(monkeypatch):
    monkeypatch.setattr(sender_module, "RELAY_LOOK_S", 0.2)


def _sender(url: str, relay_path: str) -> tuple[Sender, Outbox]:
    config = AgentConfig(server=url, wire="v2", interval_s=0.05, reconnect_max_s=0.2)
    outbox = Outbox(1000)
    sender = Sender(config, outbox, lambda: {"session": "s", "job": "j", "rank": 0})
    sender.relay_path = relay_path
    sender.start()
    return sender, outbox


def _keep_sending(outbox: Outbox, stop: threading.Event) -> None:
    while not stop.is_set():
        outbox.put(time.time(), "heartbeat", {"groups": []})
        time.sleep(0.02)


def test_an_agent_moves_to_its_relay_when_it_appears_and_back_when_it_goes(tmp_path,
                                                                          fast_looks):
    server = Acks()
    where = str(tmp_path / "relay.sock")
    sender, outbox = _sender(server.url, where)
    stop = threading.Event()
    threading.Thread(target=_keep_sending, args=(outbox, stop), daemon=True).start()
    relay = None
    try:
        wait_for(lambda: sender.connected and server.batches >= 3, 20, "batches to the server")
        assert not sender.relayed  # no relay yet: straight to the server, at once
        relay = Acks(unix=where)
        wait_for(lambda: sender.relayed and relay.batches >= 3, 20, "the move to the relay")
        before = server.batches
        time.sleep(0.3)
        assert server.batches == before  # all through the relay now
        relay.close()
        os.unlink(where)
        relay = None
        wait_for(lambda: sender.connected and not sender.relayed and server.batches > before,
                 20, "batches to the server again")
    finally:
        stop.set()
        sender.stop()
        sender.join(5)
        server.close()
        if relay is not None:
            relay.close()
    assert sender.rejected == 0


def test_a_relay_that_cannot_be_reached_is_left_alone_for_a_while(tmp_path, fast_looks):
    server = Acks()
    where = tmp_path / "relay.sock"
    where.write_text("not a socket")  # (a relay killed and its file left, say)
    sender, outbox = _sender(server.url, str(where))
    outbox.put(time.time(), "heartbeat", {"groups": []})
    try:
        wait_for(lambda: sender.connected and server.batches >= 1, 20, "the server itself")
        time.sleep(0.6)  # several looks' worth
        assert not sender.relayed and server.connections == 1
    finally:
        sender.stop()
        sender.join(5)
        server.close()


def test_relay_frames_round_trip_and_bad_ones_say_what_is_wrong():
    frame = encode_relay([(3, b"\x81\xa2id\x01")], gone=[(4, True)])
    got = decode_relay(frame)
    assert got.relay == [(3, b"\x81\xa2id\x01")] and got.gone == [(4, True)] and got.closed == []
    assert decode_relay(encode_relay(closed=[(5, "refused")])).closed == [(5, "refused")]
    for bad, says in ((encode_v2({"relay": [[1, "text"]]}), "Expected `bytes`"),
                      (encode_v2({"relay": [[-1, b""]]}), ">= 0"),
                      (encode_v2({"agents": []}), "unknown field `agents`"),
                      ("a text frame", "binary MessagePack")):
        with pytest.raises(WireError, match=says):
            decode_relay(bad)


def test_a_relay_frame_holds_a_megabyte_of_frames_or_one_larger_frame_alone():
    from pgdash_agent.relay import chunks

    frames = [(1, b"a" * 5), (2, b"b" * 5), (3, b"c" * 20), (4, b"d" * 3), (5, b"e" * 8)]
    parts = chunks(frames, 10)
    assert [[n for n, _ in part] for part in parts] == [[1, 2], [3], [4], [5]]
    assert [item for part in parts for item in part] == frames  # in order, none lost
    assert chunks([], 10) == []


def test_sockets_other_relays_left_behind_are_swept_and_live_ones_kept(tmp_path):
    import socket

    from pgdash_agent.relay import _sweep

    def bound(name: str) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(tmp_path / name))
        return sock

    dead = bound("relay-dead.sock")
    dead.close()  # its file stays, nobody listens: a relay killed outright
    live = bound("relay-live.sock")
    live.listen()
    new = bound("relay-new.sock")
    new.close()
    (tmp_path / "reader-x.lock").write_text("")
    an_hour_ago = time.time() - 3600
    for name in ("relay-dead.sock", "relay-live.sock", "reader-x.lock"):
        os.utime(tmp_path / name, (an_hour_ago, an_hour_ago))
    try:
        assert _sweep(str(tmp_path / "relay-mine.sock")) == 1
    finally:
        live.close()
    # the dead one gone; the live one, one too new to judge and what is not a relay's kept
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        ["reader-x.lock", "relay-live.sock", "relay-new.sock"]


def test_big_jobs_relay_by_default_and_the_setting_is_checked():
    """PGDASH_RELAY=auto (the default) relays jobs of RELAY_AUTO_RANKS ranks or more; 1 any job
    with more than one rank on the host; 0 none; anything else is refused with the choices."""
    assert AgentConfig.from_env({}).relay == "auto"
    assert [AgentConfig.from_env({"PGDASH_RELAY": v}).relay
            for v in ("1", "on", "0", "False", " AUTO ")] == ["on", "on", "off", "off", "auto"]
    with pytest.raises(ValueError, match="PGDASH_RELAY must be auto, 1 or 0, got 'maybe'"):
        AgentConfig.from_env({"PGDASH_RELAY": "maybe"})
    big, small = RELAY_AUTO_RANKS, RELAY_AUTO_RANKS - 1
    assert relays("auto", big, "8") and relays("auto", big, None)
    assert not relays("auto", small, "8") and not relays("auto", None, "8")
    assert not relays("auto", big, "1")  # a rank alone on its host: nothing to carry
    assert relays("on", 2, "2") and relays("on", None, None) and not relays("on", 2, "1")
    assert not relays("off", big, "8")
