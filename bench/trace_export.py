"""Trace export cost: a simulated job's log built into Chrome-trace JSON, against the server's
own fold of the same log (JobState) as the reference, in the same run.

    python -m bench.trace_export [--ranks 64] [--seconds 600] [--max-events 1000000]

Each rank sends what a real agent sends at the default 1 s interval: a heartbeat and a latency
summary per second (one group, two ops); every 10 s a collective is caught in flight for 0.3 s
more. Prints events in, trace events out, seconds, and the JSON size.
"""

from __future__ import annotations

import argparse
import time

from dashboard.state import JobState
from dashboard.history.trace import build_trace, json_chunks


def simulated_log(ranks: int, seconds: int) -> list[dict]:
    events: list[dict] = []

    def ev(session: str, t: float, kind: str, body: dict) -> None:
        events.append({"id": len(events) + 1, "session": session, "seq": None, "t": t,
                       "received_at": t, "kind": kind, "body": body})

    t0 = 1_764_000_000.0
    for r in range(ranks):
        s = f"s{r}"
        ev(s, t0, "connect", {"rank": r, "host": f"node{r // 8}"})
        ev(s, t0, "hello", {"job": "bench", "rank": r, "world_size": ranks,
                            "host": f"node{r // 8}", "pid": 1000 + r, "backend": "gloo"})
        ev(s, t0, "group", {"name": "0", "desc": "default_pg", "ranks": list(range(ranks))})
    entered = 0
    for sec in range(1, seconds + 1):
        t = t0 + sec
        entered += 50
        for r in range(ranks):
            s = f"s{r}"
            ev(s, t, "coll_stats", {"start": t - 1, "end": t, "rows": [
                {"group": "0", "op": op, "count": 25, "bytes": 25 * 4096,
                 "sum_us": 25 * 900.0, "max_us": 2500.0, "hist": [[76, 20], [90, 5]]}
                for op in ("all_reduce", "all_gather")]})
            busy = sec % 10 == 0
            ev(s, t + 0.001, "heartbeat", {"groups": [{
                "group": "0", "entered": entered + busy, "completed": entered,
                "inflight_op": "all_reduce" if busy else None,
                "inflight_since": t - 0.2 if busy else None}]})
    for r in range(ranks):
        ev(f"s{r}", t0 + seconds + 1, "exit", {"clean": True})
    return events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--max-events", type=int, default=1_000_000)
    args = parser.parse_args()
    log = simulated_log(args.ranks, args.seconds)

    started = time.perf_counter()
    JobState(1, "bench").apply_all(log)
    fold_s = time.perf_counter() - started

    started = time.perf_counter()
    trace = build_trace(log, job={"name": "bench"}, max_events=args.max_events)
    build_s = time.perf_counter() - started
    started = time.perf_counter()
    size = sum(len(chunk) for chunk in json_chunks(trace))
    write_s = time.perf_counter() - started

    meta = trace["metadata"]
    print(f"log: {len(log):,} events ({args.ranks} ranks x {args.seconds} s)")
    print(f"reference, JobState fold of the log: {fold_s:.2f} s")
    print(f"trace build: {build_s:.2f} s ({build_s / fold_s:.1f}x the fold); "
          f"JSON out: {write_s:.2f} s, {size / 2**20:.1f} MiB")
    print(f"trace: {meta['events']:,} events + {meta['names']:,} names; "
          f"cut: {meta['cut'] or 'none'}")


if __name__ == "__main__":
    main()
