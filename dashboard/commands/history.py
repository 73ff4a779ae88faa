"""The commands over stored jobs and session files: ``pgdash export`` (a session file, or with
``--trace`` a Perfetto timeline), ``pgdash import`` and ``pgdash replay``.

They are the command line's side of dashboard/history/ (archive, replay, trace): each opens
the store or reads a file, calls down, and says on the console what it wrote or found.
"""

from __future__ import annotations

import os

import click

from dashboard.commands.inputs import BadInput, db_option, open_store, read_archive, shown
from dashboard.config import DEFAULTS


@click.command("export")
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
@db_option
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
    store = open_store(db)
    try:
        lines = export_lines(store, job_id)
        if lines is None:
            raise BadInput(f"no job with id {job_id} in {shown(db)}; the jobs list at / "
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
    store = open_store(db)
    try:
        job = store.jobs.get(job_id)
        if job is None:
            raise BadInput(f"no job with id {job_id} in {shown(db)}; the jobs list at / "
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


@click.command("import")
@click.argument("path", type=click.Path(dir_okay=False))
@db_option
def import_cmd(path: str, db: str) -> None:
    """Store a session file (from `pgdash export`) as a new job."""
    import time

    from dashboard.history.archive import import_archive

    archive = read_archive(path)
    store = open_store(db)
    try:
        job_id = import_archive(store, archive, time.time(), source=path)
    finally:
        store.close()
    click.echo(f"pgdash: imported {path} as job {job_id} ({archive.job['name']}, "
               f"{len(archive.events)} events); `pgdash serve --db {shown(db)}` shows it at "
               f"/jobs/{job_id}")


@click.command("replay")
@click.argument("job")
@click.option("--step", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
              help="Seconds between diagnoses of the replayed log (the live server judges "
              "every 1 s: another step gives other first/last-seen times).")
@click.option("--hang-after", type=click.FloatRange(min=0, min_open=True),
              default=DEFAULTS["HANG_AFTER"],
              show_default=True, help="Seconds a collective may wait before it counts as hung "
              "(as the live server's --hang-after).")
@db_option
def replay_cmd(job: str, step: float, hang_after: float, db: str) -> None:
    """Replay a stored job (an id) or a session file: the findings as they came and went."""
    from dashboard.history.archive import Archive, export_lines, replay
    from dashboard.diagnosis import Settings

    if job.isdigit() and not os.path.exists(job):
        store = open_store(db)
        try:
            lines = export_lines(store, int(job))
            if lines is None:
                raise BadInput(f"no job with id {job} in {shown(db)}; pass a job id or "
                               "a session file")
            archive = Archive.read(list(lines), source=f"job {job}")
        finally:
            store.close()
    else:
        archive = read_archive(job)
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
