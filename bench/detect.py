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

    python -m bench.detect                          # every scenario once
    python -m bench.detect --repeat 3 --healthy-seconds 60
    python -m bench.detect --only hang desync --repeat 5 --json /tmp/detect.json

``--corpus`` judges pgdash on the corpus of real fault scripts in ``bench/corpus/`` instead
(each script's docstring says what must be said: see the comment above ``CORPUS_DIR``); each
script runs alone against its own fresh ``pgdash serve`` (defaults, new SQLite file)::

    python -m bench.detect --corpus                                  # every script once
    python -m bench.detect --corpus --only hang_allreduce pp_gpipe_freeze --repeat 3
    python -m bench.detect --corpus --pgdash-root /tmp/pgdash-before --json /tmp/before.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import re
import signal
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

from bench.common import ROOT, free_port
from dashboard.storage.store import Store
from tests.helpers.procs import ServerProcess, launch_job
from tests.helpers.procs import get_json as api_json  # (closes its socket on a timeout)

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
    snapshot_s: float | None = None  # incident first seen -> first seen with its snapshot
    snapshot_where: str = ""  # the line the snapshot's training thread stood in
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
        # incident id -> (wall time of the first response holding its snapshot, the snapshot)
        self.snapshots: dict[str, tuple[float, dict[str, Any]]] = {}
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
            if f.get("snapshot"):
                self.snapshots.setdefault(f["id"], (t1, f["snapshot"]))
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
        rank_of = {s["id"]: s["rank"] for s in store.sessions.of_job(job_id)}
        return {rank_of[ev["session"]]: ev["t"] for ev in store.log.events(job_id)
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
        snap = poller.snapshots.get(target["id"])
        if snap is not None:  # issue 26: the culprit's stack on its incident, and its line
            run.snapshot_s = snap[0] - run.observed_t
            where = snap[1].get("where") or {}
            run.snapshot_where = (f"rank {snap[1]['rank']} at "
                                  f"{Path(str(where.get('file'))).name}:{where.get('line')}: "
                                  f"{where.get('code')}")
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
    from dashboard.diagnosis import Settings
    from dashboard.diagnosis.rules.stalls import stall_threshold
    from dashboard.diagnosis.rules.waits import FLIGHT, PYTHON, ranks_behind
    from dashboard.state import JobState
    from dashboard.storage.store import Store

    store = Store(f"sqlite:///{db}")
    try:
        events = list(store.log.events(job_id))
    finally:
        store.engine.dispose()
    s = Settings()
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
            for view in (PYTHON, FLIGHT):
                busy = {r: row for r, row in rows.items() if view.busy(row)}
                if not busy:
                    continue
                seq = max(row[view.seq] for row in busy.values())
                waiting = {r for r, row in busy.items() if row[view.seq] == seq}
                if not ranks_behind(state, group, seq, waiting, view):
                    continue
                wait = t - min(rows[r][view.since] for r in waiting)
                threshold, _ = stall_threshold(state, group, view, rows, s)
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
    snapped = [r for r in runs if r.scenario not in HEALTHY and r.observed_t is not None]
    if snapped:
        lines += ["", "| scenario | run | the culprit's snapshot on its incident (after it "
                      "showed) | where it stood |", "|---|---|---|---|"]
        lines += [f"| {r.scenario} | {r.rep} | "
                  f"{fmt(r.snapshot_s) if r.snapshot_s is not None else 'none'} | "
                  f"{r.snapshot_where or '-'} |" for r in snapped]
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


# -- the corpus (--corpus) --------------------------------------------------------------------
#
# bench/corpus/*.py: short standalone training scripts, each with a header in its docstring:
#
#     """One line: what the script does and what goes wrong.
#     EXPECT kind=hang culprit=2 ranks=4 launch=torchrun class=p2p [stop_after=25 stop=sigint]
#     """
#
# kind       the finding kind that is the right verdict: a design.md kind, `stall`,
#            `rank_exited_early`, several as `desync|hang`, or `none` (a healthy script: no
#            warning/critical finding or incident may appear at all). `hang` accepts a `stall`
#            (the warning that comes first) or a `hang`.
# culprit    the rank(s) the verdict must blame, exactly (comma separated)
# ranks      world size; launch: `torchrun` (python -m torch.distributed.run --nproc-per-node N
#            --master-port P -m pgdash_agent SCRIPT), `agent` (one `python -m pgdash_agent SCRIPT` per rank
#            with a torchrun-style environment, as tests/conftest.py's launch_job does) or
#            `script` (one `python SCRIPT`, which starts its ranks itself, e.g. with
#            torch.multiprocessing.spawn, and calls ``attach()`` in each: MASTER_ADDR and
#            MASTER_PORT are set for it)
# class      the row of the table the script counts in
# stop_after seconds after the FAULT line (a healthy script's ``MARK <unix time>`` line) at
#            which the runner stops the job: stop=sigint sends
#            SIGINT to the launcher and every rank (as Ctrl-C in a terminal does: the whole
#            foreground process group), stop=sigterm sends SIGTERM to every rank
# restarts   torchrun --max-restarts (an elastic restart: the next attempt of the same job)
# absent     ranks the runner never starts (a node that never comes up; launch=agent only)
# tolerate   finding kinds a healthy script may get as a warning (never a critical), where
#            waiting to warn would be too late for the fault it looks like (comma separated)
# goal       overrides the goal (seconds, or slow steps for a straggler)
#
# The runner sets CORPUS_SEED (each script draws the step of its fault from it, so timing
# varies run to run), PGDASH_SERVER and PGDASH_JOB (unique per run). A script prints
# ``FAULT <unix time> <what>`` on the rank that injects the fault just before injecting it;
# a straggler prints ``STEP <n> <unix time>`` as it ends every slow step after that.

CORPUS_DIR = ROOT / "bench" / "corpus"
EXPECT_RE = re.compile(r"^EXPECT (.*)$", re.MULTILINE)
ANY_FAULT_RE = re.compile(r"FAULT (\d+\.\d+) ([^\n]*)")
ANY_MARK_RE = re.compile(r"MARK (\d+\.\d+)")
ANY_STEP_RE = re.compile(r"STEP (\d+) (\d+\.\d+)")
# Kinds a header's kind accepts as the right verdict.
KIND_ALIASES = {"hang": {"stall", "hang"}, "stall": {"stall", "hang"}}
# Goals per kind: (limit, unit). hang/stall <= 15 s, crash/exit <= 3 s, straggler <= 30 steps.
KIND_GOALS = {"hang": (15.0, "s"), "stall": (15.0, "s"), "init_incomplete": (15.0, "s"),
              "straggler": (30.0, "steps"), "rank_failed": (3.0, "s"), "rank_lost": (3.0, "s"),
              "rank_exited_early": (3.0, "s"), "desync": (3.0, "s"), "init_failed": (3.0, "s")}
# How long after the FAULT line the runner keeps looking for the right verdict (it records a
# late one too, to say how late): long enough for the server's 60 s hang.
KIND_WAIT = {"hang": 75.0, "stall": 75.0, "init_incomplete": 45.0, "straggler": 60.0}
DEFAULT_WAIT = 30.0


@dataclass
class Spec:
    name: str
    path: Path
    title: str
    kind: str  # as written: "hang", "desync|hang", "none", ...
    kinds: set[str]  # finding kinds accepted as the right verdict (empty: healthy)
    culprit: list[int]
    ranks: int
    launch: str
    cls: str
    goal: float | None
    unit: str
    wait_s: float
    stop_after: float | None = None
    stop: str | None = None
    restarts: int = 0
    absent: list[int] = field(default_factory=list)
    tolerate: set[str] = field(default_factory=set)

    @property
    def healthy(self) -> bool:
        return not self.kinds


def parse_spec(path: Path) -> Spec:
    """The script's EXPECT header; raises ValueError naming the script when it is broken."""
    text = path.read_text()
    m = re.match(r'\s*(?:#[^\n]*\n\s*)*[rR]?"""(.*?)"""', text, re.DOTALL)
    doc = m.group(1) if m else ""
    h = EXPECT_RE.search(doc)
    if not h:
        raise ValueError(f"{path.name}: no EXPECT line in its module docstring")
    fields = dict(part.split("=", 1) for part in h.group(1).split())
    try:
        kind = fields["kind"]
        kinds: set[str] = set()
        if kind != "none":
            for k in kind.split("|"):
                kinds |= KIND_ALIASES.get(k, {k})
        first = kind.split("|")[0]
        goal, unit = KIND_GOALS.get(first, (15.0, "s")) if kinds else (None, "")
        if "desync" in kind and "hang" in kind:  # either is right: the hang's goal
            goal, unit = KIND_GOALS["hang"]
        if "goal" in fields:
            goal = float(fields["goal"])
        culprit = sorted(int(r) for r in fields.get("culprit", "").split(",") if r != "")
        spec = Spec(
            name=path.stem, path=path, title=doc.strip().splitlines()[0], kind=kind,
            kinds=kinds, culprit=culprit, ranks=int(fields["ranks"]), launch=fields["launch"],
            cls=fields.get("class", first), goal=goal, unit=unit,
            wait_s=max(KIND_WAIT.get(k, DEFAULT_WAIT) for k in kind.split("|")),
            stop_after=float(fields["stop_after"]) if "stop_after" in fields else None,
            stop=fields.get("stop"), restarts=int(fields.get("restarts", 0)),
            absent=[int(r) for r in fields.get("absent", "").split(",") if r != ""],
            tolerate={k for k in fields.get("tolerate", "").split(",") if k})
    except (KeyError, ValueError) as exc:
        raise ValueError(f"{path.name}: bad EXPECT line {h.group(1)!r}: {exc!r}") from None
    if spec.launch not in ("torchrun", "agent", "script"):
        raise ValueError(f"{path.name}: launch must be torchrun, agent or script, "
                         f"not {spec.launch}")
    if spec.kinds and not spec.culprit:
        raise ValueError(f"{path.name}: kind={kind} needs culprit=")
    if spec.stop_after is not None and spec.stop not in ("sigint", "sigterm"):
        raise ValueError(f"{path.name}: stop_after needs stop=sigint or stop=sigterm")
    if spec.absent and spec.launch != "agent":
        raise ValueError(f"{path.name}: absent= needs launch=agent")
    if spec.tolerate and not spec.healthy:
        raise ValueError(f"{path.name}: tolerate= is for healthy scripts (kind=none)")
    return spec


def corpus_specs(folder: Path = CORPUS_DIR, only: list[str] | None = None) -> list[Spec]:
    specs = [parse_spec(p) for p in sorted(folder.glob("*.py")) if not p.name.startswith("_")]
    if only:
        known = {s.name for s in specs}
        missing = [n for n in only if n.removesuffix(".py") not in known]
        if missing:
            raise ValueError(f"no such corpus script(s): {missing}; known: {sorted(known)}")
        want = [n.removesuffix(".py") for n in only]
        specs = [s for s in specs if s.name in want]
    return specs


@dataclass
class CorpusRun:
    script: str
    rep: int
    cls: str
    kind: str
    culprit: list[int]
    launch: str
    seed: int
    job: str
    status: str = "ERROR"  # PASS, FAIL, or ERROR (the script or the bench broke)
    why: str = ""
    goal: float | None = None
    unit: str = ""
    fault_t: float | None = None
    fault_what: str = ""
    verdict: dict[str, Any] | None = None  # the first right verdict (finding or incident)
    verdict_t: float | None = None  # wall time of the first poll answer that held it
    detect_s: float | None = None
    steps: int | None = None  # straggler: slow steps ended before the verdict
    within_goal: bool = False
    stop_t: float | None = None
    loud: list[dict[str, Any]] = field(default_factory=list)  # every loud finding, once
    loud_incidents: list[dict[str, Any]] = field(default_factory=list)
    victims: list[dict[str, Any]] = field(default_factory=list)  # loud, blaming another rank
    right: int = 0  # loud findings of the expected kind blaming exactly the culprit
    wrong: int = 0  # every other loud finding
    exit_codes: list[int | None] = field(default_factory=list)
    duration_s: float = 0.0
    polls: int = 0
    notes: list[str] = field(default_factory=list)


class CorpusServer:
    """``pgdash serve`` at its defaults from ``root`` (cwd and PYTHONPATH), stopped by PID."""

    def __init__(self, root: Path, db: Path, log: Path):
        self.root, self.db, self.log = root, db, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> "CorpusServer":
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dashboard", "serve", "--host", "127.0.0.1",
                 "--port", str(self.port), "--db", f"sqlite:///{self.db}"],
                stdout=out, stderr=subprocess.STDOUT, cwd=self.root, env=child_env(self.root))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgdash serve exited ({self.proc.returncode}): "
                                   f"{self.log.read_text(errors='replace')[-1500:]}")
            try:
                api_json(self.url + "/api/jobs", timeout=2.0)
                return self
            except (OSError, http.client.HTTPException, ValueError):
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"pgdash serve did not answer on {self.url} within {timeout:g} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def child_env(root: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the server and the ranks: ``root`` first on PYTHONPATH, this
    checkout nowhere on it (unless it is ``root``), no PGDASH_* setting of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGDASH_")}
    keep = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
            if p and Path(p).resolve() not in (ROOT, root.resolve())]
    env["PYTHONPATH"] = os.pathsep.join([str(root), *keep])
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def launch_corpus(spec: Spec, root: Path, url: str, job: str, seed: int,
                  logdir: Path) -> list[subprocess.Popen]:
    """Start the script as its header says; returns the processes this bench started."""
    master_port = str(free_port())
    base = {"PGDASH_SERVER": url, "PGDASH_JOB": job, "CORPUS_SEED": str(seed)}
    if spec.launch == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
               str(spec.ranks), "--master-addr", "127.0.0.1", "--master-port", master_port]
        if spec.restarts:
            cmd += ["--max-restarts", str(spec.restarts)]
        cmd += ["-m", "pgdash_agent", str(spec.path)]
        with open(logdir / f"{job}-torchrun.log", "ab") as out:
            return [subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=root,
                                     env=child_env(root, base))]
    if spec.launch == "script":
        env = child_env(root, {**base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": master_port})
        with open(logdir / f"{job}-script.log", "ab") as out:
            return [subprocess.Popen([sys.executable, str(spec.path)], stdout=out,
                                     stderr=subprocess.STDOUT, cwd=root, env=env)]
    procs = []
    for rank in range(spec.ranks):
        if rank in spec.absent:
            continue
        env = child_env(root, {**base, "RANK": str(rank), "LOCAL_RANK": str(rank),
                               "WORLD_SIZE": str(spec.ranks), "LOCAL_WORLD_SIZE": str(spec.ranks),
                               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": master_port})
        with open(logdir / f"{job}-rank{rank}.log", "ab") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", "pgdash_agent", str(spec.path)],
                                          stdout=out, stderr=subprocess.STDOUT, cwd=root,
                                          env=env))
    return procs


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc), children before grandchildren."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        kids: list[int] = []
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids += [int(k) for k in f.read().split()]
        except OSError:
            pass
        out += kids
        todo += kids
    return out


def send_each(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def rank_pids(spec: Spec, procs: list[subprocess.Popen]) -> list[int]:
    if spec.launch == "agent":
        return [p.pid for p in procs if p.poll() is None]
    return [pid for p in procs for pid in descendants(p.pid)]


def stop_tree(procs: list[subprocess.Popen]) -> list[int | None]:
    """Kill what this bench started (and the ranks a torchrun started), each by its PID."""
    pids = [pid for p in procs if p.poll() is None for pid in descendants(p.pid)]
    send_each([p.pid for p in procs if p.poll() is None], signal.SIGKILL)
    send_each(pids, signal.SIGKILL)
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=15))
        except subprocess.TimeoutExpired:
            codes.append(None)
    return codes


