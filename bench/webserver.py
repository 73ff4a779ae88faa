"""Werkzeug's threads, or a production WSGI server, under pgdash's page, API and Socket.IO?

Issue 24 asks pgdash either to serve browsers the way production Flask-SocketIO deployments
run, or to show by measurement why its own design is the better one. This bench serves one
live job to simulated browsers three ways, on the same machine, in one run:

* ``werkzeug``: ``pgdash serve`` as users run it: Werkzeug's threaded server (a thread per
  connection) behind the asyncio front that keeps agents of protocol v2 on one loop, one port;
* ``gthread``: gunicorn, one worker, ``-k gthread --threads T`` (``--threads``, 100): the
  deployment Flask-SocketIO's docs give for its threading mode, the one pgdash uses;
* ``gevent``: gunicorn, one worker, ``-k gevent``: greenlets on one OS thread, everything
  monkey-patched (threads included: the writer, the diagnosis timer, the front's loop).

The two gunicorn modes serve the same Flask app with the same services
(``bench/webserver_app.py``); gunicorn owns the HTTP port, so their agents connect to the
front on a second port. Each mode: ``--ranks`` simulated agents at the agent's defaults
(``bench.capacity``'s, protocol v2), then, for each count in ``--browsers``, that many
simulated browsers, each as the job page is: a Socket.IO websocket on ``/ui`` that watches
the job and answers the server's pings (Engine.IO 4, spoken here over ``websockets``), while
one prober asks ``GET /api/jobs/<id>`` and the page's HTML twice a second. Measured over
``--seconds``:

* **API p50/p95** and **page p95**: the prober's request times (a request that fails or
  takes over 30 s counts as 30 s);
* **pushes**: live updates received per browser-second, and the longest gap between two at
  one browser (a stalled push shows up there);
* **watching**: browsers whose watch was acknowledged, of those asked;
* **fresh p95**: the age of the ranks' newest event in the job API (ingest keeping up);
* the server's **CPU** (process and children, as a share of one core), **threads** and
  **RSS**, and the bench's own CPU beside it (the machine's two cores are shared).

Needs gunicorn and gevent in the interpreter given by ``--python`` (not pgdash's
dependencies; a venv that sees pgdash's)::

    python3 -m venv /tmp/gvenv
    echo "$PWD/.venv/lib/python3.11/site-packages" > \\
        /tmp/gvenv/lib/python3.11/site-packages/pgdash.pth
    /tmp/gvenv/bin/pip install gunicorn gevent
    python -m bench.webserver --python /tmp/gvenv/bin/python            # 512 ranks
    python -m bench.webserver --python /tmp/gvenv/bin/python --ranks 1024 --browsers 10,200

A measurement, not a test: exit status 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import websockets

from bench.capacity import Bench, get, launch, proc_stats, tree_cpu, tree_pids
from bench.common import OPS_PER_SECOND, fmt, pct, stop_by_pid
from tests.helpers.procs import ROOT, ServerProcess, free_port, wait_for

MODES = ("werkzeug", "gthread", "gevent")
SLOW_S = 30.0  # a probe that fails or takes longer counts as this long


class Browsers:
    """Simulated job pages: Socket.IO (Engine.IO 4) over a websocket, watching one job."""

    def __init__(self, url: str, job_id: int):
        self.ws_url = "ws" + url[len("http"):] + "/socket.io/?EIO=4&transport=websocket"
        self.job_id = job_id
        self.watching = 0
        self.measuring = False
        self.pushes = 0
        self.gaps: list[float] = []  # per browser, the longest gap between pushes measured
        self.errors: list[str] = []

    async def one(self) -> None:
        last = None
        longest = 0.0
        try:
            async with websockets.connect(self.ws_url, max_size=None, open_timeout=60,
                                          ping_interval=None) as ws:
                opened = await asyncio.wait_for(ws.recv(), 60)
                if not opened.startswith("0"):
                    raise OSError(f"not an Engine.IO open: {opened[:60]!r}")
                await ws.send("40/ui,")
                await ws.send('42/ui,0["watch",{"job":%d}]' % self.job_id)
                async for msg in ws:
                    if msg == "2":  # the server's ping
                        await ws.send("3")
                    elif msg.startswith("43/ui,0"):  # the watch's acknowledgement
                        if '"ok":true' not in msg.replace(" ", ""):
                            raise OSError(f"watch refused: {msg[:120]}")
                        self.watching += 1
                    elif msg.startswith("42/ui,"):
                        now = time.monotonic()
                        if self.measuring:
                            self.pushes += 1
                            if last is not None:
                                longest = max(longest, now - last)
                        last = now
        except asyncio.CancelledError:
            if longest:
                self.gaps.append(longest)
            raise
        except (OSError, asyncio.TimeoutError, websockets.WebSocketException) as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}"[:200])


class Prober(threading.Thread):
    """Asks the job API and the job page twice a second; records the seconds each took, and
    the ranks' freshness from the API's answer."""

    def __init__(self, url: str, job_id: int, world: int):
        super().__init__(daemon=True)
        self.url, self.job_id, self.world = url, job_id, world
        self.api: list[float] = []
        self.page: list[float] = []
        self.ages: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            t = time.monotonic()
            try:
                detail = get(f"{self.url}/api/jobs/{self.job_id}", timeout=SLOW_S)
                self.api.append(time.monotonic() - t)
                now = time.time()
                self.ages.extend(now - r["last_seen"] for r in detail["ranks"] if r["last_seen"])
                self.ages.extend([float("inf")] * (self.world - len(detail["ranks"])))
            except (OSError, ValueError):
                self.api.append(SLOW_S)
            t = time.monotonic()
            try:
                with urllib.request.urlopen(f"{self.url}/jobs/{self.job_id}",
                                            timeout=SLOW_S) as resp:
                    resp.read()
                self.page.append(time.monotonic() - t)
            except OSError:
                self.page.append(SLOW_S)


def start(mode: str, db: str, args, workdir: Path):
    """The server of ``mode``: (HTTP URL, agents' URL, process)."""
    log_path = workdir / f"server-{mode}.log"
    if mode == "werkzeug":
        srv = ServerProcess(db, log_path=log_path).start()
        return srv.url, srv.url, srv.proc
    port, v2_port = free_port(), free_port()
    worker = ["-k", "gthread", "--threads", str(args.threads)] if mode == "gthread" else \
        ["-k", "gevent", "--worker-connections", "10000"]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [args.python, "-m", "gunicorn", "-w", "1", *worker, "-b", f"127.0.0.1:{port}",
             "--timeout", "120", "--graceful-timeout", "5", "bench.webserver_app:app"],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            env={**os.environ, "PGDASH_BENCH_DB": db, "PGDASH_BENCH_V2_PORT": str(v2_port)})
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"{mode}: gunicorn exited: {log_path.read_text()[-2000:]}")
        try:
            return get(url + "/api/jobs", timeout=5) is not None
        except (OSError, ValueError):
            return False

    wait_for(answers, 60, f"gunicorn ({mode}) on {url}")
    return url, f"http://127.0.0.1:{v2_port}", proc


