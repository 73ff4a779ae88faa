"""Prometheus text exposition of what the server knows: jobs, ranks, findings, ingest counters.

Exported from state at scrape time (no hot-path counters beyond Ingest's own), so ranks of a
job that ended do not linger as stale series. Raw GPU gauges are left to dcgm-exporter; pgdash
exports the training-level signals it alone sees.
"""

from __future__ import annotations

from typing import Any, Iterable


def _escape(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _series(name: str, labels: dict[str, Any], value: float) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    number = str(value) if isinstance(value, int) else repr(float(value))  # full precision
    return f"{name}{{{inner}}} {number}" if inner else f"{name} {number}"


def exposition(jobs: list[dict[str, Any]], live: Iterable[tuple[dict[str, Any], list, list]],
               counters: dict[str, int], commits: int, write_errors: int,
               ops: Iterable[tuple[dict[str, Any], list[dict[str, Any]]]] = ()) -> str:
    """The /metrics page.

    Args:
        jobs: rows of the jobs table (id, name, status, ...).
        live: for each job held in memory: (its summary, its ranks' detail rows, its findings).
        counters: Ingest's counters (stored_events, duplicate_events, rejected_events, ...).
        ops: for each job held in memory: (its summary, its collectives per group family, op
            and source, as ``JobState.op_rows``).
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
    return "\n".join(lines + seen + found + _collective_series(ops)) + "\n"


def _collective_series(ops: Iterable[tuple[dict[str, Any], list[dict[str, Any]]]]) -> list[str]:
    """Per job, group family, op and source ("wrapper": Python-issued, "flight_recorder":
    issued from C++): collectives, bytes and latency quantiles over the whole job."""
    count = ["# HELP pgdash_collectives_total Collectives per job, group family, op and source.",
             "# TYPE pgdash_collectives_total counter"]
    size = ["# HELP pgdash_collective_bytes_total Bytes handed to collectives, likewise.",
            "# TYPE pgdash_collective_bytes_total counter"]
    latency = ["# HELP pgdash_collective_latency_microseconds Latency quantiles over the job "
               "(flight_recorder rows on gloo are exact to the agent's poll gap).",
               "# TYPE pgdash_collective_latency_microseconds gauge"]
    for job, rows in ops:
        for row in rows:
            labels = {"job": job["name"], "family": row["family"], "op": row["op"],
                      "source": row.get("source", "wrapper")}
            count.append(_series("pgdash_collectives_total", labels, row["count"]))
            size.append(_series("pgdash_collective_bytes_total", labels, row["bytes"]))
            for quantile, key in (("0.5", "p50_us"), ("0.99", "p99_us")):
                if row.get(key) is not None:
                    latency.append(_series("pgdash_collective_latency_microseconds",
                                           {**labels, "quantile": quantile}, row[key]))
    return count + size + latency
