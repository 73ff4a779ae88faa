"""``pgdash demo``: a server plus a real multi-process gloo job with the agent attached."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Iterator

import click


# Short, so that a demo's hang is named while one watches (a server's default is 60 s).
DEMO_HANG_AFTER = 10.0

SCENARIOS = {
    "healthy": "no fault",
    "checkpoint": "healthy; rank 0 checkpoints for 5 s once while the others wait (no finding)",
    "straggler": "the last rank's steps take 30% longer",
    "hang": "the last rank stops before its tensor-parallel all_reduce",
    "frozen": "the last rank blocks in C with the GIL held: its agent cannot answer, and "
              "another rank's agent reads it from outside (py-spy)",
    "crash": "rank 1 raises an exception",
    "kill": "rank 1 is killed (SIGKILL), like the OOM killer would",
    "desync": "the last rank calls broadcast where the others call all_reduce",
    "init-timeout": "the last rank is never started",
    "config-mismatch": "the last rank runs with a different NCCL_IB_DISABLE",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_ranks(ranks: int, server_url: str, job: str, args: list[str],
                 scenario: str = "healthy",
                 procs: list[subprocess.Popen] | None = None) -> list[subprocess.Popen]:
    """Start the processes of ``dashboard.demo.train`` the way torchrun would, into ``procs``
    as each starts (so that a Ctrl-C halfway leaves the caller those to stop).

    The launcher's part of a scenario happens here: ``init-timeout`` never starts the last
    rank, ``config-mismatch`` gives it a different setting.
    """
    master_port = str(free_port())
    last = ranks - 1
    procs = [] if procs is None else procs
    for rank in range(ranks):
        if scenario == "init-timeout" and rank == last:
            continue
        mismatch = {"NCCL_IB_DISABLE": "1"} if scenario == "config-mismatch" and rank == last \
            else {}
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks),
                   LOCAL_WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=master_port, PGDASH_SERVER=server_url, PGDASH_JOB=job,
                   OMP_NUM_THREADS="1", **mismatch)
        procs.append(subprocess.Popen([sys.executable, "-m", "dashboard.demo.train", *args],
                                      env=env))
    return procs


def _interrupt(signum, frame):
    raise KeyboardInterrupt


@contextlib.contextmanager
def _deferred_interrupts() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block ends: one that interrupted ``Popen`` after it
    started a rank, before it returned, left that rank running unknown to ``stop_ranks``
    (found orphaned after tests/integration/test_readme.py's demo run beside a CPU hog)."""
    came: list[int] = []
    before = {sig: signal.signal(sig, lambda signum, frame: came.append(signum))
              for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if came:
        raise KeyboardInterrupt


def stop_ranks(procs: list[subprocess.Popen], grace: float = 10.0) -> None:
    """SIGTERM (demo_train turns it into a clean stop), then SIGKILL after ``grace``."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def incident_line(inc: dict) -> str:
    """One incident as one line, as the job page leads with it: severity, class (and the
    kind of its root-cause finding), blamed ranks, summary, next step."""
    cls = inc["id"].split(":", 1)[0]
    kind = cls if cls == inc["kind"] else f"{cls} ({inc['kind']})"
    ranks = inc["ranks"]
    who = (" on " + ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
           if ranks else "")
    n = len(inc.get("findings") or ())
    return (f"{inc['severity'].upper()} {kind}{who}: {inc['summary']} "
            f"Next step: {inc['hint']} [{n} finding{'s' if n != 1 else ''}]")


def _tell_incidents(found: list[dict], told: dict[str, tuple]) -> None:
    """Print each incident that appeared, turned critical or resolved since last told
    (``told``: incident id -> (active, severity) when it was last printed; updated)."""
    for inc in reversed(found):  # oldest first
        now = (inc["active"], inc["severity"])
        was = told.get(inc["id"])
        if was == now or (was is None and not inc["active"]):
            continue
        told[inc["id"]] = now
        if not inc["active"]:
            click.echo(f"pgdash demo: resolved: {inc['summary']}")
        else:
            click.echo(f"pgdash demo: {incident_line(inc)}")


def run_demo(ranks: int, port: int, scenario: str, steps: int, db: str,
             hang_after: float = DEMO_HANG_AFTER) -> int:
    import importlib.util

    if importlib.util.find_spec("torch") is None:  # the ranks import it, not this process
        raise click.ClickException(
            "pgdash demo runs a real PyTorch job and needs torch on this machine: "
            "pip install torch")
    from dashboard.config import DEFAULT_HOST
    from dashboard.server import make_server

    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the demo as Ctrl-C does
    # A ServerError (the database, the port) goes up to the command line, which says it.
    server = make_server(db, DEFAULT_HOST, port, hang_after=hang_after).start()
    job = f"demo-{scenario}-{time.strftime('%Y%m%d-%H%M%S')}"
    ingest = server.services.ingest
    job_id = None
    told: dict[str, tuple] = {}
    procs: list[subprocess.Popen] = []
    # From here a Ctrl-C stops cleanly, also while the ranks start (it said "Aborted!" and
    # left the server and the ranks started so far running, when it came that early).
    try:
        click.echo(f"pgdash demo: {ranks} ranks, scenario {scenario!r} "
                   f"({SCENARIOS[scenario]}), job {job}")
        click.echo(f"pgdash demo: open {server.url}/  (Ctrl-C stops)")
        with _deferred_interrupts():
            launch_ranks(ranks, server.url, job,
                         ["--scenario", scenario, "--steps", str(steps)], scenario, procs)
        while True:
            if job_id is None:
                match = next((j for j in ingest.store.jobs.newest(limit=5) if j["name"] == job),
                             None)
                if match:
                    job_id = match["id"]
                    click.echo(f"pgdash demo: live job page: {server.url}/jobs/{job_id}")
            else:
                _tell_incidents(ingest.incidents(job_id) or [], told)
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                failed = [i for i, c in enumerate(codes) if c != 0]
                click.echo("pgdash demo: training ended" +
                           (f"; ranks {failed} failed" if failed else " cleanly"))
                if steps:
                    time.sleep(1.5)  # let the last updates reach the page
                    if job_id is not None:
                        _tell_incidents(ingest.incidents(job_id) or [], told)
                    return 1 if failed else 0
                click.echo("pgdash demo: the dashboard stays up; Ctrl-C stops it")
                while True:
                    time.sleep(3600)
            time.sleep(0.5)
    except KeyboardInterrupt:
        click.echo("pgdash demo: stopping")
        return 0
    finally:
        stop_ranks(procs)
        server.stop()
