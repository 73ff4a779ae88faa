"""The commands that run a server until Ctrl-C: ``pgdash serve`` and ``pgdash demo``.

Here live the checks ``serve`` makes before it listens (a token beyond loopback, TLS given
whole), how it starts and stops (SIGTERM as Ctrl-C), with the garbage collector on a timer
(dashboard.garbage); what the server is made of lives in dashboard/server.py.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import sys
import threading
from typing import Any

import click

from dashboard import allocator, garbage
from dashboard.commands.inputs import BadInput, db_option, shown
from dashboard.config import DEFAULT_HOST, DEFAULT_PORT, DEFAULTS
from dashboard.demo.run import DEMO_HANG_AFTER, SCENARIOS
from dashboard.server import Server, ServerError, make_server


@click.command()
@click.option("--host", default=DEFAULT_HOST, show_default=True,
              help="Address to bind. Only loopback is safe without --token.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on; 0 picks a free one.")
@db_option
@click.option("--token", default=lambda: os.environ.get("PGDASH_TOKEN"),
              help="Protects everything: agents (PGDASH_TOKEN on the training hosts), the "
              "API and /metrics (Authorization: Bearer), the pages (login form). "
              "Default: PGDASH_TOKEN.")
@click.option("--insecure", is_flag=True,
              help="Allow listening beyond loopback without --token (anyone who can reach "
              "the port can then read and send everything).")
@click.option("--tls-cert", type=click.Path(dir_okay=False),
              default=lambda: os.environ.get("PGDASH_TLS_CERT") or None,
              help="PEM certificate (chain): serve https/wss. Default: PGDASH_TLS_CERT.")
@click.option("--tls-key", type=click.Path(dir_okay=False),
              default=lambda: os.environ.get("PGDASH_TLS_KEY") or None,
              help="PEM private key of --tls-cert. Default: PGDASH_TLS_KEY.")
@click.option("--hang-after", type=click.FloatRange(min=0, min_open=True),
              default=DEFAULTS["HANG_AFTER"], show_default=True,
              help="Seconds a collective may wait before it counts as hung.")
@click.option("--queue", envvar="PGDASH_QUEUE", show_envvar=True, default=None,
              help="Redis URL (redis://host:6379/0) shared by several `pgdash serve` processes "
              "on one PostgreSQL --db; see docs/cluster.md. Unset: one process alone.")
@click.option("--lease", envvar="PGDASH_LEASE_S", show_envvar=True,
              type=click.FloatRange(min=1.0), default=DEFAULTS["LEASE_S"], show_default=True,
              help="With --queue: seconds a job's owner process holds it without renewing; "
              "another process takes a dead owner's jobs over within about 4/3 of this.")
@click.option("--stall-after", type=click.FloatRange(min=0, min_open=True),
              default=DEFAULTS["STALL_AFTER"], envvar="PGDASH_STALL_AFTER", show_envvar=True, show_default=True,
              help="Least seconds a collective waits for a missing peer before a stall warning "
                   "(more when the group's own collectives are slow).")
@click.option("--notify", envvar="PGDASH_NOTIFY", show_envvar=True, metavar="URL",
              help="POST each new, escalated and resolved incident as JSON to this webhook "
                   "(Slack-compatible `text`).")
@click.option("--keep-full", type=click.FloatRange(min=0), default=None,
              envvar="PGDASH_KEEP_FULL_S", show_envvar=True,
              help="Seconds of each job's newest events kept at full resolution; older routine "
                   "events are thinned to one summary a minute (0: keep everything). "
                   "Default 900.")
@click.option("--keep-around-findings", type=click.FloatRange(min=0), default=None,
              envvar="PGDASH_KEEP_AROUND_FINDINGS_S", show_envvar=True,
              help="Seconds before and after every finding kept at full resolution. "
                   "Default 300.")
def serve(host: str, port: int, db: str, token: str | None, insecure: bool,
          tls_cert: str | None, tls_key: str | None, hang_after: float, queue: str | None,
          lease: float, stall_after: float, notify: str | None, keep_full: float | None,
          keep_around_findings: float | None) -> None:
    """Run the server: agents report to it, browsers watch it."""
    if not token and not _is_loopback(host):
        if not insecure:
            click.echo(f"pgdash: refusing to listen on {host} without a token: anyone who "
                       "can reach this port could read every job and send data. Pass --token "
                       "(or set PGDASH_TOKEN; agents use the same PGDASH_TOKEN), or --insecure "
                       "if this network is trusted.", err=True)
            sys.exit(2)
        click.echo(f"pgdash: warning: listening on {host} without --token (--insecure): "
                   "anyone who can reach this port can read and send data", err=True)
    if token and len(token) < 16:
        click.echo("pgdash: warning: the token is shorter than 16 characters; a long random "
                   "one (python -c 'import secrets; print(secrets.token_urlsafe())') cannot "
                   "be guessed", err=True)
    if bool(tls_cert) != bool(tls_key):
        click.echo("pgdash: --tls-cert and --tls-key go together (PGDASH_TLS_CERT, "
                   "PGDASH_TLS_KEY): give both to serve https, or neither.", err=True)
        sys.exit(2)
    server = _start(db, host, port, token=token, hang_after=hang_after, queue=queue,
                    lease_s=lease, notify=notify, stall_after=stall_after,
                    keep_full_s=keep_full, keep_around_findings_s=keep_around_findings,
                    tls=(tls_cert, tls_key) if tls_cert else None, log_incidents=True)
    garbage.tune()
    allocator.fix_mmap_threshold()  # big transient buffers are given back when freed
    # A service manager stops with SIGTERM: stop as on Ctrl-C, so that with --queue this
    # process hands its jobs over at once instead of after its leases run out.
    signal.signal(signal.SIGTERM, _interrupt)
    shared = f", queue {shown(queue)}" if queue else ""
    click.echo(f"pgdash: serving on {server.url}/  (database {shown(db)}{shared}; "
               "Ctrl-C stops)")
    if notify:
        click.echo(f"pgdash: incidents are posted to {notify}")
    try:
        garbage.collect_every(threading.Event())  # until Ctrl-C or SIGTERM
    except KeyboardInterrupt:
        click.echo("pgdash: stopping")
    finally:
        server.stop()
    _leave()


def _leave() -> None:
    """Exit at once, the server stopped: everything is stored and released by then. The
    interpreter's own teardown (freeing a big server's objects one by one, joining idle pool
    threads) took seconds more at 1,024 ranks, past what a service manager waits."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _start(db: str, host: str, port: int, **settings: Any) -> Server:
    """A started server, or a clear error on the command line."""
    try:
        return make_server(db, host, port, **settings).start()
    except ServerError as exc:
        raise BadInput(str(exc)) from None


def _is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one (unresolvable: no)."""
    import socket

    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback
                               for info in infos)


@click.command()
@click.option("--ranks", default=4, show_default=True, type=click.IntRange(1, 64),
              help="Number of training processes (gloo on CPU).")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535),
              help="Port of the dashboard; 0 picks a free one.")
@click.option("--scenario", default="healthy", show_default=True,
              type=click.Choice(list(SCENARIOS)),
              help="The fault to inject, about 5 s into training.")
@click.option("--hang-after", type=click.FloatRange(min=0, min_open=True),
              default=DEMO_HANG_AFTER,
              show_default=True, help="Seconds a collective may wait before it counts as hung.")
@click.option("--steps", default=0, show_default=True, type=click.IntRange(0),
              help="Training steps per rank; 0 runs until Ctrl-C.")
@db_option
def demo(ranks: int, port: int, scenario: str, hang_after: float, steps: int, db: str) -> None:
    """Start a server and a real CPU training job with the agent attached."""
    from dashboard.demo.run import run_demo

    try:
        code = run_demo(ranks=ranks, port=port, scenario=scenario, steps=steps, db=db,
                        hang_after=hang_after)
    except ServerError as exc:
        raise BadInput(str(exc)) from None
    sys.exit(code)


def _interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt
