"""How long does pgdash take to name the rank at fault, and does it name the right one?

Each scenario injects one fault into a real gloo job (``tests/jobs/fault_job.py``; one process
per rank, torchrun-style environment, the agent attached) reporting to a real ``pgdash serve``
started here at its DEFAULT settings (no --hang-after, no --stall-after) on 127.0.0.1 and a
fresh SQLite database. Each run injects its fault after a random number of healthy steps
(``--seed``). The bench polls ``GET /api/jobs/<id>/incidents`` every ``--poll`` seconds (0.1)
and records, for every incident, the wall-clock time of the first response that held it.

Measured per run (all clocks are this machine's ``time.time()``):

* **detection** = first response holding the first incident of the expected class that blames
  the right rank - the fault time the job prints (``FAULT <unix time> ...`` on the rank that
  injects the fault, just before injecting it);
* **server** = that incident's own ``first_seen`` - the fault time;
* **blame**: its ranks are exactly the expected ones, and no other warning or critical
  incident of the job (active or not, a few seconds after detection) blames another rank.

Goals (from issue 9), checked per run:

    scenario    incident           blamed                                        limit
    hang        hang (the stall)   the last rank (sleeps instead of all_reduce)  15 s
    chain       hang (the stall)   the last rank (its partner waits in group B)  15 s
    desync      desync             the last rank (broadcast, not all_reduce)     3 s
    crash       crash              rank 1 (raises)                               3 s
    kill        crash (rank_lost)  rank 1 (SIGKILL)                              3 s
    straggler   straggler          the last rank (steps 20% slower)              30 steps
    init        init               rank 2 of 3 (never started)                   12 s after arrival (init_grace 10 s)
    healthy     (none)             4-rank DDP + 2x2 mesh training                0 warnings/criticals
    checkpoint  (none)             the same, rank 0 checkpoints 5 s once         0 warnings/criticals
    mixed       (none)             2x2 mesh: warm-up of up to 4 s per rank,      0 warnings/criticals
                                   0-30 ms jitter per step, 5 s checkpoints

Precision and recall over all runs: every warning or critical incident a run showed is
either right (expected class and ranks, in a fault run) or wrong (any other, and every one
of a healthy run); recall is the share of fault runs whose right incident came within the
scenario's timeout. Both goals are 0.95.

Straggler steps: counted, not estimated: the slow rank prints ``STEP <n> <time>`` as it ends
each slow step, and the figure is how many of those came between its FAULT line (printed
just before the first slow step) and the first response holding the right incident. A
slow step takes 60 ms and a little more (the sleep, then the all_reduce); the notes also
give seconds / 0.06 for comparison. The job first runs a random 60-120 healthy steps (so
the rule has history, as in a real job that slows down mid-run). The goal is 30 steps: the
run passes only if at most 30 slow steps ended before detection.

``init``: a 3-rank ``healthy`` job is launched with only ranks 0 and 1, so there is no FAULT line.
The reference time is the latest ``init_start`` event time (the arrival of the last rank that
did arrive, stamped by its agent) read from the server's event log (the SQLite database this
bench created, opened read-only).

This is a measurement, not a test: the exit status is 0 whatever the figures, 1 only if the
benchmark itself broke (the server did not start, a job never reached its fault, ...).
Every process started here is stopped by PID. The machine it runs on is shared: keep the
runs few. Run it from the repository root::

    python bench/detect.py                          # every scenario once
    python bench/detect.py --repeat 3 --healthy-seconds 60
    python bench/detect.py --only hang desync --repeat 5 --json /tmp/detect.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
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
from dashboard.storage import Store  # noqa: E402

STRAGGLER_STEP_S = 0.06  # one straggler step of fault_job (the slow rank's sleep)
STRAGGLER_GOAL_STEPS = 30  # issue 9: named within 30 steps
HEALTHY_STEP_S = 0.05  # train_job --step-time: the sleep per step, a lower bound of a step
MIXED_STEP_S = 0.07  # fault_job mixed: 50 ms sleep, 0-30 ms jitter, two all_reduces
FAULT_RE = re.compile(r"^FAULT (\d+(?:\.\d+)?) (.*)$", re.MULTILINE)
STEP_RE = re.compile(r"^STEP (\d+) (\d+(?:\.\d+)?)$", re.MULTILINE)
LOUD = ("warning", "critical")
HEALTHY = ("healthy", "checkpoint", "mixed")


@dataclass
class Scenario:
    name: str
    kind: str | None  # the class of incident that must appear (None: healthy, none may)
    blamed: list[int] | None  # expected ranks of that incident
    goal: str  # how the limit reads in the table
    limit_s: float | None  # detection limit in seconds (None: no latency goal)
    world: int = 3
    args: Any = field(default_factory=list)  # list, or rng -> list (random timing per run)
    only: list[int] | None = None
    timeout_s: float = 30.0  # after the fault (or launch) for the incident to appear
    script: str = "fault_job.py"


def scenarios(a: argparse.Namespace) -> dict[str, Scenario]:
    w, last = a.world, a.world - 1

    def steps(rng: random.Random) -> str:  # healthy steps before the fault
        return str(rng.randint(25, 60))

    return {
        "hang": Scenario("hang", "hang", [last], "hang: <= 15 s", 15.0, w,
                         lambda rng: ["hang", steps(rng)], timeout_s=75),
        "chain": Scenario("chain", "hang", [last], "hang (chain): <= 15 s", 15.0, w,
                          lambda rng: ["chain", steps(rng)], timeout_s=75),
        "desync": Scenario("desync", "desync", [last], "desync: <= 3 s", 3.0, w,
                           lambda rng: ["desync", steps(rng)]),
        "crash": Scenario("crash", "crash", [1], "crash (raises): <= 3 s", 3.0, w,
                          lambda rng: ["crash", steps(rng)]),
        "kill": Scenario("kill", "crash", [1], "crash (SIGKILL): <= 3 s", 3.0, w,
                         lambda rng: ["kill", steps(rng)]),
        "straggler": Scenario(
            "straggler", "straggler", [last], "straggler: <= 30 steps (counted)",
            30 * STRAGGLER_STEP_S, w,
            lambda rng: ["straggler", str(rng.randint(60, 120)), str(a.straggler_steps)],
            timeout_s=a.straggler_steps * STRAGGLER_STEP_S + 10),
        "init": Scenario("init", "init", [2], "init_incomplete: <= 12 s after arrival",
                         12.0, 3, ["healthy"], only=[0, 1]),
        "healthy": Scenario("healthy", None, None, "healthy 4 ranks: 0 warnings/criticals",
                            None, 4, lambda rng: [], script="train_job.py"),
        "checkpoint": Scenario(
            "checkpoint", None, None, "checkpoint 5 s: 0 warnings/criticals", None, 4,
            lambda rng: ["--scenario", "checkpoint", "--fault-step", str(rng.randint(40, 90))],
            script="train_job.py"),
        "mixed": Scenario(
            "mixed", None, None, "warm-up+jitter+checkpoints: 0 warnings/criticals", None, 4,
            lambda rng: ["mixed", "0", "4", "5", str(rng.randint(60, 100)),
                         str(max(100, int(a.healthy_seconds / MIXED_STEP_S)))],
            script="fault_job.py"),
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
    right: int = 0  # loud incidents of the expected class and ranks
    wrong: int = 0  # every other loud incident


# -- HTTP -------------------------------------------------------------------------------------

def get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


class Poller:
    """Polls one job's incidents; remembers when each incident id was first returned."""

    def __init__(self, base: str, job: str):
        self.base, self.job = base, job
        self.job_id: int | None = None
        self.seen: dict[str, float] = {}  # incident id -> wall time of the first response
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
            found = get_json(f"{self.base}/api/jobs/{self.job_id}/incidents")["incidents"]
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

    def findings(self) -> list[dict[str, Any]]:
        if self.job_id is None:
            return []
        return get_json(f"{self.base}/api/jobs/{self.job_id}/findings")["findings"]

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


