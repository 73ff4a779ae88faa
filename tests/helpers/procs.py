"""Real processes for tests and benches: a ``pgdash serve`` on a free port (stopped by PID),
real gloo jobs (one process per rank), and the HTTP reads and waits that go with them.

Imported as ``tests.helpers.procs`` by tests and by bench/ (``python -m bench.NAME`` runs from
the checkout, whose root is then on ``sys.path``)."""

from __future__ import annotations

import http.client
import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "tests" / "jobs"
# How long a test's Socket.IO client waits for its namespace to connect: python-socketio's
# default (1 s) failed a browser test once on a loaded machine.
WAIT_S = 10.0


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range where it can: a port the
    kernel handed out (bind to 0) may be handed out again to any outgoing connection before
    the test's process binds it (a torchrun rendezvous once timed out so under xdist and a CPU
    hog), while one below the range is only taken by a process that asks for it by number."""
    low = _ephemeral_low()
    if low > 11000:
        for _ in range(50):
            port = random.randrange(10000, low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 5.0, token: str | None = None, context=None):
    return json.loads(get_body(url, timeout, token, context))


def get_body(url: str, timeout: float = 5.0, token: str | None = None,
             context=None) -> bytes:
    """GET a document (with a Bearer token, over https with an ``ssl`` context); raises
    OSError (or HTTPError) when there is none.

    Not urllib.request.urlopen: when the server is slow to answer (a loaded machine), it
    leaves the timed-out socket to the garbage collector, and pytest fails the test running
    at that moment on the ResourceWarning.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout,
                                           context=context)
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""),
                     headers=headers)
        # Closed here too: Werkzeug answers "Connection: close", so conn.close() leaves the
        # response's socket open when reading its body timed out.
        with conn.getresponse() as resp:
            body = resp.read()
        if resp.status >= 400:
            raise urllib.error.HTTPError(url, resp.status, resp.reason, resp.headers,
                                         io.BytesIO(body))
        return body
    finally:
        conn.close()


def metric(server, name: str) -> float | None:
    """The value of the unlabelled sample ``name`` on the server's /metrics, or None."""
    text = get_body(server.url + "/metrics", timeout=10,
                    context=getattr(server, "ssl_context", None)).decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (OSError, urllib.error.URLError, KeyError, ValueError) as exc:
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last error: {last_exc}")


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


class _PortTaken(Exception):
    """The free port found for a server was taken by another process before it listened."""


class ServerProcess:
    """``pgdash serve`` in a subprocess; stopped by PID."""

    def __init__(self, db_url: str, port: int | None = None, extra: list[str] | None = None,
                 log_path: Path | None = None, env: dict[str, str] | None = None,
                 root: Path = ROOT):
        self.db_url = db_url
        self.root = root  # the checkout whose server runs (benches compare another one)
        self.port_given = port is not None
        self.port = port or free_port()
        self.extra = extra or []
        self.env = env  # PGDASH_* server settings for this server only
        # A server started with --token / --tls-cert is asked with that token, over https
        # trusting that certificate.
        flag = dict(zip(self.extra, self.extra[1:]))
        self.token = flag.get("--token")
        self.ssl_context = None
        if "--tls-cert" in flag:
            import ssl

            self.ssl_context = ssl.create_default_context(cafile=flag["--tls-cert"])
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> "ServerProcess":
        # The port free_port() found can be taken before the server binds it (another
        # worker's server, a gloo job's connection): CI failed two tests so, beside a CPU
        # hog. A port found here is then found again; one the caller gave is its to keep.
        for _ in range(5):
            with open(self.log_path or os.devnull, "ab") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "dashboard", "serve", "--port", str(self.port),
                     "--db", self.db_url, *self.extra],
                    stdout=log, stderr=subprocess.STDOUT, cwd=self.root,
                    env={**os.environ, **self.env} if self.env else None)
            try:
                # 60 s: a loaded machine (the suite's two workers, Chromium, a CPU hog) once
                # took more than 30 s to bring a server up.
                wait_for(self._answers, 60, f"pgdash server on {self.url}")
                return self
            except _PortTaken:
                self.port = free_port()
        raise AssertionError("pgdash serve found its port taken five times")

    def _answers(self) -> bool:
        if self.proc.poll() is not None:  # it died: say why now, not after the timeout
            if not self.port_given and port_taken(self.port):
                raise _PortTaken(self.port)
            log = self.log_path.read_text(errors="replace")[-2000:] if self.log_path else ""
            raise AssertionError(f"pgdash serve exited with {self.proc.returncode}: {log}")
        return self.api("/api/jobs") is not None

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def api(self, path: str):
        return get_json(self.url + path, token=self.token, context=self.ssl_context)


def launch_job(script: str, ranks: int, server_url: str, job: str, tmp_path: Path,
               env: dict[str, str] | None = None, args: list[str] | None = None,
               only: list[int] | None = None, rank_env: dict[int, dict[str, str]] | None = None):
    """Start a real gloo job: one process per rank, torchrun-style environment.

    ``only`` starts just those ranks (the others never arrive); ``rank_env`` adds variables
    to single ranks; a variable given None is left out (``LOCAL_RANK``: as ``mp.spawn``).
    """
    master_port = str(free_port())
    procs = []
    for rank in (range(ranks) if only is None else only):
        penv = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks),
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=master_port,
                    PGDASH_SERVER=server_url, PGDASH_JOB=job, OMP_NUM_THREADS="1",
                    PYTHONPATH=str(ROOT))
        # update(), so that env or rank_env may override the variables above too.
        penv.update({"PGDASH_FLUSH_TIMEOUT_S": "30", **(env or {}),
                     **(rank_env or {}).get(rank, {})})
        penv = {k: v for k, v in penv.items() if v is not None}
        with open(tmp_path / f"{job}-rank{rank}.log", "wb") as out:
            procs.append(subprocess.Popen([sys.executable, str(JOBS / script), *(args or [])],
                                          env=penv, stdout=out, stderr=subprocess.STDOUT,
                                          cwd=ROOT))
    return procs


def wait_job(procs, timeout: float, tmp_path: Path | None = None) -> list[int]:
    """Wait for every rank; kill all of them on timeout. Returns exit codes."""
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        logs = ""
        if tmp_path:
            logs = "\n".join(f.read_text(errors="replace")[-2000:]
                             for f in sorted(tmp_path.glob("*rank*.log")))
        raise AssertionError(f"job did not finish within {timeout}s\n{logs}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def job_by_name(server: ServerProcess, name: str):
    return next((j for j in server.api("/api/jobs")["jobs"] if j["name"] == name), None)


def stored_events(db_url: str, job_ids: list[int] | None = None) -> list[dict]:
    """Every stored event of these jobs (of all jobs when None) as pgdash reads its log: the
    ``events`` table and the packs the compactor moves a job's older events into. A raw
    SELECT on ``events`` misses those once a job outlasts PGDASH_PACK_AFTER_S."""
    from dashboard.storage.store import Store

    store = Store(db_url)  # not started: reads only, beside the server that writes
    try:
        if job_ids is None:
            job_ids = [job["id"] for job in store.jobs.newest(limit=1_000_000)]
        return [ev for job_id in job_ids for ev in store.log.events(job_id)]
    finally:
        store.engine.dispose()
