"""Prometheus exposition of what the server knows: jobs, ranks, collectives, findings, ingest.

Written by ``prometheus-client`` from state at scrape time (a custom collector: no hot-path
counters beyond Ingest's own), so ranks of a job that ended do not linger as stale series.
Label sets stay small at any scale: per job, group family, op, state or kind, never per rank
unless ``PGDASH_METRICS_PER_RANK`` asks for it. Raw GPU gauges are left to dcgm-exporter;
pgdash exports the training-level signals it alone sees.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, NamedTuple

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)

from pgdash_agent.wire import HIST_BUCKETS_PER_OCTAVE
from dashboard.diagnosis.incidents import incidents
from dashboard.ingest.pipeline import Ingest
from dashboard.statuses import JobStatus, RankStatus
from dashboard.web import views

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
RANK_STATUSES = tuple(str(s) for s in RankStatus)
JOB_STATUSES = tuple(str(s) for s in JobStatus)
# Upper bounds (seconds) of the exported latency histograms: collectives take microseconds
# (a barrier on one host) to minutes (a hang).
LATENCY_BOUNDS_S = (1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0,
                    120.0)


class LiveJob(NamedTuple):
    """What /metrics reads of one job held in memory."""

    summary: dict[str, Any]
    ranks: list[dict[str, Any]]  # rank rows of the API (status, last_seen, dropped)
    findings: list[dict[str, Any]]
    ops: list[dict[str, Any]]  # per group family, op and source: bytes, sum_us, histogram


def live_jobs(ingest: Ingest) -> list[LiveJob]:
    """What /metrics exports of every job held in memory."""
    return ingest.each_held(lambda job_id, state, findings: LiveJob(
        state.summary(), views.rank_rows(state), findings,
        [{"family": family, "op": op, "source": source, "hist": dict(stats.hist),
          "sum_us": stats.sum_us, "bytes": stats.bytes}
         for (family, op, source), (stats, _, _) in state.op_stats().items()]))


@dataclasses.dataclass
class Snapshot:
    """Everything one scrape exports, read from Ingest and the store under their own locks."""

    jobs: list[dict[str, Any]]
    live: list[LiveJob]
    counters: dict[str, int]
    commits: int
    write_errors: int
    lag_s: float = 0.0
    agent_connections: int = 0
    per_rank: bool = False
    host_readers: int = 0
    host_relays: int = 0


def _bucket_upper_s(index: int) -> float:
    """Upper edge, in seconds, of the agents' latency histogram bucket ``index``."""
    return 2.0 ** ((index + 1) / HIST_BUCKETS_PER_OCTAVE) / 1e6


def latency_buckets(hist: dict[int, int]) -> list[tuple[str, int]]:
    """The agents' ~9%-wide buckets folded into LATENCY_BOUNDS_S, cumulative, with +Inf."""
    counts = [0] * (len(LATENCY_BOUNDS_S) + 1)
    for index, n in hist.items():
        upper = _bucket_upper_s(index)
        slot = next((i for i, bound in enumerate(LATENCY_BOUNDS_S) if upper <= bound),
                    len(LATENCY_BOUNDS_S))
        counts[slot] += n
    out, total = [], 0
    for bound, n in zip((*(repr(b) for b in LATENCY_BOUNDS_S), "+Inf"), counts):
        total += n
        out.append((bound, total))
    return out


