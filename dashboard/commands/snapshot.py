"""``pgdash snapshot JOB``: what a running job's ranks are doing, from the command line.

Asks the server (``POST /api/jobs/<id>/snapshots``) and prints the answers as they are when all
have come or ``--wait`` ran out: the training threads' stacks grouped across ranks, the groups
of fewest ranks (the odd ones out) first, then the ranks that did not answer. It talks to a
running ``pgdash serve`` (the agents' connections are there), not to the database.
"""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import click

from dashboard.commands.inputs import BadInput
from pgdash_agent.wire import DEFAULT_PORT

POLL_S = 0.25


@click.command("snapshot")
@click.argument("job")
@click.option("--ranks", default="all", show_default=True,
              help='"all", "blamed" (the ranks of the active incidents) or a list: 0,3,8-11.')
@click.option("--server", default=lambda: os.environ.get("PGDASH_SERVER")
              or f"http://127.0.0.1:{DEFAULT_PORT}",
              show_default="PGDASH_SERVER, else http://127.0.0.1:8686",
              help="The pgdash server the job's agents report to.")
@click.option("--token", default=lambda: os.environ.get("PGDASH_TOKEN"),
              show_default="PGDASH_TOKEN", help="The server's --token, if it has one.")
@click.option("--ca-file", default=lambda: os.environ.get("PGDASH_CA_FILE"),
              show_default="PGDASH_CA_FILE", help="CA to trust for an https server.")
@click.option("--wait", default=10.0, show_default=True, type=click.FloatRange(0.5, 600),
              help="Seconds to wait for the answers.")
@click.option("--native", is_flag=True,
              help="Native frames too, by py-spy where the ranks run (it pauses each rank "
                   "for a fraction of a second; see pgdash_agent/native.py).")
@click.option("--json", "as_json", is_flag=True, help="Print the server's answer as JSON.")
def snapshot_cmd(job: str, ranks: str, server: str, token: str | None, ca_file: str | None,
                 wait: float, native: bool, as_json: bool) -> None:
    """Ask JOB's ranks (a job id or name) what they are doing, and print their stacks."""
    api = _Api(server, token, ca_file)
    job_id = _job_id(api, job)
    status, made = api.call("POST", f"/api/jobs/{job_id}/snapshots",
                            {"ranks": _ranks(ranks), "native": native})
    if status != 202:
        raise BadInput(f"the server refused the snapshot: {made.get('error', made)}")
    deadline = time.monotonic() + wait
    detail = ""
    while True:
        status, view = api.call("GET", made["url"] + detail)
        if status != 200:
            raise BadInput(f"cannot read snapshot {made['id']}: {view.get('error', view)}")
        done = view["complete"] or time.monotonic() >= deadline
        if done and native and not detail:  # one rank of each group in whole: its native
            detail = "?detail=" + ",".join(str(g["ranks"][0]) for g in view["groups"])
            continue
        if done:
            break
        time.sleep(POLL_S)
    click.echo(json.dumps(view, indent=1) if as_json else render(job_id, view))


def render(job_id: int, view: dict[str, Any]) -> str:
    """A snapshot as text: its stacks grouped, the odd ones out first, then who is missing."""
    ranks = view["ranks"]
    answered = sum(1 for row in ranks.values() if row["status"] == "answered")
    lines = [f"snapshot {view['id']} of job {job_id}: {answered} of {len(ranks)} ranks "
             "answered"]
    for group in view["groups"]:
        where = group["where"]
        at = f" at {os.path.basename(where['file'])}:{where['line']} in {where['function']}" \
            if where else ""
        lines += ["", f"{_ranks_text(group['ranks'])}: {group['thread'] or 'no thread'}{at}"]
        if group["frames"]:
            lines.append(group["stack"].rstrip("\n"))
        lines += _native_lines(group["ranks"][0], ranks.get(str(group["ranks"][0]), {}))
    for rank, row in sorted(ranks.items(), key=lambda kv: int(kv[0])):
        if row["status"] in ("answered",):
            continue
        last = row.get("last_stack")
        lines.append(f"\nrank {rank}: {row['status']}"
                     + (f" (its last stack, from a collective it sat in:)\n{last['stack']}"
                        if last else ""))
    return "\n".join(lines)


def _native_lines(rank: int, row: dict[str, Any]) -> list[str]:
    """The native frames of the rank's training thread, when its whole answer is here."""
    if row.get("native_error"):
        return [f"(rank {rank}: no native frames: {row['native_error']})"]
    thread = next((t for t in row.get("threads") or [] if t.get("training")), None)
    if thread is None or not thread.get("native"):
        return []
    return [f"native frames of rank {rank}, innermost first:",
            *("  " + line for line in thread["native"].splitlines())]


def _ranks_text(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more"
                                               if len(ranks) > 8 else "")
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}"


def _ranks(text: str) -> Any:
    if text in ("all", "blamed"):
        return text
    out: list[int] = []
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            out += range(int(first), int(last or first) + 1)
    except ValueError:
        raise BadInput(f'--ranks takes "all", "blamed" or a list like 0,3,8-11; got '
                       f"{text!r:.60}") from None
    return out


def _job_id(api: "_Api", job: str) -> int:
    if job.isdigit():
        return int(job)
    status, listed = api.call("GET", "/api/jobs")
    named = [j for j in listed.get("jobs", []) if j.get("name") == job] if status == 200 else []
    if not named:
        raise BadInput(f"the server has no job named {job!r:.80}: pass its id or name as "
                       "`pgdash serve`'s page lists it")
    return max(j["id"] for j in named)  # the newest run of that name


class _Api:
    """JSON over HTTP(S) to the server, with its token; errors as BadInput."""

    def __init__(self, server: str, token: str | None, ca_file: str | None):
        if not server.startswith(("http://", "https://")):
            raise BadInput(f"--server must start with http:// or https://, got {server!r:.80}")
        self.server = server.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.context = ssl.create_default_context(cafile=ca_file) \
            if server.startswith("https://") else None

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method,
                                     headers={**self.headers, "Content-Type":
                                              "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.context) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                return exc.code, json.loads(exc.read())
            except ValueError:
                return exc.code, {"error": f"HTTP {exc.code}"}
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise BadInput(f"cannot reach the pgdash server at {self.server} ({reason}): "
                           "start it with `pgdash serve`, or pass --server") from None