def read_logs(logdir: Path, job: str) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(logdir.glob(f"{job}-*.log")))


def log_tail(logdir: Path, job: str, chars: int = 800) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}"
                     for p in sorted(logdir.glob(f"{job}-*.log")))


def brief(f: dict[str, Any]) -> dict[str, Any]:
    return {k: f.get(k) for k in ("id", "kind", "severity", "ranks", "group", "first_seen",
                                  "summary", "active", "seen_at")}


def say(f: dict[str, Any]) -> str:
    return f"{f['kind']} {f['ranks']} ({f['severity']})"


class CorpusPoller:
    """Polls one job's findings and incidents; remembers every loud one and when it came."""

    def __init__(self, base: str, job: str):
        self.base, self.job = base, job
        self.job_id: int | None = None
        self.status: str | None = None
        self.findings: dict[str, dict[str, Any]] = {}  # id -> first loud sighting
        self.incidents: dict[str, dict[str, Any]] = {}
        self.polls = self.errors = 0

    def poll(self) -> float | None:
        """One round; returns the wall time the answers arrived (None: nothing to read yet)."""
        try:
            if self.job_id is None:
                job = next((j for j in api_json(self.base + "/api/jobs")["jobs"]
                            if j["name"] == self.job), None)
                if job is None:
                    return None
                self.job_id = job["id"]
            found = api_json(f"{self.base}/api/jobs/{self.job_id}/findings")["findings"]
            incs = api_json(f"{self.base}/api/jobs/{self.job_id}/incidents")["incidents"]
            self.status = api_json(f"{self.base}/api/jobs/{self.job_id}")["status"]
        except (OSError, http.client.HTTPException, ValueError, KeyError):
            self.errors += 1
            return None
        now = time.time()
        self.polls += 1
        for mine, theirs in ((self.findings, found), (self.incidents, incs)):
            for f in theirs:
                key = f"{f['id']}|{f['kind']}|{f['severity']}|{sorted(f['ranks'])}"
                if f["severity"] in LOUD and key not in mine:
                    mine[key] = dict(f, ranks=sorted(f["ranks"]), seen_at=now)
        return now


def run_corpus_script(spec: Spec, rep: int, seed: int, root: Path, workdir: Path,
                      poll_s: float = 0.2, settle_s: float = 5.0,
                      start_timeout: float = 120.0) -> CorpusRun:
    """Run one corpus script against a fresh ``pgdash serve`` (defaults, new SQLite file) and
    judge what the server said. Never raises for a failure of the script or of pgdash."""
    job = f"{spec.name}-{rep}-{seed}"
    run = CorpusRun(spec.name, rep, spec.cls, spec.kind, spec.culprit, spec.launch, seed, job,
                    goal=spec.goal, unit=spec.unit)
    logdir = workdir / job
    logdir.mkdir(parents=True, exist_ok=True)
    server = CorpusServer(root, logdir / "pgdash.db", logdir / "server.log")
    procs: list[subprocess.Popen] = []
    t0 = time.time()
    try:
        try:
            server.start()
        except RuntimeError as exc:
            run.why = f"the server did not start: {exc}"
            return run
        poller = CorpusPoller(server.url, job)
        procs = launch_corpus(spec, root, server.url, job, seed, logdir)
        _watch(spec, run, poller, procs, logdir, poll_s, settle_s, start_timeout)
        run.polls = poller.polls
        _judge(spec, run, poller, logdir)
        if run.status == "ERROR" and not any(n.startswith("---") for n in run.notes):
            run.notes.append(log_tail(logdir, job))
        return run
    except Exception:  # the bench broke: say so, go on with the next script
        run.status, run.why = "ERROR", "bench error"
        run.notes.append(traceback.format_exc())
        return run
    finally:
        codes = stop_tree(procs)
        if not run.exit_codes:
            run.exit_codes = codes
        server.stop()
        run.duration_s = round(time.time() - t0, 1)


def _right(spec: Spec, f: dict[str, Any]) -> bool:
    return f["kind"] in spec.kinds and f["ranks"] == spec.culprit and f["severity"] in LOUD


def stop_job(spec: Spec, run: CorpusRun, procs: list[subprocess.Popen], when: str) -> None:
    """Stop the job as the header says: stop=sigint sends SIGINT to the launcher and every
    rank (Ctrl-C in a terminal), stop=sigterm SIGTERM to every rank."""
    run.stop_t = time.time()
    pids = rank_pids(spec, procs)
    if spec.stop == "sigint":
        send_each([p.pid for p in procs if p.poll() is None] + pids, signal.SIGINT)
    else:
        send_each(pids, signal.SIGTERM)
    run.notes.append(f"sent {spec.stop.upper()} to "
                     f"{'the launcher and ' if spec.stop == 'sigint' else ''}ranks {pids} {when}")


def _watch(spec: Spec, run: CorpusRun, poller: CorpusPoller, procs: list[subprocess.Popen],
           logdir: Path, poll_s: float, settle_s: float, start_timeout: float) -> None:
    """Poll until the run has said what it will say; fills fault/verdict/stop times."""
    launched = time.monotonic()
    exited_at = None
    hard_cap = launched + start_timeout + spec.wait_s + (spec.stop_after or 0) + 120
    while True:
        t_loop = time.monotonic()
        at = poller.poll()
        now_wall = time.time()
        text = read_logs(logdir, run.job)
        if run.fault_t is None:
            m = ANY_FAULT_RE.search(text)
            if m:
                run.fault_t, run.fault_what = float(m.group(1)), m.group(2).strip()
        if at is not None and run.verdict is None and not spec.healthy:
            hits = [f for f in [*poller.findings.values(), *poller.incidents.values()]
                    if _right(spec, f)]
            if hits:
                first = min(hits, key=lambda f: (f["seen_at"], f["first_seen"]))
                run.verdict, run.verdict_t = brief(first), first["seen_at"]
        alive = any(p.poll() is None for p in procs)
        if not alive and exited_at is None:
            exited_at = time.monotonic()
        if time.monotonic() > hard_cap:
            run.notes.append("the bench's hard cap for this script passed")
            return
        if spec.healthy:
            mark = ANY_MARK_RE.search(text) if spec.stop_after is not None else None
            if mark and run.stop_t is None and now_wall - float(mark.group(1)) >= spec.stop_after:
                stop_job(spec, run, procs,
                         f"{now_wall - float(mark.group(1)):.1f} s after its MARK")
            if exited_at is not None and (time.monotonic() - exited_at >= settle_s and
                                          poller.status in ("finished", "failed")
                                          or time.monotonic() - exited_at >= 30):
                return
            if exited_at is None and time.monotonic() - launched > start_timeout + 60:
                run.notes.append("the healthy job did not end in time")
                return
        else:
            if run.fault_t is None:
                if exited_at is not None and time.monotonic() - exited_at > 2:
                    run.notes.append("every process exited before a FAULT line")
                    return
                if time.monotonic() - launched > start_timeout:
                    run.notes.append(f"no FAULT line within {start_timeout:g} s of launch")
                    return
            else:
                since_fault = now_wall - run.fault_t
                if spec.stop_after is not None:
                    if run.stop_t is None and since_fault >= spec.stop_after:
                        stop_job(spec, run, procs, f"{since_fault:.1f} s after the fault")
                    if run.stop_t is not None:
                        if exited_at is not None and time.monotonic() - exited_at >= settle_s + 3:
                            return
                        if time.time() - run.stop_t > 60:
                            run.notes.append("the job did not end within 60 s of the stop")
                            return
                else:
                    # An elastic job (restarts=) is watched to its end: the next attempt
                    # must run clean, and what the restart does to the others counts too.
                    if run.verdict_t is not None and now_wall - run.verdict_t >= settle_s \
                            and not spec.restarts:
                        return
                    if exited_at is not None:  # what the server says after the exits
                        after_exit = time.monotonic() - exited_at
                        if after_exit >= (settle_s if run.verdict_t is not None else 20.0):
                            return
                    if since_fault >= (spec.wait_s if not spec.restarts or run.verdict_t is None
                                       else spec.wait_s + 90):
                        return
        time.sleep(max(0.0, poll_s - (time.monotonic() - t_loop)))


