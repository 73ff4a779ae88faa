"""The compact agent path (protocol v2) beside Socket.IO (v1): same events, same log, clear
errors for bad frames, and agents that fall back to v1 on an older server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import websocket

from pgdash_agent.reader import NOT_YET
from pgdash_agent.wire import (AGENT_NAMESPACE, PROTOCOL_VERSION, READER_PATH, decode_v2,
                               encode_v2)
from tests.helpers.closing import disconnect as disconnect_client
from tests.helpers.procs import (JOBS, ROOT, ServerProcess, job_by_name, launch_job,
                                 stored_events, wait_for, wait_job)
from tests.helpers.agents import HELLO, ev, v2_connect


def closed_by_server(ws) -> bool:
    try:
        return ws.recv() in ("", b"")  # the close frame
    except websocket.WebSocketConnectionClosedException:
        return True
    finally:
        ws.shutdown()  # close() skips the socket once the peer has closed the connection


def send(ws, batch_id, events):
    ws.send_binary(encode_v2({"id": batch_id, "events": events}))
    return decode_v2(ws.recv())


@pytest.mark.parametrize("wire", ["v2", "v1"])
def test_a_real_job_is_stored_the_same_over_either_protocol(server, tmp_path, wire):
    procs = launch_job("loop_job.py", 2, server.url, f"wire-{wire}", tmp_path,
                       env={"PGDASH_WIRE": wire}, args=["30", "0.01"])
    assert wait_job(procs, 120, tmp_path) == [0, 0]
    job = wait_for(lambda: (j := job_by_name(server, f"wire-{wire}")) and
                   j["status"] == "finished" and j, 30, "the job to finish")
    rows = server.api(f"/api/jobs/{job['id']}/collectives?group=0&op=all_reduce")["collectives"]
    assert sorted((r["rank"], r["count"]) for r in rows) == [(0, 30), (1, 30)]
    assert server.api(f"/api/jobs/{job['id']}/findings")["findings"] == []


def test_bad_frames_get_reasons_and_the_connection_carries_on(server):
    ws, hello = v2_connect(server.url)
    try:
        assert hello["ok"] is True and isinstance(hello["job"], int)
        ws.send("not binary")
        assert "binary MessagePack" in decode_v2(ws.recv())["error"]
        ws.send_binary(b"\xc1\xc1 not msgpack")
        assert "not valid MessagePack" in decode_v2(ws.recv())["error"]
        ws.send_binary(encode_v2({"events": []}))
        assert "integer id" in decode_v2(ws.recv())["error"]
        ack = send(ws, 7, [ev(1, "hello", HELLO), ev(2, "group", {"name": "0", "ranks": "all"}),
                           ev(3, "group", {"name": "0", "ranks": [0]})])
        assert ack["id"] == 7 and ack["ok"] and ack["stored"] == 2
        assert ack["rejected"] == [{"seq": 2, "error": "events[1].body.ranks: Expected "
                                                       "`array`, got `str`"}]
        # Resent after a reconnect: already stored, nothing doubles.
        assert send(ws, 8, [ev(3, "group", {"name": "0", "ranks": [0]})])["stored"] == 0
    finally:
        ws.close()
    job = job_by_name(server, "compact")
    detail = server.api(f"/api/jobs/{job['id']}")
    assert [g["ranks"] for g in detail["groups"]] == [[0]]


def test_frames_larger_than_a_read_from_two_agents_at_once_arrive_whole(server):
    """The front reads every agent's connection into one buffer of READ_BUFFER bytes: frames
    several reads long, from two agents whose reads interleave, each arrive as sent."""
    from dashboard.ingest.tls import READ_BUFFER

    links = [v2_connect(server.url, session=f"big{i}", rank=i, job="big-frames")[0]
             for i in range(2)]
    texts = {i: [f"rank {i} error {k}: " + chr(ord("a") + 3 * i + k) * 50_000 for k in range(3)]
             for i in range(2)}
    try:
        frames = []
        for i in range(2):
            hello = dict(HELLO, job="big-frames", rank=i, world_size=2)
            errors = [ev(2 + k, "error", {"where": "train", "error_type": "RuntimeError",
                                          "error": text}) for k, text in enumerate(texts[i])]
            frames.append(encode_v2({"id": 1, "events": [ev(1, "hello", hello), *errors]}))
            assert len(frames[-1]) > 4 * READ_BUFFER
        for ws, frame in zip(links, frames):  # both sent before either is answered
            ws.send_binary(frame)
        for ws in links:
            ack = decode_v2(ws.recv())
            assert ack["id"] == 1 and ack["ok"] and ack["stored"] == 4, ack
    finally:
        for ws in links:
            ws.close()
    job = job_by_name(server, "big-frames")
    stored: dict[str, list[str]] = {}
    for e in stored_events(server.db_url, [job["id"]]):
        errors = stored.setdefault(e["session"], [])
        if e["kind"] == "error":
            errors.append(e["body"]["error"])
    assert stored == {f"big{i}": texts[i] for i in range(2)}


def test_a_refused_agent_is_told_why(tmp_path):
    srv = ServerProcess(f"sqlite:///{tmp_path / 'db.sqlite'}", extra=["--token", "s3cret"],
                        log_path=tmp_path / "server.log").start()
    try:
        for auth, reason in (({"token": "wrong"}, "PGDASH_TOKEN"), ({"v": 99}, "protocol v99"),
                             ({"rank": "zero"}, "auth.rank: Expected")):
            ws, reply = v2_connect(srv.url, **{"token": "s3cret", **auth})
            assert reply["ok"] is False and reason in reply["error"]
            assert closed_by_server(ws)
        ws, reply = v2_connect(srv.url, token="s3cret")
        assert reply["ok"] is True
        ws.close()
    finally:
        srv.stop()


def test_an_agent_falls_back_to_v1_on_a_server_without_v2(tmp_path):
    """An older server has no /agent/v2: the agent's upgrade gets a 404 and it speaks v1."""
    old = ServerProcess(f"sqlite:///{tmp_path / 'old.db'}", log_path=tmp_path / "old.log")
    port = old.port
    with open(tmp_path / "old.log", "ab") as log:
        old.proc = subprocess.Popen([sys.executable, str(JOBS / "old_server.py"), str(port),
                                     old.db_url], stdout=log, stderr=subprocess.STDOUT,
                                    cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        wait_for(lambda: old.api("/api/jobs") is not None, 30, "the old server")
        with pytest.raises(websocket.WebSocketBadStatusException):  # it really has no v2
            v2_connect(old.url)
        procs = launch_job("loop_job.py", 2, old.url, "old-server", tmp_path,
                           args=["10", "0.01"])
        assert wait_job(procs, 120, tmp_path) == [0, 0]
        job = wait_for(lambda: (j := job_by_name(old, "old-server")) and
                       j["status"] == "finished" and j, 30, "the job to finish")
        rows = old.api(f"/api/jobs/{job['id']}/collectives?group=0&op=all_reduce")
        # This server serves Socket.IO only: what arrived came over v1, after the 404.
        assert sorted((r["rank"], r["count"]) for r in rows["collectives"]) == [(0, 10),
                                                                                  (1, 10)]
    finally:
        old.stop()


def test_v2_frames_round_trip_what_v1_sends():
    events = [ev(1, "hello", HELLO), ev(2, "exit", {"clean": True, "reason": "é ✓"})]
    assert decode_v2(encode_v2({"id": 1, "events": events})) == json.loads(
        json.dumps({"id": 1, "events": events}))


def test_sigterm_with_agents_connected_stops_cleanly_and_loses_no_rank(tmp_path):
    """A rolling restart: SIGTERM with v2 agents connected ends the process at once (it used to
    wait 30 s on disconnects queued for a writer that had stopped) and records no disconnect,
    so that after the restart the ranks are not taken for lost; what was acknowledged stays."""
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    srv = ServerProcess(db, log_path=tmp_path / "server.log").start()
    sockets = []
    try:
        for rank in range(2):
            ws, hello = v2_connect(srv.url, session=f"s{rank}", job="restart", rank=rank)
            assert hello["ok"]
            sockets.append(ws)
            ack = send(ws, 1, [ev(1, "hello", {**HELLO, "job": "restart", "rank": rank,
                                               "world_size": 2}),
                               ev(2, "heartbeat", {"groups": []})])
            assert ack["ok"] and ack["stored"] == 2
        srv.proc.terminate()
        # Bounded only so that a regression fails instead of hanging the suite.
        assert srv.proc.wait(timeout=25) == 0
    finally:
        for ws in sockets:
            ws.shutdown()
        srv.kill()
    kinds = [e["kind"] for e in stored_events(db)]
    assert kinds.count("hello") == 2 and kinds.count("heartbeat") == 2
    assert "disconnect" not in kinds


# A process that connects as an agent, then is killed: its kernel closes the socket, nobody
# says goodbye. argv: server url, session, wire.
KILLED_AGENT = r'''
import os, signal, sys
url, session, wire = sys.argv[1:4]
if wire == "v2":
    from tests.helpers.agents import v2_connect
    ws, hello = v2_connect(url, session=session, job="killed")
    assert hello["ok"], hello
else:
    from tests.helpers.agents import agent_client
    agent_client(url, session=session, job="killed")
print("connected", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
'''


@pytest.mark.parametrize("wire", ["v2", "v1"])
def test_the_server_tells_an_agent_that_said_goodbye_from_a_killed_process(server, wire):
    """An agent that closes its connection itself was alive to do it: rank_lost gives it a
    silent rank's patience (dashboard.diagnosis.core: reconnect_grace); a killed process
    cannot say goodbye, and is named after the short grace as before."""
    if wire == "v2":
        ws, hello = v2_connect(server.url, session="leaves", job="leaves")
        assert hello["ok"] is True
        ws.close()  # a close frame, as the agent's CompactClient.disconnect sends
    else:  # Socket.IO's disconnect packet, sent before the socket closes (socketio.Client's
        # disconnect() may close it first: then the server sees a transport close)
        ws = websocket.create_connection(
            "ws" + server.url[len("http"):] + "/socket.io/?EIO=4&transport=websocket",
            timeout=20)
        assert ws.recv().startswith("0")  # Engine.IO's open
        ws.send(f"40{AGENT_NAMESPACE}," + json.dumps(
            {"v": PROTOCOL_VERSION, "session": "leaves", "job": "leaves", "rank": 0,
             "host": "h", "pid": 1}))
        assert ws.recv().startswith(f"40{AGENT_NAMESPACE},"), "not admitted"
        ws.send(f"41{AGENT_NAMESPACE},")
        ws.close()
    killed = subprocess.run([sys.executable, "-c", KILLED_AGENT, server.url, "killed", wire],
                            cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert killed.returncode == -9 and "connected" in killed.stdout, killed.stderr

    def disconnect(name):
        job = job_by_name(server, name)
        return next((ev["body"] for ev in stored_events(server.db_url, [job["id"]])
                     if ev["kind"] == "disconnect"), None) if job else None

    assert wait_for(lambda: disconnect("leaves"), 30, "its disconnect stored") == \
        {"goodbye": True}
    assert wait_for(lambda: disconnect("killed") is not None, 30, "its disconnect stored")
    assert disconnect("killed") == {}


def test_the_agents_v1_client_says_goodbye_every_time(server):
    """python-socketio's own disconnect() closes the socket before its packet is out (8 of
    20 reached the server): the agent's client writes it first."""
    from pgdash_agent.sender import socketio_client

    for i in range(4):
        client = socketio_client()
        client.connect(server.url, namespaces=[AGENT_NAMESPACE], transports=["websocket"],
                       auth={"v": PROTOCOL_VERSION, "session": f"bye{i}", "job": f"bye{i}",
                             "rank": 0, "host": "h", "pid": 1})
        disconnect_client(client)
    for i in range(4):
        job = wait_for(lambda: job_by_name(server, f"bye{i}"), 30, "the job")
        bodies = wait_for(lambda: [ev["body"] for ev in stored_events(server.db_url, [job["id"]])
                                   if ev["kind"] == "disconnect"], 30, "its disconnect stored")
        assert bodies == [{"goodbye": True}], i


def test_a_host_reader_is_admitted_only_for_a_rank_placed_here_and_sends_only_what_was_asked(
        server):
    """pgdash_agent.reader's connection: its hello is its rank's auth plus its pid; it may
    send readings of questions it was asked, nothing else, and nothing else is stored."""
    early, refused = v2_connect(server.url, READER_PATH, session="rd", job="rd", reader=77)
    assert refused["ok"] is False and NOT_YET in refused["error"], refused  # asked again later
    assert closed_by_server(early)
    agent, hello = v2_connect(server.url, session="rd", job="rd")
    assert hello["ok"] is True
    no_pid, refused = v2_connect(server.url, READER_PATH, session="rd", job="rd")
    assert refused["ok"] is False and "reader pid" in refused["error"], refused
    no_pid.shutdown()
    reader, hello = v2_connect(server.url, READER_PATH, session="rd", job="rd", reader=77)
    assert hello == {"ok": True, "job": hello["job"]}, hello
    reader.send_binary(encode_v2({"read": {"ask": "nobody-asked", "for_rank": 0,
                                           "peer_dump": "Thread 1"}}))
    answer = decode_v2(reader.recv())
    assert answer["ok"] is False and "was not asked" in answer["error"], answer
    reader.send_binary(encode_v2({"read": {"ask": "x", "for_rank": -1}}))
    answer = decode_v2(reader.recv())
    assert answer["ok"] is False and "read.for_rank" in answer["error"], answer
    reader.send_binary(encode_v2({"id": 1, "events": [ev(1, "heartbeat", {})]}))
    answer = decode_v2(reader.recv())
    assert answer["ok"] is False and "only 'read' and 'boards' frames" in answer["error"], \
        answer
    # Its last words: the boards of its host's ranks (pgdash_agent.board), checked and stored.
    reader.send_binary(encode_v2({"boards": {"t": 5.0, "boards": [
        {"rank": 0, "pid": 7, "alive": True, "groups": [{"group": "0", "entered": -1,
                                                          "completed": 0}]}]}}))
    answer = decode_v2(reader.recv())
    assert answer["ok"] is False and "boards.boards[0].groups[0].entered" in answer["error"], \
        answer
    reader.send_binary(encode_v2({"boards": {"t": 5.0, "boards": [
        {"rank": 0, "pid": 7, "alive": False, "groups": [{"group": "0", "entered": 3,
                                                           "completed": 2}]}]}}))
    assert send(agent, 1, [ev(1, "hello", HELLO)])["ok"] is True
    job = job_by_name(server, "rd")
    events = wait_for(lambda: (got := stored_events(server.db_url, [job["id"]])) and any(
        e["kind"] == "boards" for e in got) and got, 30, "the boards event")
    kinds = [e["kind"] for e in events]
    assert "read" not in kinds and kinds.count("connect") == 1, kinds
    (boards,) = [e for e in events if e["kind"] == "boards"]
    assert boards["body"]["boards"][0]["groups"] == [{"group": "0", "entered": 3,
                                                     "completed": 2}], boards
    reader.close()
    agent.close()
