"""The host relay (pgdash_agent.relay): a host's agents reach the server on one connection,
every event arrives once, and when the relay goes its agents reach the server themselves."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from pgdash_agent import board
from pgdash_agent.compact import CompactClient
from pgdash_agent.relay import Relay
from pgdash_agent.wire import PROTOCOL_V2
from tests.helpers.agents import HELLO, ev
from tests.helpers.procs import (job_by_name, launch_job, metric, stored_events, wait_for,
                                 wait_job)


def auth(rank: int, job: str) -> dict:
    return {"v": PROTOCOL_V2, "session": f"{job}-{rank}", "job": job, "rank": rank,
            "host": "h", "pid": 100 + rank}


class Agent:
    """A v2 client as the agent's sender drives it, through ``via`` (a relay) or not."""

    def __init__(self, server, rank: int, job: str, via: str | None):
        self.client = CompactClient()
        self.lost = threading.Event()
        self.client.on("disconnect", self.lost.set)
        self.client.connect(server.url, auth=auth(rank, job), via=via, wait_timeout=20)
        self.acks: list = []
        self.acked = threading.Condition()

    def send(self, events: list) -> dict:
        def got(ack):
            with self.acked:
                self.acks.append(ack)
                self.acked.notify_all()

        before = len(self.acks)
        self.client.emit("batch", {"events": events}, callback=got)
        with self.acked:
            assert self.acked.wait_for(lambda: len(self.acks) > before, 30), "no ack"
        return self.acks[-1]


def start_relay(server, tmp_path, job: str) -> Relay:
    where = str(tmp_path / "relay.sock")
    relay = Relay(server.url, auth(0, job), where).start()
    wait_for(lambda: os.path.exists(where), 30, "the relay to listen")
    return relay


def test_agents_through_a_relay_are_stored_once_and_let_go_when_it_leaves(server, tmp_path):
    relay = start_relay(server, tmp_path, "relayed")
    agents = [Agent(server, rank, "relayed", relay.sock_path) for rank in (0, 1)]
    try:
        assert metric(server, "pgdash_host_relays") == 1
        assert metric(server, "pgdash_relayed_agents") == 2
        for rank, agent in enumerate(agents):
            ack = agent.send([ev(1, "hello", {**HELLO, "rank": rank}),
                              ev(2, "group", {"name": "0", "ranks": [0, 1]})])
            assert ack["ok"] and ack["stored"] == 2
            # sent again (its ack lost, say): nothing doubles
            assert agents[rank].send([ev(2, "group", {"name": "0", "ranks": [0, 1]})])[
                "stored"] == 0
        assert relay.carried >= 6 and relay.served == 2
        relay.stop(timeout=5)
        for agent in agents:  # handed back: each must connect to the server itself
            assert agent.lost.wait(10)
    finally:
        relay.stop()
        for agent in agents:
            agent.client.disconnect()
    job = job_by_name(server, "relayed")
    events = stored_events(server.db_url, [job["id"]])
    kinds = sorted((e["session"], e["kind"]) for e in events if e["kind"] != "connect")
    assert kinds == [("relayed-0", "disconnect"), ("relayed-0", "group"), ("relayed-0", "hello"),
                     ("relayed-1", "disconnect"), ("relayed-1", "group"), ("relayed-1", "hello")]
    # let go by the relay, which cannot tell whether they live: closed sockets, no goodbye
    assert not any(e["body"].get("goodbye") for e in events if e["kind"] == "disconnect")
    wait_for(lambda: metric(server, "pgdash_host_relays") == 0, 10, "the relay to be gone")


def test_a_refused_agent_behind_a_relay_is_told_why_and_its_neighbour_carries_on(tmp_path):
    from tests.helpers.procs import ServerProcess

    srv = ServerProcess(f"sqlite:///{tmp_path / 'p.db'}", extra=["--token", "sesame"],
                        log_path=tmp_path / "server.log").start()
    try:
        where = str(tmp_path / "relay.sock")
        relay = Relay(srv.url, {**auth(0, "tok"), "token": "sesame"}, where).start()
        wait_for(lambda: os.path.exists(where), 30, "the relay to listen")
        good = CompactClient()
        good.connect(srv.url, auth={**auth(0, "tok"), "token": "sesame"}, via=where)
        bad = CompactClient()
        try:
            bad.connect(srv.url, auth={**auth(1, "tok"), "token": "wrong"}, via=where)
        except ConnectionError as exc:
            assert "wrong or missing token" in str(exc)
        else:
            raise AssertionError("an agent with the wrong token was admitted through a relay")
        assert good.connected
        relay.stop()
        good.disconnect()
    finally:
        srv.stop()


