"""How long until another server process diagnoses a job after its owner dies, and is any
acknowledged event lost?

Starts here, all on 127.0.0.1 and stopped by PID: a throwaway PostgreSQL and redis-server
(``tests/helpers/realservers.py``), two ``pgdash serve --queue ... --hang-after H`` processes
on that database, and a TCP round-robin balancer in front of them
(``tests/helpers/tcp_balancer.py``; what skips a dead backend, as any load balancer does).
Then, per round:

1. **reference** (nobody killed): a 3-rank gloo job (``tests/jobs/fault_job.py hang``) through
   the balancer, so its ranks land on both processes; the last rank stops calling collectives.
   **detection** = first ``GET /findings`` response (polled every 0.1 s) holding the hang -
   the fault time the rank prints. It includes the ``--hang-after`` threshold.
2. **failover**: the same job; the moment the fault is injected, the process that owns the job
   (``job_owners``) is killed with SIGKILL. **takeover** = kill -> the survivor holds the
   job's lease; **detection** as above, polled on the survivor. Failover cost = failover
   detection - reference detection (goal: takeover <= 10 s).
3. **acknowledged vs stored**: meanwhile ``--senders`` synthetic agents (the real wire
   protocol, through the balancer) send numbered heartbeats and record each acknowledgement;
   on a lost connection they reconnect, as the agent does, and resend what was not
   acknowledged. Afterwards every acknowledged seq must be in PostgreSQL (goal: 0 lost).

The killed process is restarted between rounds. A measurement, not a test: exit status 0
whatever the figures, 1 only if the bench itself broke. Run from the repository root::

    python -m bench.failover [--rounds 3] [--lease 5] [--hang-after 3]
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import socketio
import sqlalchemy as sa

from pgdash_agent.wire import AGENT_NAMESPACE, PROTOCOL_VERSION
from tests.helpers.procs import ServerProcess, get_json, launch_job, stored_events, wait_for
from tests.helpers.realservers import PostgresServer, RedisServer, postgres_bin
from tests.helpers.tcp_balancer import Balancer


class Sender(threading.Thread):
    """A synthetic agent: numbered heartbeats, acknowledged one batch at a time."""

    def __init__(self, url: str, name: str, batch: int = 20, pause: float = 0.02):
        super().__init__(daemon=True)
        self.url, self.session, self.batch, self.pause = url, name, batch, pause
        self.acked: set[int] = set()
        self.reconnects = 0
        self.stopping = threading.Event()
        self.next_seq = 1
        self.rank = int(name.rsplit("-", 1)[1])

    def _client(self):
        client = socketio.Client(reconnection=False)
        client.connect(self.url, namespaces=[AGENT_NAMESPACE], transports=["websocket"],
                       auth={"v": PROTOCOL_VERSION, "session": self.session, "job": "senders",
                             "rank": self.rank, "host": "bench",
                             "pid": 1}, wait_timeout=5)
        return client

    def run(self) -> None:
        client = None
        pending: list[dict] = []
        while not self.stopping.is_set():
            try:
                if client is None:
                    client = self._client()
                if not pending:
                    pending = [{"seq": self.next_seq + i, "t": time.time(), "kind": "heartbeat",
                                "body": {"groups": []}} for i in range(self.batch)]
                    if self.next_seq == 1:
                        pending[0] = {"seq": 1, "t": time.time(), "kind": "hello", "body": {
                            "job": "senders", "rank": self.rank, "world_size": 1, "host": "bench",
                            "pid": 1, "backend": "gloo"}}
                    self.next_seq += self.batch
                ack = client.call("batch", {"v": PROTOCOL_VERSION, "events": pending},
                                  namespace=AGENT_NAMESPACE, timeout=10)
                if ack and ack.get("ok"):
                    self.acked.update(ev["seq"] for ev in pending)
                    pending = []
                time.sleep(self.pause)
            except Exception:
                self.reconnects += 1
                if client is not None:
                    try:
                        client.disconnect()
                    except Exception:
                        pass
                client = None
                time.sleep(0.5)
        if client is not None:
            client.disconnect()


def owner(engine, job_id: int) -> str | None:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT owner FROM job_owners WHERE job_id = :j"),
                            {"j": job_id}).scalar()


def fault_time(log: Path) -> float | None:
    found = re.search(r"FAULT (\d+\.\d+)", log.read_text(errors="replace")) \
        if log.exists() else None
    return float(found.group(1)) if found else None


def run_job(name: str, balancer: Balancer, servers: list[ServerProcess], engine, tmp: Path,
            kill_owner: bool) -> dict:
    procs = launch_job("fault_job.py", 3, balancer.url, name, tmp, args=["hang", "40"])
    out: dict = {}
    try:
        job = wait_for(lambda: next((j for s in servers if s.proc.poll() is None
                                     for j in s.api("/api/jobs")["jobs"]
                                     if j["name"] == name), None), 60, f"job {name}")
        fault_log = tmp / f"{name}-rank2.log"
        fault = wait_for(lambda: fault_time(fault_log), 120, "the fault")
        watch = servers
        if kill_owner:
            held = wait_for(lambda: owner(engine, job["id"]), 30, "an owner")
            dead = next(s for s in servers if f":{s.proc.pid}:" in held)
            dead.kill()
            killed = time.time()
            survivor = next(s for s in servers if s is not dead)
            wait_for(lambda: (o := owner(engine, job["id"])) and f":{survivor.proc.pid}:" in o,
                     60, "the survivor's lease", interval=0.05)
            out["takeover_s"] = time.time() - killed
            out["dead"] = dead
            watch = [survivor]
        wait_for(lambda: any(f["kind"] == "hang" and f["active"] and f["ranks"] == [2]
                             for f in get_json(f"{watch[0].url}/api/jobs/{job['id']}/findings")
                             ["findings"]), 120, "the hang finding", interval=0.1)
        out["detection_s"] = time.time() - fault
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lease", type=float, default=5.0)
    parser.add_argument("--hang-after", type=float, default=3.0)
    parser.add_argument("--senders", type=int, default=2)
    args = parser.parse_args()

    bin_dir = postgres_bin()
    if bin_dir is None or not shutil.which("redis-server"):
        print("failover: needs Debian's postgresql and redis-server packages", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="pgdash-failover-"))
    pg = PostgresServer(bin_dir).start()
    redis = RedisServer(shutil.which("redis-server")).start()
    url = pg.new_database()
    engine = sa.create_engine(url)
    extra = ["--queue", redis.url, "--lease", str(args.lease), "--hang-after",
             str(args.hang_after)]
    servers = [ServerProcess(url, extra=extra, log_path=tmp / f"server{i}.log").start()
               for i in range(2)]
    balancer = Balancer([("127.0.0.1", s.port) for s in servers]).start()
    senders: list[Sender] = []
    rows = []
    try:
        senders = [Sender(balancer.url, f"sender-{i}") for i in range(args.senders)]
        for s in senders:
            s.start()
        for r in range(args.rounds):
            ref = run_job(f"ref{r}", balancer, servers, engine, tmp, kill_owner=False)
            fo = run_job(f"failover{r}", balancer, servers, engine, tmp, kill_owner=True)
            dead = fo.pop("dead")
            rows.append((ref["detection_s"], fo["detection_s"], fo["takeover_s"]))
            print(f"round {r + 1}: reference detection {ref['detection_s']:5.2f} s | "
                  f"owner killed: takeover {fo['takeover_s']:5.2f} s, detection "
                  f"{fo['detection_s']:5.2f} s "
                  f"(cost {fo['detection_s'] - ref['detection_s']:+.2f} s)", flush=True)
            dead.start()  # back on its port, for the next round
        for s in senders:
            s.stopping.set()
        for s in senders:
            s.join(timeout=30)
        log = stored_events(url)  # rows and packs: the senders outlast PGDASH_PACK_AFTER_S
        lost = stored_total = acked_total = 0
        for s in senders:
            stored = {ev["seq"] for ev in log if ev["session"] == s.session
                      and ev["seq"] is not None}
            lost += len(s.acked - stored)
            stored_total += len(stored)
            acked_total += len(s.acked)
        reconnects = sum(s.reconnects for s in senders)
        refs, fos, takes = zip(*rows)
        print(f"\n{args.rounds} round(s), --lease {args.lease:g}, --hang-after "
              f"{args.hang_after:g}, 2 processes, PostgreSQL + Redis on this machine")
        print(f"takeover (kill -> survivor holds the lease): median "
              f"{statistics.median(takes):.2f} s, max {max(takes):.2f} s  (goal <= 10 s: {'met' if max(takes) <= 10 else 'MISSED'})")
        print(f"hang detection, reference: median {statistics.median(refs):.2f} s; with the "
              f"owner killed at the fault: median {statistics.median(fos):.2f} s, "
              f"max {max(fos):.2f} s")
        print(f"events acknowledged {acked_total}, stored {stored_total}, acknowledged but not "
              f"stored {lost} (goal 0: {'met' if lost == 0 else 'MISSED'}); sender "
              f"reconnects {reconnects}")
        return 0
    except AssertionError as exc:
        print(f"failover: the bench broke: {exc}", file=sys.stderr)
        return 1
    finally:
        for s in senders:
            s.stopping.set()
        balancer.stop()
        for s in servers:
            s.stop()
        engine.dispose()
        redis.stop()
        pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
