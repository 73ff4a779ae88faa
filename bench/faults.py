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

``lost`` counts events acknowledged as stored but absent from the database; ``doubled``
counts events stored more than once. The goal is 0 and 0 in every row. Step times are
compared within the same run in adjacent pairs (up then down, down then up, ...), and the
ratio is the median of the pairs' ratios, so the drifting load of a shared machine cancels.

Run from the repository root with ``.[test]`` installed::

    python bench/faults.py            # every fault, fuzz, and 2 x 2 timed training runs
    python bench/faults.py --quick    # smaller bursts and shorter training
"""

from __future__ import annotations

import argparse
import dataclasses
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import socketio  # noqa: E402

from agent.wire import AGENT_NAMESPACE, PROTOCOL_VERSION  # noqa: E402
from conftest import (ServerProcess, free_port, job_by_name, launch_job, wait_for,  # noqa: E402
                      wait_job)


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
    """seq -> how many times it is stored, per session (read straight from the file)."""
    with sqlite3.connect(db, timeout=30) as conn:
        out: dict[str, dict[int, int]] = {s: {} for s in sessions}
        for session, seq, n in conn.execute(
                "SELECT session, seq, COUNT(*) FROM events WHERE seq IS NOT NULL "
                "GROUP BY session, seq"):
            if session in out:
                out[session][seq] = n
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
    from dashboard.app import create_app
    from dashboard.cli import Server

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


def timed_job(workdir: Path, server_url: str, name: str, steps: int,
              env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run tests/jobs/timed_job.py on 2 ranks; each rank's RESULT line."""
    procs = launch_job("timed_job.py", 2, server_url, name, workdir, args=[str(steps)],
                       env={"PGDASH_FLUSH_TIMEOUT_S": "5", **(env or {})})
    codes = wait_job(procs, 600, workdir)
    if codes != [0, 0]:
        raise AssertionError(f"{name}: exit codes {codes}")
    results = []
    for rank in (0, 1):
        text = (workdir / f"{name}-rank{rank}.log").read_text()
        line = next(x for x in text.splitlines() if x.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT "):]))
    return results


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
        codes = wait_job(procs, 300, workdir)
        assert codes == [0, 0], codes
        job = wait_for(lambda: (j := job_by_name(srv, "down")) and j["status"] == "finished"
                       and j, 60, "the job after the server came up")
        ranks = srv.api(f"/api/jobs/{job['id']}")["ranks"]
        results = []
        for rank in (0, 1):
            text = (workdir / f"down-rank{rank}.log").read_text()
            line = next(x for x in text.splitlines() if x.startswith("RESULT "))
            results.append(json.loads(line[len("RESULT "):]))
        dropped_agent = sum(sum(r["dropped"].values()) for r in results)
        dropped_shown = sum(sum((r.get("dropped") or {}).values()) for r in ranks)
        max_buffered = max(r["max_buffered"] for r in results)
        with sqlite3.connect(db) as conn:
            stored = conn.execute("SELECT COUNT(*) FROM events WHERE seq IS NOT NULL"
                                  ).fetchone()[0]
        row = Row("server down while training", 0, stored, 0, 0,
                  f"agent buffer peak {max_buffered} <= {buffer}; dropped {dropped_agent} "
                  f"(counted), {dropped_shown} shown in /api/jobs/<id>")
        return row, {"ranks": ranks, "results": results, "max_buffered": max_buffered,
                     "buffer": buffer, "dropped_agent": dropped_agent,
                     "dropped_shown": dropped_shown}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if srv is not None:
            srv.stop()


def step_time_ratio(workdir: Path, steps: int, rounds: int = 6) -> dict[str, Any]:
    """Median step time with the server down against up. Runs come in adjacent pairs (up
    then down, then down then up, ...) and the verdict is the median of the pairs' ratios, so
    that the load of a shared machine, which drifts over minutes, cancels out."""
    srv = ServerProcess(f"sqlite:///{workdir / 'timing.db'}",
                        log_path=workdir / "timing.log").start()
    dead = f"http://127.0.0.1:{free_port()}"
    times: dict[str, list[float]] = {"up": [], "down": []}
    ratios = []
    try:
        for i in range(rounds):
            medians = {}
            for mode in (("up", "down") if i % 2 == 0 else ("down", "up")):
                url = srv.url if mode == "up" else dead
                run = [t for r in timed_job(workdir, url, f"timing-{mode}-{i}", steps)
                       for t in r["times"]]
                times[mode] += run
                medians[mode] = statistics.median(run)
            ratios.append(medians["down"] / medians["up"])
    finally:
        srv.stop()
    up, down = statistics.median(times["up"]), statistics.median(times["down"])
    return {"up_ms": up * 1e3, "down_ms": down * 1e3, "ratio": statistics.median(ratios),
            "pair_ratios": [round(r, 3) for r in ratios],
            "steps": {k: len(v) for k, v in times.items()}}


def fuzz(workdir: Path) -> dict[str, Any]:
    """Run tests/test_fuzz.py; count its cases and failures."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                           str(ROOT / "tests" / "test_fuzz.py")], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    cases = sum(int(n) for n in re.findall(r"fuzz \w+: (\d+) cases", done.stdout))
    failed = re.search(r"(\d+) failed", done.stdout)
    return {"cases": cases, "failed": int(failed.group(1)) if failed else 0,
            "rc": done.returncode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller bursts, fewer steps")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    import tempfile

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pgdash-faults-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    row, _ = kill_mid_burst(workdir, 5_000 if args.quick else 20_000)
    rows.append(row)
    rows.append(db_locked(workdir)[0])
    rows.append(disk_full(workdir)[0])
    rows += flood_and_garbage(workdir)[0]
    rows.append(server_down(workdir, steps=200 if args.quick else 400)[0])
    fz = fuzz(workdir)
    timing = step_time_ratio(workdir, steps=300 if args.quick else 1000,
                             rounds=4 if args.quick else 8)

    print(f"\npgdash fault table ({workdir})\n")
    print(f"| {'fault':<28} | {'acknowledged':>12} | {'stored':>7} | {'lost':>4} | "
          f"{'doubled':>7} | note")
    print(f"|{'-' * 30}|{'-' * 14}|{'-' * 9}|{'-' * 6}|{'-' * 9}|------")
    for r in rows:
        print(f"| {r.fault:<28} | {r.acknowledged:>12} | {r.stored:>7} | {r.lost:>4} | "
              f"{r.doubled:>7} | {r.note}")
    print(f"\nfuzz cases tried: {fz['cases']}, failures: {fz['failed']} (pytest rc {fz['rc']})")
    print(f"training step time (2 gloo ranks, {timing['steps']} steps): median server up "
          f"{timing['up_ms']:.3f} ms, down {timing['down_ms']:.3f} ms; ratio down/up, median "
          f"of {len(timing['pair_ratios'])} adjacent pairs: {timing['ratio']:.3f} (goal <= "
          f"1.02); pairs: {timing['pair_ratios']}")
    total_bad = sum(r.lost + r.doubled for r in rows) + fz["failed"]
    print(f"goal 0 lost, 0 doubled, 0 fuzz failures: {'met' if total_bad == 0 else 'MISSED'}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