def _judge(spec: Spec, run: CorpusRun, poller: CorpusPoller, logdir: Path) -> None:
    loud = sorted(poller.findings.values(), key=lambda f: f["seen_at"])
    run.loud = [brief(f) for f in loud]
    run.loud_incidents = [brief(f) for f in sorted(poller.incidents.values(),
                                                   key=lambda f: f["seen_at"])]
    # one verdict per finding id (a finding may change severity: count it once)
    by_id: dict[str, dict[str, Any]] = {}
    for f in loud:
        by_id.setdefault(f["id"], f)
        if _right(spec, f):
            by_id[f["id"]] = f
    run.right = sum(1 for f in by_id.values() if _right(spec, f))
    run.wrong = len(by_id) - run.right
    culprit = set(spec.culprit)
    everything = [*loud, *poller.incidents.values()]
    if spec.healthy:
        tolerated = [f for f in everything
                     if f["kind"] in spec.tolerate and f["severity"] == "warning"]
        run.victims = [brief(f) for f in everything if f not in tolerated]
        if tolerated:
            run.notes.append("tolerated: " + ", ".join(sorted({say(f) for f in tolerated})))
    else:
        run.victims = [brief(f) for f in everything if set(f["ranks"]) - culprit]
    text = read_logs(logdir, run.job)
    if spec.healthy:
        bad = [c for c in run.exit_codes if c not in (0, None)]
        live = [p for p in run.exit_codes if p is None]
        if run.notes and any("did not end" in n for n in run.notes):
            run.why = "the healthy job did not end (a corpus defect)"
            return
        if bad or live:
            run.why = f"the healthy job exited {run.exit_codes} (a corpus defect)"
            return
        if run.victims:
            run.status = "FAIL"
            run.why = "said " + ", ".join(sorted({say(f) for f in run.victims}))
        else:
            run.status, run.why = "PASS", "no warning/critical finding"
        return
    if run.fault_t is None:
        run.why = "no FAULT line (the script did not reach its fault: a corpus defect)"
        return
    if spec.restarts and run.exit_codes != [0]:
        run.notes.append(f"the restarted job did not end cleanly: exit {run.exit_codes}")
    if run.verdict_t is not None:
        run.detect_s = round(run.verdict_t - run.fault_t, 2)
        if spec.unit == "steps":
            run.steps = sum(1 for m in ANY_STEP_RE.finditer(text)
                            if run.fault_t <= float(m.group(2)) <= run.verdict_t)
            run.within_goal = run.detect_s >= 0 and run.steps <= (spec.goal or 0)
        else:
            run.within_goal = 0 <= run.detect_s <= (spec.goal or 0)
    others = sorted({say(f) for f in loud if not _right(spec, f)})
    if run.verdict is None:
        run.status = "FAIL"
        run.why = (f"no {spec.kind} blaming {spec.culprit}; said "
                   + (", ".join(others) if others else "nothing loud"))
    else:
        got = (f"{run.verdict['kind']} {run.verdict['ranks']} after "
               + (f"{run.steps} slow steps ({run.detect_s:.1f} s)" if spec.unit == "steps"
                  else f"{run.detect_s:.1f} s"))
        problems = []
        if not run.within_goal:
            problems.append(f"late (goal {spec.goal:g} {spec.unit})")
        if run.victims:
            problems.append("victim blamed: " + ", ".join(sorted({say(f) for f in run.victims})))
        run.status = "FAIL" if problems else "PASS"
        run.why = got + ("; " + "; ".join(problems) if problems else "")
        if others and not run.victims:
            run.notes.append("also said: " + ", ".join(others))