def server_figures(pid: int) -> tuple[float, int, int]:
    """(CPU seconds of the process and its children, RSS bytes, threads) of them all."""
    rss = threads = 0
    for p in tree_pids(pid):
        try:
            _, r, t = proc_stats(p)
        except (OSError, StopIteration):  # gone meanwhile
            continue
        rss, threads = rss + r, threads + t
    return tree_cpu(pid), rss, threads


async def run_mode(mode: str, args, workdir: Path) -> list[dict]:
    db = f"sqlite:///{workdir / f'{mode}.sqlite'}"
    url, v2_url, proc = start(mode, db, args, workdir)
    rows = []
    try:
        bench = Bench([v2_url], args.ranks, OPS_PER_SECOND, f"web-{mode}-{uuid.uuid4().hex[:6]}")
        stop = asyncio.Event()
        _, agent_tasks = await launch(bench, "v2", stop)
        t0 = time.monotonic()
        while bench.connected < args.ranks and time.monotonic() - t0 < 120:
            await asyncio.sleep(0.5)
        await asyncio.sleep(args.settle)
        loop = asyncio.get_running_loop()
        jobs = (await loop.run_in_executor(None, get, url + "/api/jobs"))["jobs"]
        job_id = next(j["id"] for j in jobs if j["name"] == bench.job)
        for count in args.browsers:
            browsers = Browsers(url, job_id)
            tasks = []
            for i in range(count):
                tasks.append(asyncio.create_task(browsers.one()))
                if i % 50 == 49:
                    await asyncio.sleep(0.2)
            t0 = time.monotonic()
            while browsers.watching + len(browsers.errors) < count and \
                    time.monotonic() - t0 < 60:
                await asyncio.sleep(0.5)
            await asyncio.sleep(3)
            prober = Prober(url, job_id, args.ranks)
            cpu0, own0, t0 = server_figures(proc.pid)[0], time.process_time(), time.monotonic()
            browsers.measuring = True
            prober.start()
            await asyncio.sleep(args.seconds)
            browsers.measuring = False
            prober.stop.set()
            await loop.run_in_executor(None, prober.join, SLOW_S * 2)
            cpu1, rss, threads = server_figures(proc.pid)
            wall = time.monotonic() - t0
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            row = {"mode": mode, "ranks": args.ranks, "browsers": count,
                   "watching": browsers.watching, "api_p50": pct(prober.api, 0.5),
                   "api_p95": pct(prober.api, 0.95), "page_p95": pct(prober.page, 0.95),
                   "pushes": browsers.pushes / max(1, count) / wall if count else None,
                   "gap_max": max(browsers.gaps) if browsers.gaps else None,
                   "fresh_p95": pct(prober.ages, 0.95), "cpu": (cpu1 - cpu0) / wall,
                   "own_cpu": (time.process_time() - own0) / wall, "threads": threads,
                   "rss_mb": rss / 2**20, "errors": browsers.errors[:3],
                   "reconnects": bench.reconnects}
            rows.append(row)
            print_row(row)
            await asyncio.sleep(3)  # the closed websockets leave the server
        stop.set()
        await asyncio.gather(*agent_tasks, return_exceptions=True)
    finally:
        stop_by_pid([proc])
    return rows


