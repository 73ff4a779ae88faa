"""``pgdash demo``: a server plus a real multi-process gloo job with the agent attached."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import click


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_ranks(ranks: int, server_url: str, job: str, args: list[str],
                 extra_env: dict[str, str] | None = None) -> list[subprocess.Popen]:
    """Start ``ranks`` processes of ``dashboard.demo_train`` the way torchrun would."""
    master_port = str(free_port())
    procs = []
    for rank in range(ranks):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks),
                   LOCAL_WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=master_port, PGDASH_SERVER=server_url, PGDASH_JOB=job,
                   OMP_NUM_THREADS="1", **(extra_env or {}))
        procs.append(subprocess.Popen([sys.executable, "-m", "dashboard.demo_train", *args],
                                      env=env))
    return procs


def _interrupt(signum, frame):
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


def run_demo(ranks: int, port: int, scenario: str, steps: int, db: str) -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise click.ClickException(
            "pgdash demo runs a real PyTorch job and needs torch on this machine: "
            "pip install torch") from None
    from dashboard.cli import make_server

    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the demo as Ctrl-C does
    server = make_server(db, "127.0.0.1", port).start()
    job = f"demo-{scenario}-{time.strftime('%Y%m%d-%H%M%S')}"
    click.echo(f"pgdash demo: {ranks} ranks, scenario {scenario!r}, job {job}")
    click.echo(f"pgdash demo: open {server.url}/  (Ctrl-C stops)")
    procs = launch_ranks(ranks, server.url, job, ["--scenario", scenario, "--steps", str(steps)])
    shown = False
    try:
        while True:
            if not shown:
                jobs = server.app.extensions["pgdash"].store.list_jobs(limit=5)
                match = next((j for j in jobs if j["name"] == job), None)
                if match:
                    click.echo(f"pgdash demo: live job page: {server.url}/jobs/{match['id']}")
                    shown = True
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                failed = [i for i, c in enumerate(codes) if c != 0]
                click.echo("pgdash demo: training ended" +
                           (f"; ranks {failed} failed" if failed else " cleanly"))
                if steps:
                    time.sleep(1.5)  # let the last updates reach the page
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