def corpus_table(runs: list[CorpusRun]) -> str:
    import statistics

    lines = ["| class | runs | right verdict | within goal | victim blamed | PASS | median | "
             "max | goal |", "|---|---|---|---|---|---|---|---|---|"]
    by: dict[str, list[CorpusRun]] = {}
    for r in runs:
        by.setdefault(r.cls, []).append(r)
    for cls_, rs in sorted(by.items(), key=lambda kv: (kv[0] == "healthy", kv[0])):
        healthy = rs[0].kind == "none"
        unit = rs[0].unit
        vals = [(r.steps if unit == "steps" else r.detect_s) for r in rs
                if r.verdict is not None]
        vals = [v for v in vals if v is not None]
        med = "-" if not vals else f"{statistics.median(vals):.1f} {unit}"
        mx = "-" if not vals else f"{max(vals):.1f} {unit}"
        goal = "0 loud" if healthy else f"<= {rs[0].goal:g} {unit}"
        right = "-" if healthy else str(sum(1 for r in rs if r.verdict is not None))
        within = "-" if healthy else str(sum(1 for r in rs if r.within_goal))
        victims = sum(1 for r in rs if r.victims)
        errors = sum(1 for r in rs if r.status == "ERROR")
        passed = sum(1 for r in rs if r.status == "PASS")
        lines.append(f"| {cls_} | {len(rs)}{f' ({errors} ERROR)' if errors else ''} | {right} | "
                     f"{within} | {victims} | {passed} | {med} | {mx} | {goal} |")
    valid = [r for r in runs if r.status != "ERROR"]
    right = sum(r.right for r in valid)
    loud = sum(r.right + r.wrong for r in valid)
    faults = [r for r in valid if r.kind != "none"]
    recalled = sum(1 for r in faults if r.within_goal)
    healthy = [r for r in valid if r.kind == "none"]
    lines += ["", f"precision {right}/{loud} = "
              + (f"{right / loud:.2f}" if loud else "-")
              + " (loud findings of the expected kind blaming exactly the culprit / all loud "
              "findings, every run)",
              f"recall    {recalled}/{len(faults)} = "
              + (f"{recalled / len(faults):.2f}" if faults else "-")
              + " (fault runs with the right verdict within the goal / fault runs)",
              f"healthy runs without any warning/critical: "
              f"{sum(1 for r in healthy if not r.victims)}/{len(healthy)}; "
              f"fault runs that blamed a victim: {sum(1 for r in faults if r.victims)}"
              f"/{len(faults)}; ERROR runs (not counted): {len(runs) - len(valid)}"]
    lines += ["", "Per script:"]
    for r in runs:
        expect = "kind=none" if r.kind == "none" else f"kind={r.kind} culprit={r.culprit}"
        lines.append(f"{r.status:5} {r.script} #{r.rep} [{r.cls}, {r.launch}, {expect}]: "
                     f"{r.why}")
    return "\n".join(lines)


