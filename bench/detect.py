"""How long does pgdash take to name the rank at fault, and does it name the right one?

Each scenario injects one fault into a real gloo job (``tests/jobs/fault_job.py``; one process
per rank, torchrun-style environment, the agent attached) reporting to a real ``pgdash serve``
started here with ``--hang-after 3`` on 127.0.0.1 and a fresh SQLite database. The bench polls
``GET /api/jobs/<id>/findings`` every ``--poll`` seconds (0.1) and records, for every finding,
the wall-clock time of the first response that contained it.

Measured per run (all clocks are this machine's ``time.time()``):

* **detection** = first response containing the finding - the fault time the job prints
  (``FAULT <unix time> ...`` on the rank that injects the fault, just before injecting it);
* **server** = the finding's own ``first_seen`` - the fault time (what the server believed);
* **blame**: the finding's ranks are exactly the expected ones, and no other warning or
  critical finding of the job (active or not, a few seconds after detection) blames any other
  rank.

Goals (from the issue), checked per run:

    scenario   finding          blamed                                         limit
    hang       hang             the last rank (sleeps instead of all_reduce)   hang-after + 5 s
    chain      hang             the last rank (its partner waits in group B)   hang-after + 5 s
    desync     desync           the last rank (broadcast, not all_reduce)      2 s
    straggler  straggler        the last rank (steps 20% slower)               30 steps
    kill       rank_lost        rank 1 (SIGKILL)                               5 s after death
    crash      rank_failed      rank 1 (raises)                                none (shown)
    init       init_incomplete  rank 2 of 3 (never started)                    5 s after arrival
    healthy    (none)           4-rank DDP + 2x2 mesh training, minutes long   0 warnings/criticals

Straggler steps: fault_job's straggler steps take ~60 ms (the slow rank sleeps 60 ms, the
others wait for it), so steps = seconds / 0.06. The job first runs ``--straggler-warmup``
healthy steps (so the rule has history, as in a real job that slows down mid-run), then slows
the last rank for up to ``--straggler-steps`` steps.

``init``: a 3-rank ``healthy`` job is launched with only ranks 0 and 1, so there is no FAULT line.
The reference time is the latest ``init_start`` event time (the arrival of the last rank that
did arrive, stamped by its agent) read from the server's event log (the SQLite database this
bench created, opened read-only); the public API does not expose it. The launch time of the
ranks is shown too.

``healthy``: ``tests/jobs/train_job.py --steps N --step-time 0.05`` on 4 ranks, with
N = ``--healthy-seconds`` (default 180) / 0.05: a step sleeps 0.05 s, so the job lasts at least
that long (longer by its compute; ``--healthy-steps`` overrides N). Every finding the server
ever showed for the job (the findings list keeps inactive ones) is checked after the job
finished; the goal is zero warnings and zero criticals. The actual duration is reported.

This is a measurement, not a test: the exit status is 0 whatever the figures, 1 only if the
benchmark itself broke (the server did not start, a job never reached its fault, ...).
Every process started here is stopped by PID. Run it from the repository root::

    python bench/detect.py                         # every scenario once, healthy for 3 min
    python bench/detect.py --only hang desync --repeat 5
    python bench/detect.py --healthy-seconds 120 --json /tmp/detect.json --keep /tmp/detect
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import ServerProcess, launch_job  # noqa: E402

STRAGGLER_STEP_S = 0.06  # one straggler step of fault_job (the slow rank's sleep)
HEALTHY_STEP_S = 0.05  # train_job --step-time: the sleep per step, a lower bound of a step
FAULT_RE = re.compile(r"^FAULT (\d+(?:\.\d+)?) (.*)$", re.MULTILINE)
LOUD = ("warning", "critical")


@dataclass
class Scenario:
    name: str
    kind: str | None  # the finding that must appear (None: healthy, none may)
    blamed: list[int] | None  # expected ranks of that finding
    goal: str  # how the limit reads in the table
    limit_s: float | None  # detection limit in seconds (None: no latency goal)
    world: int = 3
    args: list[str] = field(default_factory=list)
    only: list[int] | None = None
    timeout_s: float = 30.0  # after the fault (or launch) for the finding to appear


def scenarios(a: argparse.Namespace) -> dict[str, Scenario]:
    w, last = a.world, a.world - 1
    return {
        "hang": Scenario("hang", "hang", [last], f"hang: <= hang-after+5 = {a.hang_after + 5:g} s",
                         a.hang_after + 5, w, ["hang"], timeout_s=a.hang_after + 30),
        "chain": Scenario("chain", "hang", [last],
                          f"hang (chain): <= hang-after+5 = {a.hang_after + 5:g} s",
                          a.hang_after + 5, w, ["chain"], timeout_s=a.hang_after + 30),
        "desync": Scenario("desync", "desync", [last], "desync: <= 2 s", 2.0, w, ["desync"]),
        "straggler": Scenario(
            "straggler", "straggler", [last], "straggler: <= 30 steps (1.8 s)",
            30 * STRAGGLER_STEP_S, w,
            ["straggler", str(a.straggler_warmup), str(a.straggler_steps)],
            timeout_s=a.straggler_steps * STRAGGLER_STEP_S + 10),
        "kill": Scenario("kill", "rank_lost", [1], "rank_lost: <= 5 s after death", 5.0, w,
                         ["kill"]),
        "crash": Scenario("crash", "rank_failed", [1], "rank_failed: no latency goal", None, w,
                          ["crash"]),
        "init": Scenario("init", "init_incomplete", [2], "init_incomplete: <= 5 s after arrival",
                         5.0, 3, ["healthy"], only=[0, 1]),
        "healthy": Scenario("healthy", None, None, "healthy 4 ranks: 0 warnings/criticals",
                            None, 4),
    }


@dataclass
class Run:
    scenario: str
    rep: int
    job: str
    goal: str
    status: str = "ERROR"  # PASS, FAIL or ERROR (the benchmark broke)
    kind: str | None = None
    expected: list[int] | None = None
    ranks: list[int] | None = None
    group: str | None = None
    fault_t: float | None = None
    fault_ref: str = ""
    observed_t: float | None = None
    first_seen: float | None = None
    detect_s: float | None = None
    server_s: float | None = None
    steps: float | None = None
    limit_s: float | None = None
    blame_ok: bool | None = None
    others: list[dict[str, Any]] = field(default_factory=list)
    summary: str = ""
    notes: list[str] = field(default_factory=list)
    polls: int = 0
    max_poll_s: float = 0.0
    exit_codes: list[int | None] = field(default_factory=list)


# -- HTTP -------------------------------------------------------------------------------------

def get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


class Poller:
    """Polls one job's findings; remembers when each finding id was first returned."""

    def __init__(self, base: str, job: str):
        self.base, self.job = base, job
        self.job_id: int | None = None
        self.seen: dict[str, float] = {}  # finding id -> wall time of the first response
        self.latest: list[dict[str, Any]] = []
        self.polls = 0
        self.max_poll_s = 0.0
        self.errors = 0

    def poll(self) -> list[dict[str, Any]]:
        t0 = time.time()
        try:
            if self.job_id is None:
                job = next((j for j in get_json(self.base + "/api/jobs")["jobs"]
                            if j["name"] == self.job), None)
                if job is None:
                    return self.latest
                self.job_id = job["id"]
            found = get_json(f"{self.base}/api/jobs/{self.job_id}/findings")["findings"]
        except (OSError, urllib.error.URLError, ValueError, KeyError):
            self.errors += 1
            return self.latest
        t1 = time.time()
        self.polls += 1
        self.max_poll_s = max(self.max_poll_s, t1 - t0)
        for f in found:
            self.seen.setdefault(f["id"], t1)  # conservative: when the answer arrived
        self.latest = found
        return found

    def job_detail(self) -> dict[str, Any] | None:
        if self.job_id is None:
            return None
        return get_json(f"{self.base}/api/jobs/{self.job_id}")