HEADER = (f"{'server':>9} {'ranks':>5} {'browsers':>8} {'watching':>8} {'API p50':>8} "
          f"{'API p95':>8} {'page p95':>8} {'pushes/s':>8} {'gap max':>8} {'fresh p95':>9} "
          f"{'CPU':>5} {'bench':>5} {'threads':>7} {'RSS':>7}")


def print_row(r: dict) -> None:
    print(f"{r['mode']:>9} {r['ranks']:>5} {r['browsers']:>8} {r['watching']:>8} "
          f"{fmt(r['api_p50'], '.3f'):>8} {fmt(r['api_p95'], '.3f'):>8} "
          f"{fmt(r['page_p95'], '.3f'):>8} {fmt(r['pushes'], '.2f'):>8} "
          f"{fmt(r['gap_max'], '.1f'):>8} {fmt(r['fresh_p95'], '.2f'):>9} "
          f"{r['cpu']:>5.0%} {r['own_cpu']:>5.0%} {r['threads']:>7} {r['rss_mb']:>5.0f}MB"
          + (f"  errors: {r['errors']}" if r["errors"] else ""), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--python", default=sys.executable,
                   help="an interpreter with gunicorn and gevent that imports pgdash")
    p.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    p.add_argument("--ranks", type=int, default=512)
    p.add_argument("--browsers", default="10,100,300",
                   help="browser counts, each measured in turn on the same server")
    p.add_argument("--threads", type=int, default=100, help="gthread's threads")
    p.add_argument("--seconds", type=float, default=20.0, help="measured window per count")
    p.add_argument("--settle", type=float, default=10.0, help="after the agents connected")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON to FILE")
    args = p.parse_args()
    args.browsers = [int(x) for x in args.browsers.split(",")]
    modes = args.modes.split(",")
    if unknown := set(modes) - set(MODES):
        p.error(f"--modes: unknown {sorted(unknown)}; pick from {', '.join(MODES)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="pgdash-web-") as tmp:
        print(HEADER, flush=True)
        for mode in modes:
            try:
                rows += asyncio.run(run_mode(mode, args, Path(tmp)))
            except SystemExit as exc:  # a mode that does not start: said, the others run
                print(f"{mode:>9}: did not start: {exc}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