class _Collector:
    def __init__(self, snap: Snapshot):
        self.snap = snap

    def collect(self) -> Iterable[Any]:
        s = self.snap
        jobs = GaugeMetricFamily("pgdash_jobs", "Jobs known to this server, by status.",
                                 labels=["status"])
        by_status: dict[str, int] = {}
        for job in s.jobs:
            by_status[job["status"]] = by_status.get(job["status"], 0) + 1
        for status in JOB_STATUSES:
            jobs.add_metric([status], by_status.get(status, 0))
        yield jobs

        events = CounterMetricFamily("pgdash_ingest_events", "Agent events by what became of "
                                     "them.", labels=["result"])
        for result in ("stored", "duplicate", "rejected"):
            events.add_metric([result], s.counters.get(f"{result}_events", 0))
        yield events
        refused = CounterMetricFamily("pgdash_ingest_refused", "Batches and connections "
                                      "refused.",
                                      labels=["what"])
        # Refused with retry (rate_limited, held_back, write_failed, overloaded, still_queued):
        # the agent keeps the batch and sends it again later.
        for what, key in (("batch", "rejected_batches"), ("connection", "refused_connections"),
                          ("overloaded", "overloaded_batches"),
                          ("rate_limited", "rate_limited_batches"),
                          ("held_back", "held_batches"), ("write_failed", "failed_writes"),
                          ("still_queued", "v1_acks_deferred"),
                          ("reading", "rejected_readings")):  # a host reader's
            refused.add_metric([what], s.counters.get(key, 0))
        yield refused
        received = CounterMetricFamily("pgdash_ingest_received_bytes", "Bytes of agent "
                                       "frames received on the compact path (v2).")
        received.add_metric([], s.counters.get("received_bytes", 0))
        yield received
        batches = CounterMetricFamily("pgdash_ingest_batches", "Agent batches received, by "
                                      "protocol.", labels=["protocol"])
        for protocol in ("v1", "v2"):
            batches.add_metric([protocol], s.counters.get(f"batches_{protocol}", 0))
        yield batches
        lag = GaugeMetricFamily("pgdash_ingest_lag_seconds", "How far behind the agents the "
                                "server's ingest is; live verdicts are judged that far back, "
                                "so its lag is never blamed on a rank.")
        lag.add_metric([], round(s.lag_s, 3))
        yield lag
        conns = GaugeMetricFamily("pgdash_agent_connections", "Open agent connections on the "
                                  "compact path (v2).")
        conns.add_metric([], s.agent_connections)
        yield conns
        readers = GaugeMetricFamily("pgdash_host_readers", "Open host reader connections "
                                    "(pgdash_agent.reader: they read a host's blocked ranks).")
        readers.add_metric([], s.host_readers)
        yield readers
        relays = GaugeMetricFamily("pgdash_host_relays", "Open host relay connections "
                                   "(pgdash_agent.relay: each carries its host's agents; they "
                                   "count among pgdash_agent_connections).")
        relays.add_metric([], s.host_relays)
        yield relays
        relayed = GaugeMetricFamily("pgdash_relayed_agents", "Agent connections carried by "
                                    "host relays (of pgdash_agent_connections).")
        relayed.add_metric([], s.counters.get("relayed_agents", 0))
        yield relayed
        commits = CounterMetricFamily("pgdash_store_commits", "Transactions committed by the "
                                      "writer.")
        commits.add_metric([], s.commits)
        yield commits
        errors = CounterMetricFamily("pgdash_store_write_errors", "Transactions that failed.")
        errors.add_metric([], s.write_errors)
        yield errors

        ranks = GaugeMetricFamily("pgdash_ranks", "Ranks of each job held in memory, by "
                                  "state.", labels=["job", "state"])
        dropped = CounterMetricFamily("pgdash_agent_dropped_events", "Events the job's "
                                      "agents had to drop (buffer full), by kind.",
                                      labels=["job", "kind"])
        found = GaugeMetricFamily("pgdash_findings_active", "Active findings per job, kind and "
                                  "severity.", labels=["job", "kind", "severity"])
        latency = HistogramMetricFamily("pgdash_collective_latency_seconds", "Time inside "
                                        "collectives, per job, group family (mesh_tp, "
                                        "default_pg, ...), op and source, all ranks merged "
                                        "(source flight_recorder: issued from C++, on gloo "
                                        "exact only to the agent's poll gap).",
                                        labels=["job", "family", "op", "source"])
        moved = CounterMetricFamily("pgdash_collective_bytes", "Bytes handed to collectives, "
                                    "likewise.", labels=["job", "family", "op", "source"])
        incs = GaugeMetricFamily("pgdash_incidents_active", "Active incidents (findings "
                                 "grouped by root cause) per job and severity.",
                                 labels=["job", "severity"])
        seen = GaugeMetricFamily("pgdash_rank_last_seen_timestamp_seconds", "When each rank of "
                                 "a live job was last heard from (PGDASH_METRICS_PER_RANK=1).",
                                 labels=["job", "rank"])
        for job in s.live:
            name = job.summary["name"]
            states: dict[str, int] = {}
            drops: dict[str, int] = {}
            for r in job.ranks:
                states[r["status"]] = states.get(r["status"], 0) + 1
                for kind, n in (r.get("dropped") or {}).items():
                    drops[kind] = drops.get(kind, 0) + n
            for state in RANK_STATUSES:
                ranks.add_metric([name, state], states.get(state, 0))
            for kind, n in sorted(drops.items()):
                dropped.add_metric([name, kind], n)
            active: dict[tuple[str, str], int] = {}
            for f in job.findings:
                if f["active"]:
                    key = (f["kind"], f["severity"])
                    active[key] = active.get(key, 0) + 1
            for (kind, severity), n in sorted(active.items()):
                found.add_metric([name, kind, severity], n)
            per = {"critical": 0, "warning": 0}
            for inc in incidents(job.findings):
                if inc["active"] and inc["severity"] in per:
                    per[inc["severity"]] += 1
            for severity, n in per.items():
                incs.add_metric([name, severity], n)
            for row in job.ops:
                labels = [name, row["family"], row["op"], row["source"]]
                latency.add_metric(labels, latency_buckets(row["hist"]), row["sum_us"] / 1e6)
                moved.add_metric(labels, row["bytes"])
            if s.per_rank and job.summary["status"] in ("running", "initializing"):
                for r in job.ranks:
                    seen.add_metric([name, str(r["rank"])], r["last_seen"])
        yield from (ranks, dropped, found, incs, latency, moved)
        notify = CounterMetricFamily("pgdash_notify", "Incident notifications (--notify) by "
                                     "outcome.", labels=["outcome"])
        for outcome in ("sent", "retried", "failed", "dropped"):
            notify.add_metric([outcome], s.counters.get(f"notify_{outcome}", 0))
        yield notify
        frames = CounterMetricFamily("pgdash_keyframes", "The page's answers stored at grid "
                                     "moments (PGDASH_KEYFRAME_S), by outcome: made, skipped (a "
                                     "live moment judged past, or over the writer's budget: a "
                                     "scrub stores it), failed (not rendered or "
                                     "stored).", labels=["outcome"])
        for outcome in ("made", "skipped", "failed"):
            frames.add_metric([outcome], s.counters.get(f"keyframes_{outcome}", 0))
        yield frames
        marks = CounterMetricFamily("pgdash_incident_marks_prepared", "Incident marks whose "
                                    "keyframes a second apart the server stored in the "
                                    "background (as a job ended, or as the page opened it).")
        marks.add_metric([], s.counters.get("incident_marks_prepared", 0))
        yield marks
        preparing = GaugeMetricFamily("pgdash_incident_frames_jobs", "Ended jobs whose "
                                      "incidents the server is preparing, or will.")
        preparing.add_metric([], s.counters.get("incident_frames_jobs", 0))
        yield preparing
        rules = CounterMetricFamily("pgdash_rule_errors", "Diagnosis rules that raised, by rule "
                                    "(a defect of pgdash: that rule's findings were left out, "
                                    "the others and the events kept; the server's log has the "
                                    "traceback).", labels=["rule"])
        for key, n in sorted(s.counters.items()):
            if key.startswith("rule_errors:"):
                rules.add_metric([key.split(":", 1)[1]], n)
        yield rules
        login = CounterMetricFamily("pgdash_login_attempts", "Token attempts on the pages, API "
                                    "and /ui (--token), by outcome: failed (a wrong token or "
                                    "cookie), refused (429: its address is past "
                                    "PGDASH_LOGIN_MAX_FAILURES), evicted (an address forgotten "
                                    "past PGDASH_LOGIN_MAX_ADDRESSES).", labels=["outcome"])
        for outcome, key in (("failed", "login_failures"), ("refused", "login_refused"),
                             ("evicted", "login_evicted")):
            login.add_metric([outcome], s.counters.get(key, 0))
        yield login
        addresses = GaugeMetricFamily("pgdash_login_addresses", "Client addresses with failed "
                                      "token attempts remembered (bounded by "
                                      "PGDASH_LOGIN_MAX_ADDRESSES).")
        addresses.add_metric([], s.counters.get("login_addresses", 0))
        yield addresses
        if s.per_rank:
            yield seen


def exposition(snap: Snapshot) -> str:
    """The /metrics page for one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(snap))
    return generate_latest(registry).decode()
