"""How many ranks does one pgdash server hold? Freshness, acks, CPU and memory per rank.

What runs: a real ``pgdash serve`` process (this repository's, on 127.0.0.1, a fresh SQLite
file), and N simulated agents in one asyncio process speaking the real agent protocol over
real websockets (the ``websockets`` package): ``--wire v1`` is the Socket.IO ``/agent``
namespace every agent up to 0.1 speaks, ``--wire v2`` the compact path beside it
(``agent.wire`` ``AGENT_V2_PATH``, MessagePack frames). Each agent connects, sends what a
real agent sends at start (hello, the rendezvous, its process groups of a DP x PP x TP mesh),
then once a second, at its own random phase, one batch: a heartbeat (progress per group), a
latency summary (``coll_stats``: ``--ops`` rows with latency histograms) and a GPU reading:
about 3.6 kB of JSON per rank-second, what the agent sends on a GPU host at the default 1 Hz.

Measured per N, over ``--seconds`` of steady state after everybody connected:

* **freshness**: every ``--probe`` seconds, ``GET /api/jobs/<id>``; for each rank, the probe
  time minus its ``last_seen`` (the agent's time of its newest event the server has folded).
  A server that keeps up shows 0-1 s (ranks report once a second); p95 over all samples.
* **ack**: seconds from sending a batch to its acknowledgement (it is sent after the batch
  is committed to the database); p95.
* **server CPU**: user+system CPU seconds of the server process over the window (from
  ``/proc``), as CPU-seconds per rank-hour, and as a share of one core.
* **RSS** and threads of the server process at the end; **findings** (warning or critical)
  the healthy job raised; **lag** the server reported (``/metrics``); reconnects.

Reference in the same run: the first N given (e.g. 64) is a load any version holds, so a
busy machine shows up as worse figures there too.

A measurement, not a test: exit status 0 whatever the figures. From the repository root::

    python bench/capacity.py                         # 256 and 1,024 ranks, v2
    python bench/capacity.py --ranks 64,256,1024 --wire v1 --seconds 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import websockets  # noqa: E402

from agent import wire  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


# -- the job the simulated agents play ------------------------------------------------------

def mesh_groups(world: int) -> dict[int, list[tuple[str, str, list[int]]]]:
    """Per rank: the world group and its dp/pp/tp groups of a (dp, pp, tp=8) mesh."""
    tp = 8 if world % 8 == 0 else 1
    pp = 8 if world % (tp * 8) == 0 and world >= 256 else 1
    dp = world // (tp * pp)
    rank = lambda d, p, t: (d * pp + p) * tp + t  # noqa: E731
    member: dict[int, list[tuple[str, str, list[int]]]] = {r: [] for r in range(world)}
    groups = [("0", "default_pg", list(range(world)))]
    for desc, parts in (
            ("mesh_dp", [[rank(d, p, t) for d in range(dp)] for p in range(pp) for t in range(tp)]),
            ("mesh_pp", [[rank(d, p, t) for p in range(pp)] for d in range(dp) for t in range(tp)]),
            ("mesh_tp", [[rank(d, p, t) for t in range(tp)] for d in range(dp) for p in range(pp)])):
        for ranks in parts:
            groups.append((str(len(groups)), desc, sorted(ranks)))
    for g in groups:
        for r in g[2]:
            member[r].append(g)
    return member


OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "barrier",
       "send", "recv", "all_to_all_single", "gather")


def start_events(rank: int, world: int, job: str, groups) -> list[tuple[str, dict]]:
    host = f"node{rank // 8:04d}"
    now = time.time()
    env = {"MASTER_ADDR": "node0000", "MASTER_PORT": "29500", "WORLD_SIZE": str(world),
           "RANK": str(rank), "LOCAL_RANK": str(rank % 8), "NCCL_DEBUG": "WARN",
           "NCCL_SOCKET_IFNAME": "ib0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    events = [("hello", {"job": job, "rank": rank, "world_size": world, "local_rank": rank % 8,
                         "host": host, "pid": 10_000 + rank, "backend": "nccl",
                         "device": f"cuda:{rank % 8}", "gpu_uuid": f"GPU-{uuid.uuid4()}",
                         "versions": {"torch": "2.13.0", "cuda": "13.0", "nccl": "2.27.5",
                                      "python": "3.11.7"}, "env": env}),
              ("init_start", {"init_method": "env://", "backend": "nccl", "rank": rank,
                              "world_size": world, "master_addr": "node0000",
                              "master_port": "29500", "timeout_s": 600.0}),
              ("init_done", {"rank": rank, "world_size": world, "backend": "nccl",
                             "duration_s": 1.0})]
    for name, desc, ranks in groups:
        events.append(("group", {"name": name, "desc": desc, "backend": "nccl",
                                 "ranks": ranks}))
    return [(k, b, now) for k, b in events]


def second_events(rank: int, step: int, groups, ops: int, rng: random.Random):
    """What an agent sends each second: heartbeat, latency summary, GPU reading."""
    now = time.time()
    progress = [{"group": g[0], "entered": step * 20, "completed": step * 20,
                 "inflight_op": None, "inflight_since": None} for g in groups]
    rows = []
    for i in range(ops):
        g = groups[i % len(groups)][0]
        base = 77 + (i % 5) * 6
        rows.append({"group": g, "op": OPS[i % len(OPS)], "count": 20,
                     "bytes": 20 * (4 << (20 - i)), "sum_us": 20 * 1000.0 * (1 + rng.random()),
                     "max_us": 4000.0 * (1 + rng.random()),
                     "hist": [[base + j, 1 + rng.randrange(4)] for j in range(8)]})
    gpu = {"uuid": "GPU-0", "name": "NVIDIA H200", "lost": False, "reasons": [], "xids": [],
           "values": {"util_gpu": 97.0, "util_mem": 40.0, "mem_used": 7.1e10,
                      "mem_total": 1.4e11, "temp_c": 61.0 + rng.random(),
                      "power_w": 600.0 + 50 * rng.random(), "power_limit_w": 700.0,
                      "sm_clock_mhz": 1980.0, "sm_clock_max_mhz": 1980.0,
                      "ecc_uncorrected": 0.0, "ecc_corrected": 0.0, "pcie_replay": 0.0,
                      "remapped_correctable": 0.0, "remapped_uncorrectable": 0.0,
                      "remap_pending": 0.0, "remap_failure": 0.0}}
    return [("heartbeat", {"groups": progress, "dropped": {}, "buffered": 0}, now),
            ("coll_stats", {"start": now - 1.0, "end": now, "rows": rows}, now),
            ("gpu", gpu, now)]


# -- simulated agents -----------------------------------------------------------------------

class Agent:
    """One simulated rank: its own websocket, sequence numbers and acknowledgement times."""

    def __init__(self, bench: "Bench", rank: int):
        self.bench, self.rank = bench, rank
        self.session = uuid.uuid4().hex
        self.seq = 0
        self.sent: dict[int, float] = {}  # batch id -> send time (monotonic)
        self.next_id = 0
        self.ws = None

    def batch(self, events) -> list[dict]:
        out = []
        for kind, body, t in events:
            self.seq += 1
            out.append({"seq": self.seq, "t": t, "kind": kind, "body": body})
        return out

    def auth(self) -> dict:
        b = self.bench
        return {"v": wire.PROTOCOL_VERSION, "session": self.session, "job": b.job,
                "rank": self.rank, "host": f"node{self.rank // 8:04d}", "pid": 10_000 + self.rank}

    async def run(self, stop: asyncio.Event) -> None:
        b = self.bench
        groups = b.member[self.rank]
        rng = random.Random(self.rank)
        while not stop.is_set():
            try:
                await self._connect()
                b.connected += 1
                await self._send(start_events(self.rank, b.world, b.job, groups))
                await asyncio.sleep(rng.random())  # each agent at its own phase
                step = 0
                reader = asyncio.create_task(self._read())
                try:
                    next_at = time.monotonic()
                    while not stop.is_set():
                        step += 1
                        await self._send(second_events(self.rank, step, groups, b.ops, rng))
                        next_at += 1.0
                        try:
                            await asyncio.wait_for(stop.wait(),
                                                   timeout=max(0.0, next_at - time.monotonic()))
                        except asyncio.TimeoutError:
                            pass
                        if reader.done():  # the connection closed under us
                            reader.result()
                finally:
                    reader.cancel()
                if stop.is_set():
                    return
            except (OSError, websockets.ConnectionClosed, asyncio.TimeoutError) as exc:
                b.reconnects += 1
                b.last_error = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(1 + rng.random())
            finally:
                if self.ws is not None:
                    await self.ws.close()
                    self.ws = None

    def _acked(self, batch_id: int) -> None:
        sent = self.sent.pop(batch_id, None)
        if sent is not None and self.bench.measuring:
            self.bench.acks.append(time.monotonic() - sent)


class SocketIOAgent(Agent):
    """Protocol v1: Engine.IO 4 / Socket.IO 5 frames, the ``/agent`` namespace, JSON."""

    async def _connect(self) -> None:
        b = self.bench
        self.ws = await websockets.connect(f"{b.ws_url}/socket.io/?EIO=4&transport=websocket",
                                           max_size=None, open_timeout=60, ping_interval=None)
        opened = await asyncio.wait_for(self.ws.recv(), 60)
        if not opened.startswith("0"):
            raise OSError(f"unexpected Engine.IO open {opened[:60]!r}")
        await self.ws.send(f"40{wire.AGENT_NAMESPACE}," + json.dumps(self.auth()))
        while True:
            reply = await asyncio.wait_for(self.ws.recv(), 60)
            if reply == "2":
                await self.ws.send("3")
            elif reply.startswith(f"40{wire.AGENT_NAMESPACE},"):
                return
            else:
                raise OSError(f"connect refused: {reply[:200]}")

    async def _send(self, events) -> None:
        self.next_id += 1
        self.sent[self.next_id] = time.monotonic()
        payload = json.dumps([wire.BATCH_EVENT, {"v": wire.PROTOCOL_VERSION,
                                                 "events": self.batch(events)}])
        await self.ws.send(f"42{wire.AGENT_NAMESPACE},{self.next_id}{payload}")

    async def _read(self) -> None:
        prefix = f"43{wire.AGENT_NAMESPACE},"
        async for frame in self.ws:
            if frame == "2":
                await self.ws.send("3")
            elif frame.startswith(prefix):
                rest = frame[len(prefix):]
                digits = len(rest) - len(rest.lstrip("0123456789"))
                self._acked(int(rest[:digits]))


class CompactAgent(Agent):
    """Protocol v2: a plain websocket, one MessagePack frame per batch (agent.wire)."""

    async def _connect(self) -> None:
        b = self.bench
        self.ws = await websockets.connect(f"{b.ws_url}{wire.AGENT_V2_PATH}", max_size=None,
                                           open_timeout=60, ping_interval=None)
        await self.ws.send(wire.encode_v2({"auth": {**self.auth(), "v": 2}}))
        reply = wire.decode_v2(await asyncio.wait_for(self.ws.recv(), 60))
        if not reply.get("ok"):
            raise OSError(f"connect refused: {reply}")

    async def _send(self, events) -> None:
        self.next_id += 1
        self.sent[self.next_id] = time.monotonic()
        await self.ws.send(wire.encode_v2({"id": self.next_id, "events": self.batch(events)}))

    async def _read(self) -> None:
        async for frame in self.ws:
            ack = wire.decode_v2(frame)
            if isinstance(ack.get("id"), int):
                self._acked(ack["id"])


class Bench:
    def __init__(self, url: str, world: int, ops: int, job: str):
        self.url, self.ws_url = url, "ws" + url[len("http"):]
        self.world, self.ops, self.job = world, ops, job
        self.member = {r: [g for g in gs] for r, gs in mesh_groups(world).items()}
        self.connected = self.reconnects = 0
        self.last_error: str | None = None
        self.acks: list[float] = []
        self.measuring = False


# -- the server under test ------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 30.0):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body = resp.read()
    return body if url.endswith("/metrics") else json.loads(body)


def proc_stats(pid: int) -> tuple[float, int, int]:
    """(CPU seconds, RSS bytes, threads) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICK
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(next(line.split()[1] for line in status.splitlines()
                   if line.startswith("VmRSS:"))) * 1024
    threads = int(next(line.split()[1] for line in status.splitlines()
                       if line.startswith("Threads:")))
    return cpu, rss, threads


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def run_one(world: int, args, workdir: Path) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    db = workdir / f"capacity-{world}.db"
    log = open(workdir / f"server-{world}.log", "wb")
    server = subprocess.Popen([sys.executable, "-m", "dashboard", "serve", "--port", str(port),
                               "--db", f"sqlite:///{db}", *args.server_args.split()],
                              stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                get(url + "/api/jobs", 2)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(f"server did not start; see {log.name}")
                await asyncio.sleep(0.2)
        bench = Bench(url, world, args.ops, f"capacity-{world}-{uuid.uuid4().hex[:6]}")
        cls = CompactAgent if args.wire == "v2" else SocketIOAgent
        agents = [cls(bench, r) for r in range(world)]
        stop = asyncio.Event()
        tasks = []
        t_connect = time.monotonic()
        for i, a in enumerate(agents):  # a launch: ranks arrive over a few seconds
            tasks.append(asyncio.create_task(a.run(stop)))
            if i % 64 == 63:
                await asyncio.sleep(0.2)
        while bench.connected < world and time.monotonic() - t_connect < 120:
            await asyncio.sleep(0.5)
        connect_s = time.monotonic() - t_connect
        all_connected = bench.connected >= world
        await asyncio.sleep(args.settle)
        job = next((j for j in get(url + "/api/jobs")["jobs"] if j["name"] == bench.job), None)
        job_id = job["id"] if job else None
        cpu0, _, _ = proc_stats(server.pid)
        t0 = time.monotonic()
        bench.measuring = True
        reconnects0 = bench.reconnects
        ages: list[float] = []
        lags: list[float] = []
        loop = asyncio.get_running_loop()
        probe_errors: list[str] = []
        while time.monotonic() - t0 < args.seconds:
            await asyncio.sleep(args.probe)
            try:
                detail = await loop.run_in_executor(None, get, f"{url}/api/jobs/{job_id}")
            except (OSError, ValueError) as exc:  # a server too busy to answer: all stale
                probe_errors.append(f"job: {type(exc).__name__}: {exc}")
                ages += [float("inf")] * world
                continue
            now = time.time()
            ages += [now - r["last_seen"] for r in detail["ranks"] if r["last_seen"]]
            ages += [float("inf")] * (world - len(detail["ranks"]))
            try:
                text = (await loop.run_in_executor(None, get, url + "/metrics")).decode()
            except (OSError, ValueError) as exc:
                probe_errors.append(f"metrics: {type(exc).__name__}: {exc}")
                continue
            lag = metric(text, "pgdash_ingest_lag_seconds")
            if lag is not None:
                lags.append(lag)
        window = time.monotonic() - t0
        cpu1, rss, threads = proc_stats(server.pid)
        bench.measuring = False
        try:
            findings = get(f"{url}/api/jobs/{job_id}/findings", 120)["findings"]
        except (OSError, ValueError) as exc:
            findings = [{"kind": f"unreadable ({type(exc).__name__})", "severity": "warning"}]
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        cpu = cpu1 - cpu0
        return {
            "ranks": world, "connected": all_connected, "connect_s": connect_s,
            "fresh_p50": pct(ages, 0.5), "fresh_p95": pct(ages, 0.95),
            "ack_p95": pct(bench.acks, 0.95), "acks": len(bench.acks),
            "cpu_core": cpu / window, "cpu_rank_hour": cpu / window / world * 3600,
            "rss_mb": rss / 2**20, "threads": threads,
            "lag_max": max(lags) if lags else None,
            "findings": sorted({f"{f['kind']}:{f['severity']}" for f in findings
                                if f["severity"] in ("warning", "critical")}),
            "reconnects": bench.reconnects - reconnects0, "last_error": bench.last_error,
            "probe_errors": probe_errors[:3] + ([f"... {len(probe_errors)} in all"]
                                               if len(probe_errors) > 3 else []),
        }
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def fmt(v, spec=".2f"):
    if v is None:
        return "-"
    if isinstance(v, float) and v == float("inf"):
        return "inf"
    return format(v, spec)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="64,256,1024",
                   help="comma-separated numbers of simulated ranks; the first is the reference")
    p.add_argument("--wire", choices=("v1", "v2"), default="v2")
    p.add_argument("--seconds", type=float, default=30.0, help="measured window per N")
    p.add_argument("--settle", type=float, default=10.0,
                   help="seconds after all connected before measuring")
    p.add_argument("--probe", type=float, default=2.0, help="seconds between freshness probes")
    p.add_argument("--ops", type=int, default=9, help="coll_stats rows per rank-second")
    p.add_argument("--server-args", default="", help="extra arguments to pgdash serve")
    p.add_argument("--keep", metavar="DIR", help="keep the databases and server logs in DIR")
    args = p.parse_args()
    print(f"pgdash capacity: wire {args.wire}, {args.seconds:.0f} s measured per N, "
          f"{os.cpu_count()} CPUs; simulated agents in this process (asyncio), server in its "
          "own process", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pgdash-capacity-") as tmp:
        if args.keep:
            tmp = args.keep
            Path(tmp).mkdir(parents=True, exist_ok=True)
        for world in [int(x) for x in args.ranks.split(",")]:
            row = asyncio.run(run_one(world, args, Path(tmp)))
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print("| ranks | all connected | freshness p50 / p95 | ack p95 | server CPU | CPU-s per "
          "rank-hour | RSS | threads | lag max | findings | reconnects |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['ranks']} | {'yes' if r['connected'] else 'NO'} ({r['connect_s']:.0f} s) "
              f"| {fmt(r['fresh_p50'])} / {fmt(r['fresh_p95'])} s | {fmt(r['ack_p95'])} s "
              f"| {fmt(100 * r['cpu_core'], '.0f')}% of a core | {fmt(r['cpu_rank_hour'])} "
              f"| {fmt(r['rss_mb'], '.0f')} MB | {r['threads']} | {fmt(r['lag_max'])} s "
              f"| {', '.join(r['findings']) or 'none'} | {r['reconnects']} |")


if __name__ == "__main__":
    main()
