"""Prometheus text exposition of what the server knows: jobs, ranks, findings, ingest counters.

Exported from state at scrape time (no hot-path counters beyond Ingest's own), so ranks of a
job that ended do not linger as stale series. Raw GPU gauges are left to dcgm-exporter; pgdash
exports the training-level signals it alone sees.
"""

from __future__ import annotations

from typing import Any, Iterable

from dashboard.incidents import incidents


def _escape(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _series(name: str, labels: dict[str, Any], value: float) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    number = str(value) if isinstance(value, int) else repr(float(value))  # full precision
    return f"{name}{{{inner}}} {number}" if inner else f"{name} {number}"


def exposition(jobs: list[dict[str, Any]], live: Iterable[tuple[dict[str, Any], list, list]],
               counters: dict[str, int], commits: int, write_errors: int) -> str:
    """The /metrics page.

    Args:
        jobs: rows of the jobs table (id, name, status, ...).
        live: for each job held in memory: (its summary, its ranks' detail rows, its findings).
        counters: Ingest's counters (stored_events, duplicate_events, rejected_events, ...).
    """
    lines = ["# HELP pgdash_jobs Jobs known to this server, by status.", "# TYPE pgdash_jobs gauge"]
    by_status: dict[str, int] = {}
    for job in jobs:
        by_status[job["status"]] = by_status.get(job["status"], 0) + 1
    for status in ("initializing", "running", "finished", "failed"):
        lines.append(_series("pgdash_jobs", {"status": status}, by_status.get(status, 0)))
    lines += ["# HELP pgdash_ingest_events_total Agent events by what became of them.",
              "# TYPE pgdash_ingest_events_total counter"]
    for result in ("stored", "duplicate", "rejected"):
        lines.append(_series("pgdash_ingest_events_total", {"result": result},
                             counters.get(f"{result}_events", 0)))
    lines += ["# HELP pgdash_ingest_refused_total Batches and connections refused.",
              "# TYPE pgdash_ingest_refused_total counter",
              _series("pgdash_ingest_refused_total", {"what": "batch"},
                      counters.get("rejected_batches", 0)),
              _series("pgdash_ingest_refused_total", {"what": "connection"},
                      counters.get("refused_connections", 0)),
              "# HELP pgdash_store_commits_total Transactions committed by the writer.",
              "# TYPE pgdash_store_commits_total counter",
              _series("pgdash_store_commits_total", {}, commits),
              "# HELP pgdash_store_write_errors_total Transactions that failed.",
              "# TYPE pgdash_store_write_errors_total counter",
              _series("pgdash_store_write_errors_total", {}, write_errors)]
    seen = ["# HELP pgdash_rank_last_seen_timestamp_seconds When each rank of a live job was "
            "last heard from.", "# TYPE pgdash_rank_last_seen_timestamp_seconds gauge"]
    found = ["# HELP pgdash_findings_active Active findings per job, kind and severity.",
             "# TYPE pgdash_findings_active gauge"]
    for job, ranks, findings in live:
        if job["status"] in ("running", "initializing"):
            for r in ranks:
                seen.append(_series("pgdash_rank_last_seen_timestamp_seconds",
                                    {"job": job["name"], "rank": r["rank"]}, r["last_seen"]))
        active: dict[tuple[str, str], int] = {}
        for f in findings:
            if f["active"]:
                key = (f["kind"], f["severity"])
                active[key] = active.get(key, 0) + 1
        for (kind, severity), n in sorted(active.items()):
            found.append(_series("pgdash_findings_active",
                                 {"job": job["name"], "kind": kind, "severity": severity}, n))
    incs = ["# HELP pgdash_incidents_active Active incidents (findings grouped by root cause) "
            "per job and severity.", "# TYPE pgdash_incidents_active gauge"]
    for job, _ranks, findings in live:
        per: dict[str, int] = {"critical": 0, "warning": 0}
        for inc in incidents(findings):
            if inc["active"] and inc["severity"] in per:
                per[inc["severity"]] += 1
        for severity, n in per.items():
            incs.append(_series("pgdash_incidents_active",
                                {"job": job["name"], "severity": severity}, n))
    notify = ["# HELP pgdash_notify_total Incident notifications (--notify) by outcome.",
              "# TYPE pgdash_notify_total counter"]
    for outcome in ("sent", "retried", "failed", "dropped"):
        notify.append(_series("pgdash_notify_total", {"outcome": outcome},
                              counters.get(f"notify_{outcome}", 0)))
    return "\n".join(lines + seen + found + incs + notify) + "\n"