def test_a_real_job_goes_through_its_hosts_relay_and_to_the_server_when_it_goes(server,
                                                                                tmp_path):
    """Both ranks of a real gloo job (one host) send through the relay that rank 0's host
    reader runs: every collective arrives, once, and the healthy job raises nothing."""
    procs = launch_job("loop_job.py", 2, server.url, "through-relay", tmp_path,
                       env={"PGDASH_RELAY": "1"}, args=["250", "0.04"])
    try:
        wait_for(lambda: metric(server, "pgdash_relayed_agents") == 2, 60,
                 "both ranks carried by the relay")
        assert metric(server, "pgdash_host_relays") == 1
    finally:
        assert wait_job(procs, 180, tmp_path) == [0, 0]
    assert_every_collective_once(server, "through-relay", 250)


def assert_every_collective_once(server, name: str, steps: int) -> None:
    """The 2-rank loop job finished with each of its ``steps`` all_reduces counted once per
    rank, no event stored twice, and nothing blamed."""
    job = wait_for(lambda: (j := job_by_name(server, name)) and j["status"] == "finished"
                   and j, 30, "the job to finish")
    rows = server.api(f"/api/jobs/{job['id']}/collectives?group=0&op=all_reduce")["collectives"]
    assert sorted((r["rank"], r["count"]) for r in rows) == [(0, steps), (1, steps)]
    seqs = [(e["session"], e["seq"]) for e in stored_events(server.db_url, [job["id"]])
            if e["seq"]]
    assert len(seqs) == len(set(seqs))
    assert server.api(f"/api/jobs/{job['id']}/findings")["findings"] == []


def children(pid: int, module: str) -> list[int]:
    """The processes ``pid`` started that run ``python -m module``."""
    found = []
    for where in Path("/proc").glob("[0-9]*"):
        fields = board.proc_stat(where.name)  # from the state on: the parent's pid second
        if fields and fields[1:2] == [str(pid).encode()]:
            try:
                if module.encode() in (where / "cmdline").read_bytes().split(b"\0"):
                    found.append(int(where.name))
            except OSError:
                continue
    return found


def test_a_relay_whose_reader_is_killed_leaves_and_its_ranks_carry_on_directly(server,
                                                                              tmp_path):
    """The relay is a process of its own, the host reader's child: with the reader killed
    (SIGKILL: no word to it) it leaves by itself, and both ranks report to the server
    themselves; every collective arrives once and nothing is blamed."""
    procs = launch_job("loop_job.py", 2, server.url, "relay-orphaned", tmp_path,
                       env={"PGDASH_RELAY": "1"}, args=["500", "0.04"])
    try:
        wait_for(lambda: metric(server, "pgdash_relayed_agents") == 2, 60,
                 "both ranks carried by the relay")
        reader = wait_for(lambda: children(procs[0].pid, "pgdash_agent.reader"), 10,
                          "rank 0's host reader")[0]
        relay = wait_for(lambda: children(reader, "pgdash_agent.relay"), 10, "its relay")[0]
        os.kill(reader, signal.SIGKILL)
        wait_for(lambda: not board.how_ended(relay)[0], 20, "the relay to leave")
        wait_for(lambda: metric(server, "pgdash_host_relays") == 0
                 and metric(server, "pgdash_relayed_agents") == 0, 20, "the relay to be gone")
    finally:
        assert wait_job(procs, 180, tmp_path) == [0, 0]
    assert_every_collective_once(server, "relay-orphaned", 500)


def test_a_relay_reaches_a_tls_server_with_the_agents_ca_file(tmp_path):
    """Over https the relay verifies the server as the agents do (PGDASH_CA_FILE), and a job's
    ranks move to it."""
    from tests.helpers.procs import ServerProcess
    from tests.helpers.tls import make_cert

    cert, key = make_cert(tmp_path)
    srv = ServerProcess(f"sqlite:///{tmp_path / 'tls.db'}", log_path=tmp_path / "server.log",
                        extra=["--tls-cert", str(cert), "--tls-key", str(key)]).start()
    try:
        procs = launch_job("loop_job.py", 2, srv.url, "relay-tls", tmp_path,
                           env={"PGDASH_CA_FILE": str(cert), "PGDASH_RELAY": "1"},
                           args=["150", "0.04"])
        try:
            wait_for(lambda: metric(srv, "pgdash_relayed_agents") == 2, 60,
                     "both ranks carried by the relay over TLS")
        finally:
            assert wait_job(procs, 180, tmp_path) == [0, 0]
        job = wait_for(lambda: (j := job_by_name(srv, "relay-tls")) and
                       j["status"] == "finished" and j, 30, "the job to finish")
        rows = srv.api(f"/api/jobs/{job['id']}/collectives?group=0&op=all_reduce")["collectives"]
        assert sorted((r["rank"], r["count"]) for r in rows) == [(0, 150), (1, 150)]
    finally:
        srv.stop()