def slow_steps(logdir: Path, job: str, until: float) -> int:
    """Slow steps the straggler ended after its FAULT line, up to ``until`` (its STEP lines)."""
    count = 0
    for log in logdir.glob(f"{job}-rank*.log"):
        count = max(count, sum(1 for m in STEP_RE.finditer(log.read_text(errors="replace"))
                               if float(m.group(2)) <= until))
    return count


def init_arrivals(db: Path, job_id: int) -> dict[int, float]:
    """rank -> init_start event time, from the server's event log (its rows and packs)."""
    store = Store(f"sqlite:///{db}")  # not started: reads only
    try:
        rank_of = {s["id"]: s["rank"] for s in store.job_sessions(job_id)}
        return {rank_of[ev["session"]]: ev["t"] for ev in store.job_events(job_id)
                if ev["kind"] == "init_start"}
    finally:
        store.engine.dispose()


def tail(logdir: Path, job: str, chars: int = 600) -> str:
    return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}"
                     for log in sorted(logdir.glob(f"{job}-rank*.log")))


def compact(f: dict[str, Any]) -> dict[str, Any]:
    return {k: f.get(k) for k in ("id", "kind", "severity", "ranks", "group", "active",
                                  "first_seen", "summary") if k in f}


def cls(incident: dict[str, Any]) -> str:
    """The class of an incident: the root cause part of its id (hang:r2 -> hang)."""
    return incident["id"].split(":", 1)[0]