# -- processes and logs -----------------------------------------------------------------------

def stop_all(procs: list[subprocess.Popen]) -> list[int | None]:
    """Kill every still-running rank by PID; return the exit codes."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=10))
        except subprocess.TimeoutExpired:
            codes.append(None)
    return codes


def fault_time(logdir: Path, job: str) -> tuple[float, int, str] | None:
    """(time, rank, message) of the first FAULT line in the job's rank logs."""
    hits = []
    for log in sorted(logdir.glob(f"{job}-rank*.log")):
        m = FAULT_RE.search(log.read_text(errors="replace"))
        if m:
            rank = int(log.stem.rsplit("rank", 1)[1])
            hits.append((float(m.group(1)), rank, m.group(2)))
    return min(hits) if hits else None


def init_arrivals(db: Path, job_id: int) -> dict[int, float]:
    """rank -> init_start event time, from the server's event log (read-only)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        rows = con.execute(
            "SELECT s.rank, e.t FROM events e JOIN sessions s ON s.id = e.session "
            "WHERE e.job_id = ? AND e.kind = 'init_start'", (job_id,)).fetchall()
    finally:
        con.close()
    return {rank: t for rank, t in rows}


def tail(logdir: Path, job: str, chars: int = 600) -> str:
    return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}"
                     for log in sorted(logdir.glob(f"{job}-rank*.log")))


def compact(f: dict[str, Any]) -> dict[str, Any]:
    return {k: f.get(k) for k in ("kind", "severity", "ranks", "group", "active", "first_seen",
                                  "summary")}


# -- one fault run ----------------------------------------------------------------------------

def run_fault(sc: Scenario, rep: int, server: ServerProcess, db: Path, logdir: Path,
              a: argparse.Namespace) -> Run:
    job = f"{sc.name}-{rep}"
    run = Run(sc.name, rep, job, sc.goal, kind=sc.kind, expected=sc.blamed, limit_s=sc.limit_s)
    poller = Poller(server.url, job)
    procs: list[subprocess.Popen] = []
    try:
        launched = time.time()
        procs = launch_job("fault_job.py", sc.world, server.url, job, logdir, args=sc.args,
                           only=sc.only)
        fault = None
        target = None
        start_deadline = time.monotonic() + a.start_timeout
        deadline = None
        while True:
            t_loop = time.monotonic()
            found = poller.poll()
            if fault is None and sc.only is None:
                fault = fault_time(logdir, job)
                if fault is not None:
                    deadline = time.monotonic() + sc.timeout_s
            if sc.only is not None and deadline is None:  # init: no FAULT line
                deadline = time.monotonic() + sc.timeout_s
            hit = [f for f in found if f["kind"] == sc.kind]
            if hit and target is None:
                target = min(hit, key=lambda f: (poller.seen[f["id"]], f["first_seen"]))
                if fault is None and sc.only is None:  # the log may lag a moment
                    fault = fault_time(logdir, job)
                break
            if deadline is None and time.monotonic() > start_deadline:
                run.notes.append(f"no FAULT line within {a.start_timeout:g} s of launch")
                run.notes.append(tail(logdir, job))
                return run  # ERROR: the benchmark broke
            if deadline is not None and time.monotonic() > deadline:
                break
            if sc.only is None and fault is None and all(p.poll() is not None for p in procs):
                run.notes.append("every rank exited before printing FAULT")
                run.notes.append(tail(logdir, job))
                return run
            time.sleep(max(0.0, a.poll - (time.monotonic() - t_loop)))

        # Found before the FAULT line: a false positive, or the log lags. Wait for the line.
        while sc.only is None and fault is None and time.monotonic() < start_deadline \
                and any(p.poll() is None for p in procs):
            poller.poll()
            time.sleep(a.poll)
            fault = fault_time(logdir, job)
        # Let the job settle (victims fail, the server re-diagnoses), then look at everything.
        if sc.name in ("crash", "kill"):  # the other ranks fail on their own: wait for them
            exit_deadline = time.monotonic() + a.exit_timeout
            while time.monotonic() < exit_deadline and any(p.poll() is None for p in procs):
                poller.poll()
                time.sleep(a.poll)
        settle_until = time.monotonic() + a.settle
        while time.monotonic() < settle_until:
            poller.poll()
            time.sleep(a.poll)
        final = poller.poll()

        if sc.only is not None:  # init: reference = latest init_start of the ranks that came
            arrivals = init_arrivals(db, poller.job_id) if poller.job_id is not None else {}
            if arrivals:
                fault = (max(arrivals.values()), max(arrivals, key=arrivals.get),
                         "latest init_start event (server's event log)")
                run.notes.append(
                    "arrivals: " + ", ".join(f"rank {r} +{t - launched:.2f} s after launch"
                                             for r, t in sorted(arrivals.items())))
                if target is not None:
                    run.notes.append(f"detection after launch: "
                                     f"{poller.seen[target['id']] - launched:.2f} s")
            else:
                run.notes.append("no init_start event found in the event log")
                return run
        if fault is None:
            run.notes.append("no FAULT line")
            return run
        run.fault_t, run.fault_ref = fault[0], f"rank {fault[1]}: {fault[2]}"

        if target is None:
            run.status = "FAIL"
            run.notes.append(f"no {sc.kind} finding within {sc.timeout_s:g} s "
                             f"(findings: {[compact(f) for f in final]})")
            run.others = [compact(f) for f in final if f["severity"] in LOUD]
            return run
        target = next((f for f in final if f["id"] == target["id"]), target)
        run.ranks, run.group, run.summary = target["ranks"], target["group"], target["summary"]
        run.observed_t = poller.seen[target["id"]]
        run.first_seen = target["first_seen"]
        run.detect_s = run.observed_t - run.fault_t
        run.server_s = run.first_seen - run.fault_t
        if sc.name == "straggler":
            run.steps = run.detect_s / STRAGGLER_STEP_S
        if sc.kind == "init_incomplete":
            ev = target.get("evidence") or {}
            run.notes.append(f"evidence: arrived={ev.get('arrived')} missing={ev.get('missing')} "
                             f"waiting_since=+{(ev.get('waiting_since') or 0) - launched:.2f} s")
            if ev.get("arrived") != [0, 1]:
                run.notes.append("evidence.arrived is not [0, 1]")
        # Everything loud the job ever showed, and who it blames.
        loud = [f for f in final if f["severity"] in LOUD]
        same_kind = [f for f in loud if f["kind"] == sc.kind]
        run.others = [compact(f) for f in loud if f["id"] != target["id"]]
        blamed_elsewhere = {r for f in loud for r in f["ranks"]} - set(sc.blamed)
        run.blame_ok = (target["ranks"] == sc.blamed
                        and all(f["ranks"] == sc.blamed for f in same_kind)
                        and not blamed_elsewhere)
        if blamed_elsewhere:
            run.notes.append(f"other findings also blame ranks {sorted(blamed_elsewhere)}")
        if sc.name == "chain":  # the world group's hang must say who rank n-2 waits for
            world_hang = next((f for f in final if f["kind"] == "hang" and f["group"] == "0"),
                              None)
            chain = ((world_hang or {}).get("evidence") or {}).get("chain") or []
            if not chain or chain[0].get("rank") != sc.world - 2 or \
                    chain[0].get("for") != [sc.world - 1]:
                run.notes.append(f"group 0 hang evidence.chain is {chain}, expected rank "
                                 f"{sc.world - 2} waiting for [{sc.world - 1}]")
        if sc.kind == "desync":
            sig = ((target.get("evidence") or {}).get("signatures") or {}).get(str(sc.world - 1))
            if (sig or {}).get("op") != "broadcast":
                run.notes.append(f"rank {sc.world - 1}'s signature is {sig}, not broadcast")
        if sc.kind == "desync" and any(f["kind"] == "hang" for f in loud):
            run.notes.append("a hang finding shows next to the desync")
        if run.detect_s < 0:
            run.notes.append("the finding appeared BEFORE the fault (a false positive?)")
        fast = sc.limit_s is None or (0 <= run.detect_s <= sc.limit_s)
        run.status = "PASS" if (run.blame_ok and fast) else "FAIL"
        return run
    finally:
        run.exit_codes = stop_all(procs)
        run.polls, run.max_poll_s = poller.polls, round(poller.max_poll_s, 3)


# -- the healthy run --------------------------------------------------------------------------

def run_healthy(sc: Scenario, rep: int, server: ServerProcess, logdir: Path,
                a: argparse.Namespace) -> Run:
    job = f"healthy-train-{rep}"
    steps = a.healthy_steps or max(50, math.ceil(a.healthy_seconds / HEALTHY_STEP_S))
    run = Run(sc.name, rep, job, sc.goal, expected=[])
    poller = Poller(server.url, job)
    procs: list[subprocess.Popen] = []
    try:
        load0 = os.getloadavg()[0]
        t0 = time.time()
        procs = launch_job("train_job.py", 4, server.url, job, logdir,
                           args=["--steps", str(steps), "--step-time", "0.05"])
        deadline = time.monotonic() + max(a.healthy_seconds * 4, steps * 1.0) + 120
        first_loud: dict[str, float] = {}
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            t_loop = time.monotonic()
            for f in poller.poll():
                if f["severity"] in LOUD and f["id"] not in first_loud:
                    first_loud[f["id"]] = time.time()
                    print(f"  healthy: {f['severity']} {f['kind']} ranks {f['ranks']} "
                          f"at +{time.time() - t0:.1f} s: {f['summary']}", flush=True)
            time.sleep(max(0.0, a.poll - (time.monotonic() - t_loop)))
        t1 = time.time()
        if any(p.poll() is None for p in procs):
            run.notes.append("the job did not finish in time")
            run.notes.append(tail(logdir, job))
            return run
        # Wait for the server to see the job finished, then read every finding it ever showed.
        status = None
        wait_until = time.monotonic() + 30
        while time.monotonic() < wait_until:
            poller.poll()
            try:
                status = (poller.job_detail() or {}).get("status")
            except (OSError, urllib.error.URLError, ValueError):
                pass
            if status in ("finished", "failed"):
                break
            time.sleep(0.5)
        time.sleep(a.settle)
        final = poller.poll()
        run.exit_codes = [p.returncode for p in procs]
        run.steps = steps
        run.notes.append(f"{os.cpu_count()} CPUs; load average at the start {load0:.2f}, at "
                         f"the end {os.getloadavg()[0]:.2f} (1 min)")
        run.notes.append(f"{steps} steps in {t1 - t0:.0f} s ({(t1 - t0) / steps * 1000:.0f} ms "
                         f"per step), job status {status}, exit codes {run.exit_codes}")
        if not a.healthy_steps and t1 - t0 < 0.8 * a.healthy_seconds:
            run.notes.append(f"ran {t1 - t0:.0f} s, shorter than --healthy-seconds "
                             f"{a.healthy_seconds:g}")
        loud = [f for f in final if f["severity"] in LOUD]
        run.others = [compact(f) for f in final]
        run.ranks = sorted({r for f in loud for r in f["ranks"]})
        run.summary = f"{len(loud)} warning/critical, {len(final) - len(loud)} info findings"
        run.detect_s = t1 - t0  # duration, shown in its own column
        if status != "finished" or any(c != 0 for c in run.exit_codes):
            run.notes.append("the healthy job did not end cleanly")
            run.notes.append(tail(logdir, job))
            return run  # ERROR
        run.blame_ok = not loud
        run.status = "PASS" if not loud else "FAIL"
        return run
    finally:
        codes = stop_all(procs)
        if not run.exit_codes:
            run.exit_codes = codes
        run.polls, run.max_poll_s = poller.polls, round(poller.max_poll_s, 3)


# -- report -----------------------------------------------------------------------------------

def fmt(v: float | None, unit: str = "s") -> str:
    return "-" if v is None else f"{v:.2f} {unit}"


def report(runs: list[Run], a: argparse.Namespace) -> str:
    lines = []
    head = ("| scenario | run | finding | ranks (expected) | detection | server first_seen | "
            "limit | blame | verdict |")
    lines += [head, "|" + "---|" * 9]
    for r in runs:
        if r.scenario == "healthy":
            lines.append(f"| healthy | {r.rep} | {r.summary or '-'} | "
                         f"{r.ranks if r.ranks is not None else '-'} ([]) | "
                         f"ran {fmt(r.detect_s)} | - | 0 loud | "
                         f"{'-' if r.blame_ok is None else ('ok' if r.blame_ok else 'WRONG')} | "
                         f"{r.status} |")
            continue
        det = fmt(r.detect_s)
        if r.steps is not None and r.detect_s is not None:
            det += f" = {r.steps:.0f} steps"
        lim = "none" if r.limit_s is None else (
            "30 steps" if r.scenario == "straggler" else f"{r.limit_s:g} s")
        blame = "-" if r.blame_ok is None else ("ok" if r.blame_ok else "WRONG")
        kind = f"{r.kind} (group {r.group})" if r.group is not None else r.kind
        lines.append(f"| {r.scenario} | {r.rep} | {kind} | {r.ranks} ({r.expected}) | {det} | "
                     f"{fmt(r.server_s)} | {lim} | {blame} | {r.status} |")
    lines += ["", "| goal | runs | worst detection | verdict |", "|---|---|---|---|"]
    by: dict[str, list[Run]] = {}
    for r in runs:
        by.setdefault(r.scenario, []).append(r)
    for name, rs in by.items():
        vals = [r.detect_s for r in rs if r.detect_s is not None]
        worst = "-" if not vals else (f"ran {min(vals):.0f} s" if name == "healthy"
                                      else fmt(max(vals)))
        verdict = ("ERROR" if any(r.status == "ERROR" for r in rs) else
                   "PASS" if all(r.status == "PASS" for r in rs) else "FAIL")
        lines.append(f"| {rs[0].goal} | {len(rs)} | {worst} | {verdict} |")
    notes = [(r, n) for r in runs for n in r.notes] + [
        (r, f"other finding: {o}") for r in runs if r.scenario != "healthy" for o in r.others]
    notes += [(r, f"finding: {o}") for r in runs if r.scenario == "healthy" for o in r.others]
    if notes:
        lines += ["", "Notes:"]
        lines += [f"- {r.scenario} #{r.rep}: {n}" for r, n in notes]
    lines += ["", f"Polling every {a.poll:g} s; slowest poll answer "
                  f"{max((r.max_poll_s for r in runs), default=0):.3f} s. "
                  f"Server --hang-after {a.hang_after:g}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    names = ["hang", "chain", "desync", "straggler", "kill", "crash", "init", "healthy"]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=names, metavar="SCENARIO",
                   help=f"scenarios to run (default all: {' '.join(names)})")
    p.add_argument("--repeat", type=int, default=1, help="runs per scenario (default 1)")
    p.add_argument("--world", type=int, default=3, help="ranks of the fault jobs (default 3)")
    p.add_argument("--hang-after", type=float, default=3.0, help="server --hang-after (3)")
    p.add_argument("--poll", type=float, default=0.1, help="findings poll period (0.1 s)")
    p.add_argument("--settle", type=float, default=3.0,
                   help="seconds to keep watching after a detection (3)")
    p.add_argument("--start-timeout", type=float, default=90.0,
                   help="seconds for a job to reach its fault (90)")
    p.add_argument("--exit-timeout", type=float, default=60.0,
                   help="crash/kill: seconds for the other ranks to exit (60)")
    p.add_argument("--straggler-warmup", type=int, default=100,
                   help="healthy steps before the straggler slows down (100)")
    p.add_argument("--straggler-steps", type=int, default=600,
                   help="slow steps at most (600, ~36 s)")
    p.add_argument("--healthy-seconds", type=float, default=180.0,
                   help="healthy 4-rank run length, at least (180)")
    p.add_argument("--healthy-steps", type=int, default=0, help="override the step count")
    p.add_argument("--keep", type=Path, help="keep the database and logs in this folder")
    p.add_argument("--json", type=Path, help="write every run as JSON here")
    a = p.parse_args(argv)
    if a.world < 3:
        p.error("--world must be at least 3 (chain needs two groups, kill/crash blame rank 1)")
    selected = [n for n in names if n in (a.only or names)]
    table = scenarios(a)

    tmp = None
    if a.keep:
        a.keep.mkdir(parents=True, exist_ok=True)
        workdir = a.keep
    else:
        tmp = tempfile.TemporaryDirectory(prefix="pgdash-detect-")
        workdir = Path(tmp.name)
    db = workdir / "pgdash.db"
    runs: list[Run] = []
    server = ServerProcess(f"sqlite:///{db}", log_path=workdir / "server.log",
                           extra=["--host", "127.0.0.1", "--hang-after", f"{a.hang_after:g}"])
    broke = False
    try:
        try:
            server.start()
        except AssertionError as exc:
            print(f"the server did not start: {exc}", file=sys.stderr)
            return 1
        print(f"server {server.url} (--hang-after {a.hang_after:g}), work dir {workdir}",
              flush=True)
        for name in selected:
            sc = table[name]
            for rep in range(1, a.repeat + 1):
                print(f"{name} #{rep} ...", flush=True)
                try:
                    if name == "healthy":
                        run = run_healthy(sc, rep, server, workdir, a)
                    else:
                        run = run_fault(sc, rep, server, db, workdir, a)
                except Exception:  # the benchmark broke; report it and go on
                    run = Run(name, rep, f"{name}-{rep}", sc.goal,
                              notes=[traceback.format_exc()])
                runs.append(run)
                extra = f", {run.steps:.0f} steps" if name == "straggler" and run.steps else ""
                print(f"  {run.status}: {run.kind or run.summary} ranks {run.ranks} "
                      f"detection {fmt(run.detect_s)}{extra}, server {fmt(run.server_s)}",
                      flush=True)
                if server.proc is None or server.proc.poll() is not None:
                    print("the server died", file=sys.stderr)
                    broke = True
                    break
            if broke:
                break
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        broke = True
    finally:
        server.stop()
        if tmp is not None:
            tmp.cleanup()

    print()
    print(report(runs, a))
    if a.json:
        a.json.write_text(json.dumps([asdict(r) for r in runs], indent=1))
    return 1 if broke or any(r.status == "ERROR" for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
