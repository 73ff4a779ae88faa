"""What survives a fault? Prints: fault, events acknowledged, stored, lost, doubled; fuzz cases
tried and failed; the training step time with the server down against up.

Each fault runs against a real pgdash server and a real SQLite file, with agents over real
websockets:

* ``kill -9 mid burst``: two agents send batches as fast as acks come back; the server is
  SIGKILLed while the writer is busy. ``PRAGMA integrity_check`` must say ``ok``; then the
  server restarts on the same file, the agents reconnect and resend what was not acknowledged
  (and, to prove the de-duplication, the last batch that was), as the real agent does.
* ``database locked``: another connection holds ``BEGIN EXCLUSIVE`` for a few seconds while
  an agent sends; its batches are refused with a reason naming the file, then resent.
* ``disk full``: SQLite's ``PRAGMA max_page_count`` caps the file just above its size while
  an agent sends big events; then the cap is lifted and the agent resends.
* ``flooding agent`` / ``garbage agent``: per-connection rate limits slow a flooder (which
  honours ``retry_after``); another sends junk; a polite agent beside them must see every
  batch acknowledged and stored.
* ``server down while training``: a real 2-rank gloo job trains with nobody listening, then
  the server comes up. Offline the agent merges its summaries and skips heartbeats, so its
  buffer (here only 10 events) overflows only through events it must keep one by one: the job
  makes 30 process groups while the server is down. The drops the agent counted must show in
  ``GET /api/jobs/<id>``, and its buffer must never pass its bound.
* ``server down N s, training``: the same for minutes (``--outage-s``, 150 by default): RSS
  and buffer length of each rank sampled every 0.5 s, step times down against up, the drops
  the agents counted against what the API and the job page (``#job-dropped``, in headless
  Chromium) show, and every sequence number an agent gave out either stored or counted as
  dropped.

``lost`` counts events acknowledged as stored but absent from the database; ``doubled``
counts events stored more than once. The goal is 0 and 0 in every row.

The step-time ratio (goal <= 1.02) comes from one 2-rank job that trains while a switch in
front of the server takes it away and brings it back: rounds of three blocks (up, down, up
again: an A/A control that shows the noise floor), in rotating order; the median of the
rounds' ratios with a bootstrap 95% interval (see :func:`step_time_ratio`).

Run from the repository root with ``.[test]`` installed::

    python -m bench.faults              # every fault, the long outage, fuzz, the ratio
    python -m bench.faults --quick      # smaller bursts, a 20 s outage, 8 rounds
    python -m bench.faults --only-ratio [--rounds 40] [--block-s 4]   # ~9 minutes
    python -m bench.faults --only-outage [--outage-s 150]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import random
import re
import sqlite3
import statistics
import string
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import socketio

from pgdash_agent.wire import AGENT_NAMESPACE, PROTOCOL_VERSION
from bench.common import ROOT
from tests.helpers.procs import (ServerProcess, free_port, job_by_name, launch_job,
                                 stored_events, wait_for, wait_job)


@dataclasses.dataclass
class Row:
    fault: str
    acknowledged: int
    stored: int
    lost: int
    doubled: int
    note: str = ""


class WireAgent:
    """One agent session played over a real websocket, keeping the real agent's promise:
    events in sequence order, at most one batch on the wire, everything not acknowledged kept
    and resent after a reconnect, and a ``retry_after`` honoured."""

    def __init__(self, url: str, session: str, job: str, rank: int = 0,
                 token: str | None = None, body_text: int = 0):
        self.url, self.session, self.job, self.rank, self.token = url, session, job, rank, token
        self.seq = 0
        self.unsent: list[dict[str, Any]] = []
        self.acked: set[int] = set()
        self.last_acked: list[dict[str, Any]] = []
        self.refusals: list[str] = []
        self.client: socketio.Client | None = None
        self.body_text = body_text
        self.add(1, kind="hello")

    def add(self, n: int, kind: str = "heartbeat") -> None:
        for _ in range(n):
            self.seq += 1
            if kind == "hello":
                body = {"job": self.job, "rank": self.rank, "world_size": 1, "host": "bench",
                        "pid": 1}
            elif self.body_text:  # big events, to fill a disk quickly
                # Random letters: the store compresses bodies, and a run of one letter
                # would shrink to nothing.
                text = "".join(random.choices(string.ascii_letters, k=self.body_text))
                body = {"where": "bench", "error_type": "Fill", "error": text}
                kind = "error"
            else:
                body = {"groups": [], "buffered": self.seq}
            self.unsent.append({"seq": self.seq, "t": time.time(), "kind": kind, "body": body})

    def connect(self) -> None:
        self.close()
        client = socketio.Client(reconnection=False)
        client.connect(self.url, namespaces=[AGENT_NAMESPACE], transports=["websocket"],
                       auth={"v": PROTOCOL_VERSION, "session": self.session, "job": self.job,
                             "rank": self.rank, "host": "bench", "pid": 1,
                             "token": self.token}, wait_timeout=10)
        self.client = client

    def close(self) -> None:
        if self.client is not None:
            try:
                self.client.disconnect()
            except Exception:
                pass
            # After the server died the client thinks it is already gone and leaves its
            # socket open; close it for real.
            ws = getattr(getattr(self.client, "eio", None), "ws", None)
            if ws is not None:
                try:
                    ws.shutdown()
                except Exception:
                    pass
            self.client = None

    def send(self, size: int = 200, timeout: float = 15) -> dict[str, Any] | None:
        """Send the oldest unsent events as one batch; returns the ack (None: no answer)."""
        batch = self.unsent[:size]
        if not batch:
            return {"ok": True, "stored": 0}
        try:
            ack = self.client.call("batch", {"v": PROTOCOL_VERSION, "events": batch},
                                   namespace=AGENT_NAMESPACE, timeout=timeout)
        except Exception:
            return None  # the link broke: the batch stays unacknowledged
        if isinstance(ack, dict) and ack.get("ok"):
            rejected = {r.get("seq") for r in ack.get("rejected") or []}
            self.acked.update(ev["seq"] for ev in batch if ev["seq"] not in rejected)
            self.last_acked = batch
            del self.unsent[:len(batch)]
        elif isinstance(ack, dict) and ack.get("retry"):
            self.refusals.append(str(ack.get("error")))
            time.sleep(min(float(ack.get("retry_after") or 0.05), 5.0))
        else:
            raise AssertionError(f"a valid batch was refused for good: {ack}")
        return ack

    def drain(self, deadline_s: float = 60, size: int = 200) -> None:
        """Send until everything is acknowledged (reconnecting as needed), within a deadline."""
        deadline = time.monotonic() + deadline_s
        while self.unsent and time.monotonic() < deadline:
            if self.client is None or not self.client.connected:
                try:
                    self.connect()
                except Exception:
                    time.sleep(0.5)
                    continue
            if self.send(size) is None:
                self.close()
        if self.unsent:
            raise AssertionError(f"{self.session}: {len(self.unsent)} events never acknowledged")


def stored_counts(db: Path, sessions: list[str]) -> dict[str, dict[int, int]]:
    """seq -> how many times it is stored, per session (read from the file, packs too)."""
    out: dict[str, dict[int, int]] = {s: {} for s in sessions}
    for ev in stored_events(f"sqlite:///{db}"):
        if ev["seq"] is not None and ev["session"] in out:
            seqs = out[ev["session"]]
            seqs[ev["seq"]] = seqs.get(ev["seq"], 0) + 1
    return out


def account(fault: str, db: Path, agents: list[WireAgent], note: str = "") -> Row:
    counts = stored_counts(db, [a.session for a in agents])
    acked = sum(len(a.acked) for a in agents)
    stored = sum(len(c) for c in counts.values())
    lost = sum(len(a.acked - counts[a.session].keys()) for a in agents)
    doubled = sum(n - 1 for c in counts.values() for n in c.values())
    return Row(fault, acked, stored, lost, doubled, note)


def integrity(db: Path) -> str:
    with sqlite3.connect(db, timeout=30) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


# -- faults ----------------------------------------------------------------------------------

def kill_mid_burst(workdir: Path, events: int = 20_000) -> tuple[Row, str]:
    """SIGKILL the server while two agents keep its writer busy; restart; resend."""
    db = workdir / "kill.db"
    srv = ServerProcess(f"sqlite:///{db}", log_path=workdir / "kill.log").start()
    agents = [WireAgent(srv.url, f"burst-{i}", "burst", rank=i) for i in range(2)]
    for a in agents:
        a.add(events)
        a.connect()
    stop = threading.Event()

    def pump(a: WireAgent) -> None:
        while not stop.is_set() and a.unsent:
            if a.send(200, timeout=5) is None:
                return

    threads = [threading.Thread(target=pump, args=(a,), daemon=True) for a in agents]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: sum(len(a.acked) for a in agents) >= events // 4, 120,
                 "a quarter of the burst acknowledged", interval=0.01)
        srv.kill()  # mid burst: the pumps are still sending
        stop.set()
        for t in threads:
            t.join(timeout=30)
        check = integrity(db)
        before = sum(len(a.acked) for a in agents)
        srv = ServerProcess(f"sqlite:///{db}", port=srv.port,
                            log_path=workdir / "kill.log").start()
        for a in agents:
            a.close()
            a.unsent = sorted(a.last_acked + a.unsent, key=lambda e: e["seq"])  # and a dup
            a.drain()
        return account("kill -9 mid burst", db, agents,
                       f"integrity_check {check}; {before} acked before the kill"), check
    finally:
        stop.set()
        for a in agents:
            a.close()
        srv.stop()


def _in_process_server(db: Path, **config: Any):
    from dashboard.web.app import create_app
    from dashboard.server import Server

    app = create_app({"DB": f"sqlite:///{db}", **config})
    return Server(app, "127.0.0.1", 0).start()


def db_locked(workdir: Path, hold_s: float = 4.0) -> tuple[Row, list[str]]:
    """Another process's connection holds the database exclusively for a while."""
    db = workdir / "locked.db"
    server = _in_process_server(db, DB_BUSY_TIMEOUT_S=0.5)
    agent = WireAgent(server.url, "locked-0", "locked")
    try:
        agent.add(400)
        agent.connect()
        agent.send(100)
        holder = sqlite3.connect(db, timeout=5, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        until = time.monotonic() + hold_s
        while time.monotonic() < until and agent.unsent:
            agent.send(50)  # refused with a reason while locked
        holder.execute("COMMIT")
        holder.close()
        agent.drain()
        up = _api_ok(server.url)
        return account("database locked", db, [agent],
                       f"{len(agent.refusals)} refusals; API answered: {up}"), agent.refusals
    finally:
        agent.close()
        server.stop()


def disk_full(workdir: Path) -> tuple[Row, list[str]]:
    """SQLite cannot grow the file (PRAGMA max_page_count, per connection), then can again."""
    from sqlalchemy import event as sa_event

    db = workdir / "full.db"
    server = _in_process_server(db)
    engine = server.app.extensions["pgdash"].store.engine
    cap = {"pages": None}

    def limit(dbapi_conn, _record):
        if cap["pages"] is not None:
            dbapi_conn.execute(f"PRAGMA max_page_count = {cap['pages']}")

    sa_event.listen(engine, "connect", limit)
    agent = WireAgent(server.url, "full-0", "full", body_text=20_000)
    try:
        agent.add(200)
        agent.connect()
        agent.send(20)
        with sqlite3.connect(db) as conn:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
        cap["pages"] = pages + 8  # a few pages of room, then "database or disk is full"
        engine.dispose()
        for _ in range(20):
            ack = agent.send(20)
            if ack and not ack.get("ok"):
                break
        full = list(agent.refusals)
        cap["pages"] = 1_073_741_823  # space again
        engine.dispose()
        agent.drain()
        return account("disk full", db, [agent], f"{len(full)} refusals while full"), full
    finally:
        agent.close()
        server.stop()


def _api_ok(url: str) -> bool:
    with urllib.request.urlopen(url + "/api/jobs", timeout=10) as resp:
        return resp.status == 200


def flood_and_garbage(workdir: Path, seconds: float = 4.0, rate: int = 400
                      ) -> tuple[list[Row], dict[str, Any]]:
    """A flooder and a garbage sender beside a polite agent, on a rate-limited server."""
    db = workdir / "flood.db"
    srv = ServerProcess(f"sqlite:///{db}", log_path=workdir / "flood.log",
                        env={"PGDASH_MAX_EVENTS_PER_S": str(rate),
                             "PGDASH_RATE_BURST_S": "1"}).start()
    polite = WireAgent(srv.url, "polite-0", "polite")
    flooder = WireAgent(srv.url, "flood-0", "flood")
    garbage_acks: list[Any] = []
    polite_acks: list[Any] = []
    stop = threading.Event()
    try:
        for a in (polite, flooder):
            a.connect()
        flooder.add(int(rate * seconds * 4))
        junk = socketio.Client(reconnection=False)
        junk.connect(srv.url, namespaces=[AGENT_NAMESPACE], transports=["websocket"],
                     auth={"v": PROTOCOL_VERSION, "session": "junk-0", "job": "junk"})

        def flood() -> None:
            while not stop.is_set() and flooder.unsent:
                flooder.send(200)

        def spew() -> None:
            nested: Any = 1
            for _ in range(400):
                nested = [nested]
            payloads = ["junk", {"v": 99}, {"v": 1, "events": "x"}, [1, 2, 3],
                        {"v": 1, "events": [{"seq": -1}, nested, {"kind": "hello"}]},
                        {"v": 1, "events": [{"seq": 1, "t": float("1e300"), "kind": "exit",
                                             "body": {"clean": "yes"}}] * 50}]
            i = 0
            while not stop.is_set():
                try:
                    garbage_acks.append(junk.call("batch", payloads[i % len(payloads)],
                                                  namespace=AGENT_NAMESPACE, timeout=10))
                except Exception as exc:
                    garbage_acks.append(repr(exc))
                i += 1

        threads = [threading.Thread(target=f, daemon=True) for f in (flood, spew)]
        for t in threads:
            t.start()
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            polite.add(rate // 20)  # half the limit, in ten batches a second
            polite_acks.append(polite.send(200))
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        flood_window = len(flooder.acked)
        elapsed = time.monotonic() - started
        junk.disconnect()
        polite.drain()
        flooder.drain(deadline_s=120)
        metrics = urllib.request.urlopen(srv.url + "/metrics", timeout=10).read().decode()
        limited = int(re.search(r'pgdash_ingest_refused_total\{what="rate_limited"\} (\d+)',
                                metrics).group(1))
        rows = [account("flooding agent", db, [flooder],
                        f"{flood_window} acked in {elapsed:.1f} s at {rate}/s; "
                        f"{limited} batches rate-limited"),
                account("polite agent beside them", db, [polite],
                        f"{sum(1 for a in polite_acks if not (a or {}).get('ok'))} refused"),
                Row("garbage agent", 0, len(stored_counts(db, ["junk-0"])["junk-0"]), 0, 0,
                    f"{len(garbage_acks)} junk batches, all answered: "
                    f"{all(isinstance(a, dict) for a in garbage_acks)}")]
        info = {"polite_acks": polite_acks, "garbage_acks": garbage_acks,
                "flood_window": flood_window, "elapsed": elapsed, "rate": rate,
                "rate_limited": limited, "flood_refusals": flooder.refusals}
        return rows, info
    finally:
        stop.set()
        for a in (polite, flooder):
            a.close()
        srv.stop()


def server_down(workdir: Path, steps: int = 300, buffer: int = 10
                ) -> tuple[Row, dict[str, Any]]:
    """A job trains with the server down, then it comes up: bounded buffer, counted drops."""
    db = workdir / "down.db"
    port = free_port()
    env = {"PGDASH_MAX_BUFFERED_EVENTS": str(buffer), "PGDASH_INTERVAL_S": "0.05",
           "PGDASH_RECONNECT_MAX_S": "0.5", "PGDASH_FLUSH_TIMEOUT_S": "30"}
    procs = launch_job("timed_job.py", 2, f"http://127.0.0.1:{port}", "down", workdir,
                       args=[str(steps), "down-then-up"], env=env)
    srv = None
    try:
        # Train with nobody listening until each rank says it has dropped events.
        wait_for(lambda: all("DROPPING" in (workdir / f"down-rank{r}.log").read_text()
                             for r in (0, 1)), 180, "both ranks dropping while the server is down")
        srv = ServerProcess(f"sqlite:///{db}", port=port, log_path=workdir / "down.log").start()
        job, ranks, results = _finished_after_outage(srv, procs, workdir, "down")
        dropped_agent = sum(sum(r["dropped"].values()) for r in results)
        dropped_shown = sum(sum((r.get("dropped") or {}).values()) for r in ranks)
        max_buffered = max(r["max_buffered"] for r in results)
        stored = sum(ev["seq"] is not None for ev in stored_events(f"sqlite:///{db}"))
        row = Row("server down while training", 0, stored, 0, 0,
                  f"agent buffer peak {max_buffered} <= {buffer}; dropped {dropped_agent} "
                  f"(counted), {dropped_shown} shown in /api/jobs/<id>")
        return row, {"ranks": ranks, "results": results, "max_buffered": max_buffered,
                     "buffer": buffer, "dropped_agent": dropped_agent,
                     "dropped_shown": dropped_shown}
    finally:
        _stop(procs, srv)


def chromium_path() -> str | None:
    """The system's Chromium (PGDASH_CHROMIUM, or ``chromium`` on PATH), if installed."""
    import shutil

    candidate = os.environ.get("PGDASH_CHROMIUM") or shutil.which("chromium") or \
        "/usr/bin/chromium"
    return candidate if Path(candidate).is_file() and os.access(candidate, os.X_OK) else None


def _stop(procs, srv) -> None:
    """Kill the ranks still running, then stop the server (if it was started)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    if srv is not None:
        srv.stop()


def _finished_after_outage(srv, procs, workdir: Path, name: str):
    """Once the server is back: the 2-rank job ``name`` finished cleanly; returns its job row,
    its ranks as the API shows them, and each rank's RESULT line (what its agent counted)."""
    codes = wait_job(procs, 300, workdir)
    assert codes == [0, 0], codes
    job = wait_for(lambda: (j := job_by_name(srv, name)) and j["status"] == "finished"
                   and j, 60, "the job after the server came up")
    ranks = srv.api(f"/api/jobs/{job['id']}")["ranks"]
    results = []
    for rank in (0, 1):
        text = (workdir / f"{name}-rank{rank}.log").read_text()
        line = next(x for x in text.splitlines() if x.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT "):]))
    return job, ranks, results


def page_dropped(url: str, job_id: int) -> dict[str, str] | None:
    """What the job page's header says about dropped events (``#job-dropped``: its text and
    its per-kind title), read in headless Chromium; None without playwright or Chromium.

    In a subprocess of its own: Playwright's sync API allows one session per process, and a
    test run may hold one already (the browser tests')."""
    done = subprocess.run([sys.executable, "-m", "bench.faults", "--read-page-dropped", url,
                           str(job_id)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"reading the job page failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def _read_page_dropped(url: str, job_id: int) -> dict[str, str] | None:
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        return None
    path = chromium_path()
    if path is None:
        return None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, headless=True,
                                     args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.goto(f"{url}/jobs/{job_id}")
            dropped = page.locator("#job-dropped")
            expect(dropped).to_have_count(1, timeout=30_000)
            return {"text": dropped.inner_text(), "title": dropped.get_attribute("title") or ""}
        finally:
            browser.close()


def _phases(result: dict[str, Any]) -> dict[str, Any]:
    """One rank's outage record split at the moment all ranks were connected again."""
    back = result["connected_at"]
    down = [s for t, s in zip(result["step_at"], result["step_s"]) if back is None or t < back]
    up = [s for t, s in zip(result["step_at"], result["step_s"]) if back is not None
          and t >= back]
    # While this rank's own link is down (its first connect loads the client: not an outage
    # cost).
    samples = [s for s in result["samples"] if not s[4] and (back is None or s[0] < back)]
    # RSS once warm (5 s in: imports, groups and first steps done) against its peak while down.
    warm = next((s for s in samples if s[0] >= 5.0), samples[0])
    after = [s for s in result["samples"] if back is not None and s[0] >= back]

    def cpu_pct(part: list[list[Any]]) -> float | None:
        if len(part) < 2 or part[-1][0] <= part[0][0]:
            return None
        return round(100 * (part[-1][5] - part[0][5]) / (part[-1][0] - part[0][0]), 2)

    return {"down_steps": down, "up_steps": up, "rss_warm_kb": warm[1],
            "agent_cpu_down_pct": cpu_pct(samples), "agent_cpu_up_pct": cpu_pct(after),
            "rss_peak_down_kb": max(s[1] for s in samples),
            "rss_end_down_kb": samples[-1][1],
            "max_buffered": max(s[2] for s in result["samples"])}


def long_outage(workdir: Path, outage_s: float, buffer: int = 10, after_s: float = 5.0,
                check_page: bool = True) -> tuple[Row, dict[str, Any]]:
    """A 2-rank job trains while the server is down for ``outage_s`` seconds, then it comes up.

    The agent's buffer is small (``buffer`` events) and the job starts with 30 new process
    groups, so events are dropped at once; then for the whole outage the agent retries its
    connection every half second at most (PGDASH_RECONNECT_MAX_S=0.5), merges its summaries
    and skips heartbeats. Measured: each rank's RSS and buffer length every 0.5 s, step times
    down against up, the drops each agent counted against what the API and the job page show,
    and, per session, whether every sequence number is either stored or counted as dropped.
    """
    db = workdir / "outage.db"
    port = free_port()
    env = {"PGDASH_MAX_BUFFERED_EVENTS": str(buffer), "PGDASH_INTERVAL_S": "0.2",
           "PGDASH_RECONNECT_MAX_S": "0.5", "PGDASH_FLUSH_TIMEOUT_S": "30"}
    procs = launch_job("outage_job.py", 2, f"http://127.0.0.1:{port}", "outage", workdir,
                       args=[str(after_s), str(outage_s + 300)], env=env)
    srv = None
    try:
        wait_for(lambda: all("TRAINING" in (workdir / f"outage-rank{r}.log").read_text()
                             for r in (0, 1)), 180, "both ranks training")
        time.sleep(outage_s)  # nobody listening: the outage
        srv = ServerProcess(f"sqlite:///{db}", port=port,
                            log_path=workdir / "outage-server.log").start()
        job, ranks, results = _finished_after_outage(srv, procs, workdir, "outage")
        page = page_dropped(srv.url, job["id"]) if check_page else None
        seqs = {}
        for ev in stored_events(f"sqlite:///{db}"):
            if ev["seq"] is not None:
                seqs.setdefault(ev["session"], []).append(ev["seq"])
        seqs = {session: (len(got), len(set(got)), max(got)) for session, got in seqs.items()}
    finally:
        _stop(procs, srv)
    phases = [_phases(r) for r in results]
    # Every sequence number an agent gave out is stored, or was dropped and counted: a seq
    # that is neither was lost after the agent took it in.
    unaccounted = sum(seqs[r["session"]][2] - seqs[r["session"]][1] - r["outbox_dropped"]
                      for r in results)
    doubled = sum(n - distinct for n, distinct, _ in seqs.values())
    stored = sum(seqs[r["session"]][1] for r in results)
    down = [s for p in phases for s in p["down_steps"]]
    up = [s for p in phases for s in p["up_steps"]]
    info = {
        "outage_s": outage_s, "buffer": buffer, "results": results, "ranks": ranks,
        "phases": phases, "page": page, "unaccounted": unaccounted, "doubled": doubled,
        "max_buffered": max(p["max_buffered"] for p in phases),
        "dropped_agent": sum(sum(r["dropped"].values()) for r in results),
        "outbox_dropped": sum(r["outbox_dropped"] for r in results),
        "dropped_shown": sum(sum((r.get("dropped") or {}).values()) for r in ranks),
        "rss_growth_kb": max(p["rss_peak_down_kb"] - p["rss_warm_kb"] for p in phases),
        "down_ms": statistics.median(down) * 1e3, "up_ms": statistics.median(up) * 1e3,
        "down_steps": len(down), "up_steps": len(up),
        "flushed": all(r["flushed"] for r in results),
    }
    row = Row(f"server down {outage_s:g} s, training", stored if info["flushed"] else 0, stored,
              max(unaccounted, 0), doubled,
              f"buffer peak {info['max_buffered']} <= {buffer}; {info['outbox_dropped']} "
              f"events dropped and counted, {unaccounted} seqs neither stored nor counted; "
              f"RSS +{info['rss_growth_kb'] / 1024:.1f} MB while down; page shows "
              f"{page['text'] if page else '(no browser)'}")
    return row, info


def print_outage(info: dict[str, Any]) -> None:
    """The outage over time: per rank, RSS, buffer and drops every ~outage/10 seconds."""
    print(f"\nserver down {info['outage_s']:g} s while 2 ranks train (agent buffer "
          f"{info['buffer']} events); every sample of rank 0, then rank 1:")
    for rank, result in enumerate(info["results"]):
        every = max(1, len(result["samples"]) // 12)
        line = ", ".join(f"{t:.0f}s {rss / 1024:.1f}MB buf {buf} drop {drop}"
                         f"{'' if up else ' (down)'}"
                         for t, rss, buf, drop, up, _cpu in result["samples"][::every])
        print(f"  rank {rank}: {line}")
    print(f"  RSS: warm {[round(p['rss_warm_kb'] / 1024, 1) for p in info['phases']]} MB, peak "
          f"while down {[round(p['rss_peak_down_kb'] / 1024, 1) for p in info['phases']]} MB "
          f"(growth {info['rss_growth_kb'] / 1024:.2f} MB)")
    print(f"  step time: median while down {info['down_ms']:.3f} ms ({info['down_steps']} "
          f"steps), after it came back {info['up_ms']:.3f} ms ({info['up_steps']} steps)")
    print(f"  the agent's own threads, % of one core per rank: while down "
          f"{[p['agent_cpu_down_pct'] for p in info['phases']]}, after it came back "
          f"{[p['agent_cpu_up_pct'] for p in info['phases']]}")
    print(f"  drops: agents counted {info['dropped_agent']} ({info['outbox_dropped']} from the "
          f"buffer), /api/jobs/<id> shows {info['dropped_shown']}, the job page shows "
          f"{info['page']}")


ARMS = ("up", "down", "up again")  # "up again": the A/A control, the noise floor


def bootstrap_median(values: list[float], resamples: int = 4000, seed: int = 10
                     ) -> tuple[float, float, float]:
    """The median of ``values`` and a 95% percentile-bootstrap interval around it."""
    rng = random.Random(seed)  # a fixed seed: the same runs give the same interval
    medians = sorted(statistics.median(rng.choices(values, k=len(values)))
                     for _ in range(resamples))
    return (statistics.median(values), medians[int(0.025 * resamples)],
            medians[int(0.975 * resamples) - 1])


class OutageSwitch:
    """A TCP port in front of the server that is either up (it forwards every connection to
    the server) or down (nothing listens: connections are refused, and open ones are cut, as
    when the server process dies). Switching takes milliseconds, where restarting a server
    takes seconds, so one job can live through many outages and recoveries."""

    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._listener: Any = None
        self._sockets: list[Any] = []
        self._lock = threading.Lock()

    def up(self) -> None:
        import socket

        if self._listener is not None:
            return
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        import socket

        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            except OSError:
                pass

    def _accept(self, listener: Any) -> None:
        import socket

        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed: the switch went down
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._copy, args=(src, dst), daemon=True).start()

    @staticmethod
    def _copy(src: Any, dst: Any) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.close()
                except OSError:
                    pass


def step_time_ratio(workdir: Path, rounds: int = 40, block_s: float = 4.0,
                    settle_s: float = 1.5) -> dict[str, Any]:
    """Training step time with the server down against up, on a noisy shared machine.

    One 2-rank job trains throughout while an :class:`OutageSwitch` in front of the server
    takes it away and brings it back. Each round is three blocks of ``block_s`` seconds: server
    up, server down, and server up again (an A/A control: the same condition twice, whose
    ratio shows what noise alone does). The order rotates through all six permutations, so no
    arm is always first or last while the machine's load drifts. The first ``settle_s`` of
    each block are left out (a reconnect and its resend belong to neither steady state; the
    agent retries every 0.5 s at most here, PGDASH_RECONNECT_MAX_S=0.5, a worst case). Each
    block is summarised by the median of its steps (both ranks), each round by the ratios
    down/up and up-again/up; the verdict is the median of the rounds' ratios with a bootstrap
    95% interval over rounds.
    """
    srv = ServerProcess(f"sqlite:///{workdir / 'timing.db'}",
                        log_path=workdir / "timing.log").start()
    switch = OutageSwitch(srv.port)
    switch.up()
    orders = list(itertools.permutations(ARMS))
    total_s = rounds * len(ARMS) * block_s
    procs = launch_job("outage_job.py", 2, switch.url, "timing", workdir,
                       args=["1e9", str(total_s + 5)],
                       env={"PGDASH_RECONNECT_MAX_S": "0.5", "PGDASH_FLUSH_TIMEOUT_S": "10"})
    blocks: list[tuple[int, str, float, float]] = []  # round, arm, wall start, wall end
    try:
        wait_for(lambda: all("TRAINING" in (workdir / f"timing-rank{r}.log").read_text()
                             for r in (0, 1)), 180, "both ranks training")
        for i in range(rounds):
            for arm in orders[i % len(orders)]:
                (switch.down if arm == "down" else switch.up)()
                began = time.time()
                time.sleep(block_s)
                blocks.append((i, arm, began, time.time()))
        switch.up()
        codes = wait_job(procs, 120, workdir)
        assert codes == [0, 0], codes
    finally:
        _stop(procs, None)
        switch.down()
        srv.stop()
    results = []
    for rank in (0, 1):
        text = (workdir / f"timing-rank{rank}.log").read_text()
        line = next(x for x in text.splitlines() if x.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT "):]))
    medians: dict[tuple[int, str], float] = {}
    fast: dict[tuple[int, str], float] = {}  # lower quartile: steps nobody else preempted
    counts: dict[str, int] = {arm: 0 for arm in ARMS}
    agent_cpu: dict[str, list[float]] = {arm: [] for arm in ARMS}  # share of a core, 2 ranks
    for i, arm, began, ended in blocks:
        times = [s for r in results for t, s in zip(r["step_at"], r["step_s"])
                 if began + settle_s <= r["started_wall"] + t < ended]
        medians[(i, arm)] = statistics.median(times)
        fast[(i, arm)] = statistics.quantiles(times, n=4)[0]
        counts[arm] += len(times)
        share = 0.0
        for r in results:
            inside = [(r["started_wall"] + x[0], x[5]) for x in r["samples"]
                      if began + settle_s <= r["started_wall"] + x[0] < ended]
            if len(inside) >= 2:
                share += (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])
        agent_cpu[arm].append(share)
    ratios = {"down/up": [medians[(i, "down")] / medians[(i, "up")] for i in range(rounds)],
              "up/up": [medians[(i, "up again")] / medians[(i, "up")] for i in range(rounds)],
              "down/up p25": [fast[(i, "down")] / fast[(i, "up")] for i in range(rounds)],
              "up/up p25": [fast[(i, "up again")] / fast[(i, "up")] for i in range(rounds)]}
    (workdir / "timing.json").write_text(json.dumps({
        "blocks": blocks, "medians_s": [[i, arm, m] for (i, arm), m in medians.items()],
        "p25_s": [[i, arm, m] for (i, arm), m in fast.items()]}))
    out: dict[str, Any] = {"rounds": rounds, "block_s": block_s, "settle_s": settle_s,
                           "steps": counts,
                           "ratios": {k: [round(r, 4) for r in v] for k, v in ratios.items()}}
    for key, values in ratios.items():
        out[key] = bootstrap_median(values)
    for arm in ARMS:
        out[f"{arm} ms"] = statistics.median(medians[(i, arm)] for i in range(rounds)) * 1e3
        # CPU is counted in clock ticks (10 ms): the mean over blocks, not the median.
        out[f"{arm} agent cpu %"] = 100 * statistics.fmean(agent_cpu[arm])
    return out


def ratio_verdict(timing: dict[str, Any], goal: float = 1.02) -> str:
    """Whether the runs show the goal: the whole interval under it, or only the median."""
    median, low, high = timing["down/up"]
    _, aa_low, aa_high = timing["up/up"]
    if high <= goal:
        return f"met: the 95% interval's top {high:.3f} <= {goal}"
    noise = (f"; this machine's noise floor (the A/A interval [{aa_low:.3f}, {aa_high:.3f}]) is "
             f"wider than the goal's margin" if aa_high - aa_low > 2 * (goal - 1) else "")
    if median <= goal:
        return (f"median {median:.3f} <= {goal}, but the 95% interval reaches {high:.3f}: not "
                f"shown{noise}; more rounds (--rounds) or a quieter machine")
    return f"MISSED: median {median:.3f} > {goal}{noise}"


def print_ratio(timing: dict[str, Any]) -> None:
    dm, dl, dh = timing["down/up"]
    am, al, ah = timing["up/up"]
    print(f"\ntraining step time, one 2-rank gloo job, {timing['rounds']} rounds of 3 blocks "
          f"of {timing['block_s']:g} s (first {timing['settle_s']:g} s of each left out), order "
          f"rotated; steps measured {timing['steps']}")
    print(f"  median of blocks' medians: server up {timing['up ms']:.3f} ms, down "
          f"{timing['down ms']:.3f} ms, up again {timing['up again ms']:.3f} ms")
    print(f"  the agent's own threads (pgdash-*, both ranks), % of one core: server up "
          f"{timing['up agent cpu %']:.2f}, down {timing['down agent cpu %']:.2f}, up again "
          f"{timing['up again agent cpu %']:.2f}")
    print(f"  ratio down/up   (median of rounds): {dm:.3f}  95% CI [{dl:.3f}, {dh:.3f}]")
    print(f"  A/A up again/up (noise floor)     : {am:.3f}  95% CI [{al:.3f}, {ah:.3f}]")
    fm, fl, fh = timing["down/up p25"]
    qm, ql, qh = timing["up/up p25"]
    print("  the same from each block's lower quartile (the steps no other process slowed):")
    print(f"    down/up {fm:.3f}  95% CI [{fl:.3f}, {fh:.3f}];  A/A {qm:.3f}  95% CI "
          f"[{ql:.3f}, {qh:.3f}]")
    print(f"  goal down/up <= 1.02: {ratio_verdict(timing)}")
    print(f"  rounds' down/up: {timing['ratios']['down/up']}")
    print(f"  rounds' up/up:   {timing['ratios']['up/up']}")


def fuzz(workdir: Path) -> dict[str, Any]:
    """Run tests/integration/test_fuzz.py; count its cases and failures."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                           str(ROOT / "tests" / "integration" / "test_fuzz.py")], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    cases = sum(int(n) for n in re.findall(r"fuzz \w+: (\d+) cases", done.stdout))
    failed = re.search(r"(\d+) failed", done.stdout)
    return {"cases": cases, "failed": int(failed.group(1)) if failed else 0,
            "rc": done.returncode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller bursts, fewer steps")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--only-ratio", action="store_true",
                        help="run only the step-time ratio (server down vs up, A/A control)")
    parser.add_argument("--only-outage", action="store_true",
                        help="run only the minutes-long outage (see --outage-s)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of the step-time ratio (3 blocks each; default 40, "
                             "--quick 8)")
    parser.add_argument("--block-s", type=float, default=4.0,
                        help="seconds of each block (server up, down, up again) of the "
                             "step-time ratio")
    parser.add_argument("--outage-s", type=float, default=None,
                        help="how long the server stays down while a job trains (default "
                             "150 s, --quick 20 s)")
    args = parser.parse_args()
    import tempfile

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pgdash-faults-"))
    workdir.mkdir(parents=True, exist_ok=True)
    everything = not (args.only_ratio or args.only_outage)
    rows: list[Row] = []
    fz = timing = outage = None
    if everything:
        row, _ = kill_mid_burst(workdir, 5_000 if args.quick else 20_000)
        rows.append(row)
        rows.append(db_locked(workdir)[0])
        rows.append(disk_full(workdir)[0])
        rows += flood_and_garbage(workdir)[0]
        rows.append(server_down(workdir, steps=200 if args.quick else 400)[0])
    if everything or args.only_outage:
        row, outage = long_outage(workdir, args.outage_s or (20.0 if args.quick else 150.0))
        rows.append(row)
    if everything:
        fz = fuzz(workdir)
    if everything or args.only_ratio:
        timing = step_time_ratio(workdir, rounds=args.rounds or (8 if args.quick else 40),
                                 block_s=args.block_s)

    print(f"\npgdash fault table ({workdir})\n")
    if rows:
        print(f"| {'fault':<28} | {'acknowledged':>12} | {'stored':>7} | {'lost':>4} | "
              f"{'doubled':>7} | note")
        print(f"|{'-' * 30}|{'-' * 14}|{'-' * 9}|{'-' * 6}|{'-' * 9}|------")
        for r in rows:
            print(f"| {r.fault:<28} | {r.acknowledged:>12} | {r.stored:>7} | {r.lost:>4} | "
                  f"{r.doubled:>7} | {r.note}")
    if outage:
        print_outage(outage)
    if fz:
        print(f"\nfuzz cases tried: {fz['cases']}, failures: {fz['failed']} "
              f"(pytest rc {fz['rc']})")
    if timing:
        print_ratio(timing)
    if rows or fz:
        total_bad = sum(r.lost + r.doubled for r in rows) + (fz["failed"] if fz else 0)
        print(f"goal 0 lost, 0 doubled, 0 fuzz failures: "
              f"{'met' if total_bad == 0 else 'MISSED'}")


if __name__ == "__main__" and sys.argv[1:2] == ["--read-page-dropped"]:
    print(json.dumps(_read_page_dropped(sys.argv[2], int(sys.argv[3]))))
elif __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