# -- one fault run ----------------------------------------------------------------------------

def run_fault(sc: Scenario, rep: int, server: ServerProcess, db: Path, logdir: Path,
              a: argparse.Namespace, args: list[str]) -> Run:
    job = f"{sc.name}-{rep}"
    run = Run(sc.name, rep, job, sc.goal, kind=sc.kind, expected=sc.blamed, limit_s=sc.limit_s)
    run.notes.append(f"args {args}")
    poller = Poller(server.url, job)
    procs: list[subprocess.Popen] = []
    try:
        launched = time.time()
        procs = launch_job(sc.script, sc.world, server.url, job, logdir, args=args,
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
            hit = [f for f in found if cls(f) == sc.kind and f["ranks"] == sc.blamed]
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
            run.notes.append(f"no {sc.kind} incident blaming {sc.blamed} within "
                             f"{sc.timeout_s:g} s (incidents: {[compact(f) for f in final]})")
            run.others = [compact(f) for f in final if f["severity"] in LOUD]
            run.wrong = len(run.others)
            return run
        target = next((f for f in final if f["id"] == target["id"]), target)
        run.ranks, run.group, run.summary = target["ranks"], target["kind"], target["summary"]
        run.observed_t = poller.seen[target["id"]]
        run.first_seen = target["first_seen"]
        run.detect_s = run.observed_t - run.fault_t
        run.server_s = run.first_seen - run.fault_t
        if sc.name == "straggler":
            run.steps = slow_steps(logdir, job, run.observed_t)
            run.notes.append(f"{run.steps} slow steps ended between the fault and the first "
                             f"response holding the incident ({run.detect_s:.2f} s, "
                             f"{run.detect_s / STRAGGLER_STEP_S:.0f} nominal 60 ms steps)")
        # Everything loud the job ever showed, and who it blames.
        loud = [f for f in final if f["severity"] in LOUD]
        run.others = [compact(f) for f in loud if f["id"] != target["id"]]
        run.right = sum(1 for f in loud if cls(f) == sc.kind and f["ranks"] == sc.blamed)
        run.wrong = len(loud) - run.right
        blamed_elsewhere = {r for f in loud for r in f["ranks"]} - set(sc.blamed)
        run.blame_ok = target["ranks"] == sc.blamed and not run.wrong
        if blamed_elsewhere:
            run.notes.append(f"other incidents also blame ranks {sorted(blamed_elsewhere)}")
        run.notes.append(f"{len(poller.findings())} findings grouped into {len(final)} "
                         "incident(s)")
        if run.detect_s < 0:
            run.notes.append("the incident appeared BEFORE the fault (a false positive?)")
        fast = sc.limit_s is None or (0 <= run.detect_s <= sc.limit_s)
        if sc.name == "straggler":  # the goal is in steps (counted above)
            fast = 0 <= run.detect_s and run.steps <= STRAGGLER_GOAL_STEPS
        run.status = "PASS" if (run.blame_ok and fast) else "FAIL"
        return run
    finally:
        run.exit_codes = stop_all(procs)
        run.polls, run.max_poll_s = poller.polls, round(poller.max_poll_s, 3)


# -- the healthy run --------------------------------------------------------------------------

def run_healthy(sc: Scenario, rep: int, server: ServerProcess, logdir: Path,
                a: argparse.Namespace, args: list[str]) -> Run:
    job = f"{sc.name}-{rep}"
    steps = a.healthy_steps or max(50, math.ceil(a.healthy_seconds / HEALTHY_STEP_S))
    if sc.script == "train_job.py":
        args = ["--steps", str(steps), "--step-time", "0.05", *args]
    else:
        steps = int(args[-1])
    run = Run(sc.name, rep, job, sc.goal, expected=[])
    run.notes.append(f"{sc.script} {args}")
    poller = Poller(server.url, job)
    procs: list[subprocess.Popen] = []
    try:
        load0 = os.getloadavg()[0]
        t0 = time.time()
        procs = launch_job(sc.script, sc.world, server.url, job, logdir, args=args)
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
        findings = poller.findings()
        loud_findings = [f for f in findings if f["severity"] in LOUD]
        run.others = [compact(f) for f in final + loud_findings]
        run.wrong = len(loud)
        run.ranks = sorted({r for f in loud for r in f["ranks"]})
        run.summary = (f"{len(loud)} warning/critical incidents, {len(loud_findings)} "
                       f"warning/critical of {len(findings)} findings")
        run.detect_s = t1 - t0  # duration, shown in its own column
        if status != "finished" or any(c != 0 for c in run.exit_codes):
            run.notes.append("the healthy job did not end cleanly")
            run.notes.append(tail(logdir, job))
            return run  # ERROR
        run.blame_ok = not loud and not loud_findings
        run.status = "PASS" if run.blame_ok else "FAIL"
        if poller.job_id is not None:
            m = stall_margin(logdir / "pgdash.db", poller.job_id)
            run.notes.append(f"longest wait for a peer that had not entered: {m['wait_s']} s "
                             f"(group {m['group']}, +{m['at_s']} s), stall threshold then "
                             f"{m['threshold_s']} s: {m['closest_share']:.0%} of it")
        return run
    finally:
        codes = stop_all(procs)
        if not run.exit_codes:
            run.exit_codes = codes
        run.polls, run.max_poll_s = poller.polls, round(poller.max_poll_s, 3)


# -- how close a healthy job came to a stall ----------------------------------------------------

def stall_margin(db: Path, job_id: int, tick: float = 0.25) -> dict[str, Any]:
    """Replays a job's stored log (dashboard.state + dashboard.diagnosis, default settings)
    and finds the longest wait of any rank in a collective that a peer had not entered yet,
    with the stall threshold in force at that moment: how much room the defaults left."""
    sys.path.insert(0, str(ROOT))
    from dashboard import diagnosis as d
    from dashboard.state import JobState
    from dashboard.storage import Store

    store = Store(f"sqlite:///{db}")
    try:
        events = list(store.job_events(job_id))
    finally:
        store.engine.dispose()
    s = d.Settings()
    state = JobState(job_id, "replay")
    worst = {"wait_s": 0.0, "threshold_s": None, "group": None, "at_s": None,
             "closest_share": 0.0}
    if not events:
        return worst
    t, i, end = events[0]["received_at"], 0, events[-1]["received_at"]
    while t <= end:
        while i < len(events) and events[i]["received_at"] <= t:
            state.apply(events[i])
            i += 1
        for group in state.groups:
            rows = state.progress_of(group)
            for view in (d.PYTHON, d.FLIGHT):
                busy = {r: row for r, row in rows.items() if view.busy(row)}
                if not busy:
                    continue
                seq = max(row[view.seq] for row in busy.values())
                waiting = {r for r, row in busy.items() if row[view.seq] == seq}
                if not d._behind(state, group, seq, waiting, view):
                    continue
                wait = t - min(rows[r][view.since] for r in waiting)
                threshold, _ = d._stall_threshold(state, group, view, rows, s)
                if wait / threshold > worst["closest_share"]:
                    worst.update(wait_s=round(wait, 2), threshold_s=round(threshold, 2),
                                 group=group, at_s=round(t - events[0]["received_at"], 1),
                                 closest_share=round(wait / threshold, 3))
        t += tick
    return worst


# -- report -----------------------------------------------------------------------------------

def fmt(v: float | None, unit: str = "s") -> str:
    return "-" if v is None else f"{v:.2f} {unit}"


def report(runs: list[Run], a: argparse.Namespace) -> str:
    lines = []
    head = ("| scenario | run | incident | ranks (expected) | detection | server first_seen | "
            "limit | blame | verdict |")
    lines += [head, "|" + "---|" * 9]
    for r in runs:
        if r.scenario in HEALTHY:
            lines.append(f"| {r.scenario} | {r.rep} | {r.summary or '-'} | "
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
        kind = f"{r.kind} ({r.group})" if r.group is not None else r.kind
        lines.append(f"| {r.scenario} | {r.rep} | {kind} | {r.ranks} ({r.expected}) | {det} | "
                     f"{fmt(r.server_s)} | {lim} | {blame} | {r.status} |")
    lines += ["", "| goal | runs | worst detection | verdict |", "|---|---|---|---|"]
    by: dict[str, list[Run]] = {}
    for r in runs:
        by.setdefault(r.scenario, []).append(r)
    for name, rs in by.items():
        vals = [r.detect_s for r in rs if r.detect_s is not None]
        worst = "-" if not vals else (f"ran {min(vals):.0f} s" if name in HEALTHY
                                      else fmt(max(vals)))
        verdict = ("ERROR" if any(r.status == "ERROR" for r in rs) else
                   "PASS" if all(r.status == "PASS" for r in rs) else "FAIL")
        lines.append(f"| {rs[0].goal} | {len(rs)} | {worst} | {verdict} |")
    faults = [r for r in runs if r.scenario not in HEALTHY and r.status != "ERROR"]
    right = sum(r.right for r in runs)
    wrong = sum(r.wrong for r in runs)
    found = sum(1 for r in faults if r.observed_t is not None)
    precision = right / (right + wrong) if right + wrong else None
    recall = found / len(faults) if faults else None
    lines += ["", "| incidents right | incidents wrong | fault runs | named | precision | "
                  "recall |", "|---|---|---|---|---|---|",
              f"| {right} | {wrong} | {len(faults)} | {found} | "
              f"{'-' if precision is None else f'{precision:.2f}'} | "
              f"{'-' if recall is None else f'{recall:.2f}'} |"]
    notes = [(r, n) for r in runs for n in r.notes] + [
        (r, f"other incident: {o}") for r in runs if r.scenario not in HEALTHY
        for o in r.others]
    notes += [(r, f"seen: {o}") for r in runs if r.scenario in HEALTHY for o in r.others]
    if notes:
        lines += ["", "Notes:"]
        lines += [f"- {r.scenario} #{r.rep}: {n}" for r, n in notes]
    lines += ["", f"Polling every {a.poll:g} s; slowest poll answer "
                  f"{max((r.max_poll_s for r in runs), default=0):.3f} s. "
                  f"Server settings: {'--hang-after ' + format(a.hang_after, 'g') if a.hang_after else 'the defaults'}; seed {a.seed}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    names = ["hang", "chain", "desync", "straggler", "kill", "crash", "init", *HEALTHY]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=names, metavar="SCENARIO",
                   help=f"scenarios to run (default all: {' '.join(names)})")
    p.add_argument("--repeat", type=int, default=1, help="runs per scenario (default 1)")
    p.add_argument("--world", type=int, default=3, help="ranks of the fault jobs (default 3)")
    p.add_argument("--hang-after", type=float, default=None,
                   help="server --hang-after (default: the server's own default)")
    p.add_argument("--seed", type=int, default=None, help="random timing seed (default: time)")
    p.add_argument("--poll", type=float, default=0.1, help="findings poll period (0.1 s)")
    p.add_argument("--settle", type=float, default=3.0,
                   help="seconds to keep watching after a detection (3)")
    p.add_argument("--start-timeout", type=float, default=90.0,
                   help="seconds for a job to reach its fault (90)")
    p.add_argument("--exit-timeout", type=float, default=60.0,
                   help="crash/kill: seconds for the other ranks to exit (60)")
    p.add_argument("--straggler-steps", type=int, default=600,
                   help="slow steps at most (600, ~36 s)")
    p.add_argument("--healthy-seconds", type=float, default=60.0,
                   help="healthy 4-rank run length, at least (60)")
    p.add_argument("--healthy-steps", type=int, default=0, help="override the step count")
    p.add_argument("--keep", type=Path, help="keep the database and logs in this folder")
    p.add_argument("--json", type=Path, help="write every run as JSON here")
    a = p.parse_args(argv)
    if a.world < 3:
        p.error("--world must be at least 3 (chain needs two groups, kill/crash blame rank 1)")
    selected = [n for n in names if n in (a.only or names)]
    table = scenarios(a)
    if a.seed is None:
        a.seed = int(time.time()) % 100_000
    rng = random.Random(a.seed)

    tmp = None
    if a.keep:
        a.keep.mkdir(parents=True, exist_ok=True)
        workdir = a.keep
    else:
        tmp = tempfile.TemporaryDirectory(prefix="pgdash-detect-")
        workdir = Path(tmp.name)
    db = workdir / "pgdash.db"
    runs: list[Run] = []
    extra = ["--host", "127.0.0.1"]
    if a.hang_after:
        extra += ["--hang-after", f"{a.hang_after:g}"]
    server = ServerProcess(f"sqlite:///{db}", log_path=workdir / "server.log", extra=extra)
    broke = False
    try:
        try:
            server.start()
        except AssertionError as exc:
            print(f"the server did not start: {exc}", file=sys.stderr)
            return 1
        print(f"server {server.url} ({' '.join(extra)}), seed {a.seed}, work dir {workdir}",
              flush=True)
        for name in selected:
            sc = table[name]
            for rep in range(1, a.repeat + 1):
                print(f"{name} #{rep} ...", flush=True)
                args = sc.args(rng) if callable(sc.args) else list(sc.args)
                try:
                    if name in HEALTHY:
                        run = run_healthy(sc, rep, server, workdir, a, args)
                    else:
                        run = run_fault(sc, rep, server, db, workdir, a, args)
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
