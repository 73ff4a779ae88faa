"""The rule table and the run of it: ``diagnose(state, now)`` gives the findings active at ``now``.

Each rule is one pure function ``(state, now, settings) -> findings``, grouped by area in this
package. Each finding's ``first_seen`` is derived from the state (when the evidence became
conclusive), so folding a stored log up to ``t`` gives the findings live mode showed at ``t``.

An area too big for one module keeps its rules' entry points in the area's module (only those
are registered in ``RULES``) and what they stand on beside it, imported one way: ``hangs`` on
``stalls``, ``p2p`` and ``waits`` (who waits where); ``stragglers`` on ``straggler_chains``,
``straggler_verdict`` and ``windows`` (the latency summaries and their arithmetic).
"""

from __future__ import annotations

import collections
import sys
import traceback
from typing import Callable

from dashboard.diagnosis.core import SEVERITY_ORDER, Finding, Settings
from dashboard.diagnosis.rules.crash import rank_failed, rank_lost
from dashboard.diagnosis.rules.departures import rank_exited_early
from dashboard.diagnosis.rules.desync import desync
from dashboard.diagnosis.rules.gpu import gpu_fault, gpu_throttle
from dashboard.diagnosis.rules.hangs import hang, stall
from dashboard.diagnosis.rules.idle import exit_held, idle
from dashboard.diagnosis.rules.rendezvous import (RENDEZVOUS_KEYS, config_mismatch, init_failed,
                                                  init_incomplete)
from dashboard.diagnosis.rules.stragglers import slow_collective, straggler
from dashboard.state import JobState

RULES: list[Callable[[JobState, float, Settings], list[Finding]]] = [
    init_incomplete, init_failed, config_mismatch, rank_lost, rank_failed, rank_exited_early,
    hang, stall, idle, exit_held, desync,
    straggler, slow_collective, gpu_fault, gpu_throttle,
]


# Rules that raised, by name: /metrics exports them (pgdash_rule_errors_total). A rule that
# raises is a defect of pgdash; the job's other rules still judge, and its events are stored.
RULE_ERRORS: collections.Counter[str] = collections.Counter()


def diagnose(state: JobState, now: float, settings: Settings = Settings()) -> list[Finding]:
    """Findings active at ``now``, most severe first."""
    found: list[Finding] = []
    for rule in RULES:
        try:
            found.extend(f for f in rule(state, now, settings) if f["first_seen"] <= now)
        except Exception:
            RULE_ERRORS[rule.__name__] += 1
            if RULE_ERRORS[rule.__name__] in (1, 100, 10_000):  # the first, then rarely
                print(f"pgdash: rule {rule.__name__} failed (job {state.job_id}; "
                      f"{RULE_ERRORS[rule.__name__]} time(s)), its findings left out; please "
                      f"report this:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
    desyncs = {f["group"] for f in found if f["kind"] == "desync"}
    # Ranks a size mismatch ended (gloo aborted them, or they failed on what they received)
    # are the desync's consequences.
    ended = {r for f in found if f["kind"] == "desync"
             for r in f["evidence"].get("consequences") or ()}
    # A rank that vanished inside its own odd collective (gloo aborted the rank it sent to
    # less than it expected) is the desync's rank: the desync says why it went (also when it
    # went with its consequences: "ranks 1, 2 vanished together").
    odd = ended | {r for f in found if f["kind"] == "desync" for r in f["ranks"]}
    found = [f for f in found if not (f["kind"] in ("rank_lost", "rank_failed")
                                      and f["ranks"] and set(f["ranks"]) <= ended)
             and not (f["kind"] == "rank_lost" and f["ranks"] and set(f["ranks"]) <= odd)]
    # A mismatched collective usually hangs every rank of its group on gloo: say desync, not
    # hang (whichever view's sequence number the hang was seen at).
    found = [f for f in found if not (f["kind"] in ("hang", "stall") and f["group"] in desyncs)]
    # Ranks that disagree on the rendezvous's own settings (world size, master address) never
    # finish init_process_group, nor do the peers left waiting for them there: the mismatch is
    # the verdict, not a stall of whoever is still inside init.
    if any(f["kind"] == "config_mismatch" and f["evidence"]["key"] in RENDEZVOUS_KEYS
           for f in found):
        in_init = {state.sessions[sess].rank for sess, e in state.current_init().items()
                   if not e.get("done_at") and not e.get("error")}
        found = [f for f in found if not (f["kind"] in ("hang", "stall")
                                          and set(f["ranks"]) <= in_init)]
    for f in found:
        f["last_seen"] = now
        # Each attempt of a restarted job has its own findings: attempt 0's keep their ids.
        f["attempt"] = state.attempt
        if state.attempt:
            f["id"] += f"@{state.attempt}"
    return sorted(found, key=lambda f: (SEVERITY_ORDER[f["severity"]], -f["first_seen"]))