def corpus_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="detect.py --corpus",
        description="Run bench/corpus/*.py against pgdash serve (its defaults) and judge the "
                    "verdicts: see the comment above CORPUS_DIR in bench/detect.py.")
    p.add_argument("--only", nargs="+", metavar="NAME", help="scripts to run (file stems)")
    p.add_argument("--repeat", type=int, default=1, help="runs per script (1)")
    p.add_argument("--seed", type=int, default=None, help="base seed (default: time)")
    p.add_argument("--json", type=Path, help="write every run as JSON here")
    p.add_argument("--pgdash-root", type=Path, default=ROOT,
                   help="checkout the server and the agent run from (default: this one)")
    p.add_argument("--corpus-dir", type=Path, default=CORPUS_DIR)
    p.add_argument("--poll", type=float, default=0.2, help="poll period (0.2 s)")
    p.add_argument("--keep", type=Path, help="keep databases and logs in this folder")
    a = p.parse_args(argv)
    root = a.pgdash_root.resolve()
    if not (root / "dashboard").is_dir() or not (root / "agent").is_dir():
        p.error(f"--pgdash-root {root} has no dashboard/ and agent/")
    try:
        specs = corpus_specs(a.corpus_dir, a.only)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    if a.seed is None:
        a.seed = int(time.time()) % 100_000
    tmp = None
    if a.keep:
        a.keep.mkdir(parents=True, exist_ok=True)
        workdir = a.keep
    else:
        tmp = tempfile.TemporaryDirectory(prefix="pgdash-corpus-")
        workdir = Path(tmp.name)
    print(f"corpus: {len(specs)} scripts x {a.repeat}, pgdash from {root}, seed {a.seed}, "
          f"work dir {workdir}", flush=True)
    runs: list[CorpusRun] = []
    try:
        for spec in specs:
            for rep in range(1, a.repeat + 1):
                seed = random.Random(f"{a.seed}-{spec.name}-{rep}").randint(0, 999_999)
                print(f"{spec.name} #{rep} (seed {seed}) ...", flush=True)
                run = run_corpus_script(spec, rep, seed, root, workdir, poll_s=a.poll)
                runs.append(run)
                print(f"  {run.status}: {run.why} [{run.duration_s:.0f} s]", flush=True)
                if run.status == "ERROR":
                    for n in run.notes:
                        print("    " + n.replace("\n", "\n    "), flush=True)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        if tmp is not None:
            tmp.cleanup()
    print()
    print(corpus_table(runs))
    if a.json:
        a.json.write_text(json.dumps([asdict(r) for r in runs], indent=1, default=str))
    broke = any(r.why == "bench error" or r.why.startswith("the server did not start")
                for r in runs)
    return 1 if broke or len(runs) < len(specs) * a.repeat else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--corpus" in argv:
        return corpus_main([x for x in argv if x != "--corpus"])
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
