"""The ``pgdash`` command line: serve, demo, export, import, replay, db upgrade."""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import sys
import threading
from typing import Any

import click

from dashboard.config import DEFAULT_DB, DEFAULT_HOST, DEFAULT_PORT, DEFAULTS
from dashboard.demo.run import DEMO_HANG_AFTER, SCENARIOS
from dashboard.server import Server, ServerError, make_server


class BadInput(click.ClickException):
    """What a command was given cannot work: a database URL, a file, a setting. One line
    ("Error: ..."), exit status 2 as click's own usage errors, never a traceback."""

    exit_code = 2


def _db_option(f):
    return click.option(
        "--db", "db", default=lambda: os.environ.get("PGDASH_DB") or DEFAULT_DB,
        show_default="PGDASH_DB, else sqlite:///pgdash.db in the working directory",
        help="SQLAlchemy database URL.")(f)


@click.group()
@click.version_option(package_name="pgdash")
def cli() -> None:
    """pgdash: live diagnosis of PyTorch distributed training jobs."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.setLevel(logging.WARNING)
    werkzeug.addFilter(_quiet_websocket_close)


def _quiet_websocket_close(record: logging.LogRecord) -> bool:
    """Werkzeug logs the bytes left on a closed websocket as a '400 Bad request'; harmless."""
    return "code 400, message Bad" not in record.getMessage()


@cli.command()
@click.option("--host", default=DEFAULT_HOST, show_default=True,
              help="Address to bind. Only loopback is safe without --token.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on; 0 picks a free one.")
@_db_option
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
    _tune_gc()
    # A service manager stops with SIGTERM: stop as on Ctrl-C, so that with --queue this
    # process hands its jobs over at once instead of after its leases run out.
    signal.signal(signal.SIGTERM, _interrupt)
    shared = f", queue {_shown(queue)}" if queue else ""
    click.echo(f"pgdash: serving on {server.url}/  (database {_shown(db)}{shared}; "
               "Ctrl-C stops)")
    if notify:
        click.echo(f"pgdash: incidents are posted to {notify}")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        click.echo("pgdash: stopping")
    finally:
        server.stop()


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


@cli.command()
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
@_db_option
def demo(ranks: int, port: int, scenario: str, hang_after: float, steps: int, db: str) -> None:
    """Start a server and a real CPU training job with the agent attached."""
    from dashboard.demo.run import run_demo

    try:
        code = run_demo(ranks=ranks, port=port, scenario=scenario, steps=steps, db=db,
                        hang_after=hang_after)
    except ServerError as exc:
        raise BadInput(str(exc)) from None
    sys.exit(code)


def _shown(db: str) -> str:
    """The --db URL as it may be printed (its password hidden)."""
    from dashboard.storage.database import display_url

    return display_url(db)


def _open_store(db: str):
    from dashboard.storage.store import Store

    try:
        return Store(db).start()
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def _read_archive(path: str):
    from dashboard.history.archive import Archive, ArchiveError

    try:
        with open(path, encoding="utf-8") as f:
            return Archive.read(f, source=path)
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}; pass a session file "
                       "made by `pgdash export JOB -o FILE`") from None
    except UnicodeDecodeError:
        raise BadInput(f"{path} is not a text file: expected a pgdash session "
                       "file (made by `pgdash export`)") from None
    except ArchiveError as exc:
        raise BadInput(str(exc)) from None


@cli.command("export")
@click.argument("job_id", type=click.IntRange(1))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, writable=True),
              help="The file to write: the session (JSON Lines), or with --trace its "
              "timeline (JSON); - writes to standard output.")
@click.option("--trace", "as_trace", is_flag=True,
              help="Write a Chrome-trace / Perfetto JSON timeline instead (open it in "
              "ui.perfetto.dev or chrome://tracing).")
@click.option("--start", type=float, default=None,
              help="With --trace: keep what happened from this time on (Unix seconds).")
@click.option("--end", type=float, default=None,
              help="With --trace: keep what happened up to this time (Unix seconds).")
@click.option("--max-events", type=click.IntRange(1), default=None,
              help="With --trace: the most events in the file (process and thread names "
              "come on top); past it, the cheapest kinds are thinned evenly.  "
              "[default: PGDASH_TRACE_MAX_EVENTS, else 1000000]")
@_db_option
def export_cmd(job_id: int, output: str, as_trace: bool, start: float | None,
               end: float | None, max_events: int | None, db: str) -> None:
    """Write a stored job (its whole event log) to one portable file, or its timeline
    (--trace)."""
    from dashboard.history.archive import export_lines

    if not as_trace and (start is not None or end is not None or max_events is not None):
        raise click.UsageError("--start, --end and --max-events go with --trace")
    if as_trace:
        _export_trace(job_id, output, start, end, max_events, db)
        return
    store = _open_store(db)
    try:
        lines = export_lines(store, job_id)
        if lines is None:
            raise BadInput(f"no job with id {job_id} in {_shown(db)}; the jobs list at / "
                           "or GET /api/jobs shows their ids")
        count = 0
        with click.open_file(output, "w", encoding="utf-8", atomic=output != "-") as out:
            for line in lines:
                out.write(line)
                count += 1
    finally:
        store.close()
    if output != "-":
        click.echo(f"pgdash: wrote job {job_id} to {output} ({count} lines)")


def _export_trace(job_id: int, output: str, start: float | None, end: float | None,
                  max_events: int | None, db: str) -> None:
    """``pgdash export --trace``: the stored events and findings as a trace file."""
    from dashboard.history.trace import DEFAULT_MAX_EVENTS, TraceError, build_trace, json_chunks

    if max_events is None:
        raw = os.environ.get("PGDASH_TRACE_MAX_EVENTS") or str(DEFAULT_MAX_EVENTS)
        if not raw.isdigit() or int(raw) < 1:
            raise BadInput(f"PGDASH_TRACE_MAX_EVENTS must be a positive integer, "
                           f"got {raw!r:.40}; or pass --max-events")
        max_events = int(raw)
    store = _open_store(db)
    try:
        job = store.jobs.get(job_id)
        if job is None:
            raise BadInput(f"no job with id {job_id} in {_shown(db)}; the jobs list at / "
                           "or GET /api/jobs shows their ids")
        from dashboard.diagnosis.incidents import incidents

        findings = store.findings.of_job(job_id)
        try:
            trace = build_trace(store.log.events(job_id), findings=findings, job=job,
                                start=start, end=end, max_events=max_events,
                                incidents=incidents(findings))
        except TraceError as exc:
            raise click.UsageError(str(exc)) from None
        with click.open_file(output, "w", encoding="utf-8", atomic=output != "-") as out:
            for chunk in json_chunks(trace):
                out.write(chunk)
    finally:
        store.close()
    if output != "-":
        meta = trace["metadata"]
        dropped = sum(c["dropped"] for c in meta["cut"].values())
        cut = f", {dropped} dropped to stay within --max-events {max_events}" if dropped else ""
        click.echo(f"pgdash: wrote the trace of job {job_id} to {output} ({meta['events']} "
                   f"events{cut}); open it in https://ui.perfetto.dev or chrome://tracing")


@cli.command("import")
@click.argument("path", type=click.Path(dir_okay=False))
@_db_option
def import_cmd(path: str, db: str) -> None:
    """Store a session file (from `pgdash export`) as a new job."""
    import time

    from dashboard.history.archive import import_archive

    archive = _read_archive(path)
    store = _open_store(db)
    try:
        job_id = import_archive(store, archive, time.time(), source=path)
    finally:
        store.close()
    click.echo(f"pgdash: imported {path} as job {job_id} ({archive.job['name']}, "
               f"{len(archive.events)} events); `pgdash serve --db {_shown(db)}` shows it at "
               f"/jobs/{job_id}")


@cli.command("replay")
@click.argument("job")
@click.option("--step", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
              help="Seconds between diagnoses of the replayed log (the live server judges "
              "every 1 s: another step gives other first/last-seen times).")
@click.option("--hang-after", type=click.FloatRange(min=0, min_open=True),
              default=DEFAULTS["HANG_AFTER"],
              show_default=True, help="Seconds a collective may wait before it counts as hung "
              "(as the live server's --hang-after).")
@_db_option
def replay_cmd(job: str, step: float, hang_after: float, db: str) -> None:
    """Replay a stored job (an id) or a session file: the findings as they came and went."""
    from dashboard.history.archive import Archive, export_lines, replay
    from dashboard.diagnosis import Settings

    if job.isdigit() and not os.path.exists(job):
        store = _open_store(db)
        try:
            lines = export_lines(store, int(job))
            if lines is None:
                raise BadInput(f"no job with id {job} in {_shown(db)}; pass a job id or "
                               "a session file")
            archive = Archive.read(list(lines), source=f"job {job}")
        finally:
            store.close()
    else:
        archive = _read_archive(job)
    if not archive.events:
        click.echo(f"pgdash replay: {archive.job['name']} has no events")
        return
    start = archive.events[0]["received_at"]
    click.echo(f"pgdash replay: {archive.job['name']}, {len(archive.events)} events over "
               f"{archive.events[-1]['received_at'] - start:.1f} s (--hang-after {hang_after:g})")
    seen = 0
    for moment, change, f in replay(archive, Settings(hang_after=hang_after,
                                                      diagnose_every=step)):
        seen += 1
        word = {"new": f["severity"].upper(), "changed": "changed", "resolved": "resolved"}
        click.echo(f"+{moment - start:8.1f} s  {word[change]:<8} {f['kind']}: {f['summary']}")
        if change == "new":
            click.echo(f"{'':13}hint: {f['hint']}")
    state = archive.state()
    click.echo(f"pgdash replay: {seen} change(s); job {state.status} with "
               f"{len(state.ranks())} rank(s)")


@cli.group()
def db() -> None:
    """Database maintenance."""


@db.command("upgrade")
@_db_option
def db_upgrade(db: str) -> None:
    """Create or migrate the database schema to the latest version."""
    from dashboard.storage.database import upgrade

    try:
        upgrade(db)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    click.echo(f"pgdash: database {_shown(db)} is up to date")


def _tune_gc() -> None:
    """Fewer garbage collections for a server whose job states hold millions of objects.

    Ingest allocates (and frees) a few hundred objects per agent message; with CPython's
    default thresholds the collections this triggers, and the full ones that walk every
    job state, cost most of the CPU at 1,024 ranks (measured: bench/capacity.py). Reference
    counting frees almost everything anyway; the collector is only for cycles, which
    pgdash's data does not make in steady state.
    """
    import gc

    gc.collect()
    gc.freeze()  # what start-up built is never collected again
    gc.set_threshold(GC_THRESHOLD, 50, 1000)


GC_THRESHOLD = 50_000  # allocations between young collections (CPython's default: 700)


def _interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt


def main() -> None:
    cli(prog_name="pgdash")


if __name__ == "__main__":
    main()
