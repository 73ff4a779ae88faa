"""Hand-made event logs for the pure tests: StoredEvent dicts in log order, and the
hello, progress and latency-summary events a rank would send."""


from dashboard.state import JobState


class Log:
    """Builds StoredEvent dicts in log order."""

    def __init__(self):
        self.events = []

    def add(self, session, kind, body, t, seq=None):
        self.events.append({"id": len(self.events) + 1, "session": session, "seq": seq, "t": t,
                            "received_at": t, "kind": kind, "body": body})
        return self

    def state(self):
        return JobState(1, "job").apply_all(self.events)


def hello(rank, world=2, host="node0", backend=None):
    return {"job": "job", "rank": rank, "world_size": world, "host": host, "pid": 100 + rank,
            "local_rank": rank, "device": "cpu", "backend": backend}


def running(world, groups=(("0", None),), t=100.0, host="node0"):
    """``world`` ranks initialised at ``t``, members of ``groups`` [(name, ranks or None)]."""
    log = Log()
    for r in range(world):
        s = f"s{r}"
        log.add(s, "hello", hello(r, world=world, host=host), t=t)
        log.add(s, "init_start", {"rank": r, "world_size": world}, t=t)
        log.add(s, "init_done", {"rank": r, "world_size": world, "backend": "gloo",
                                 "duration_s": 0.1}, t=t)
        for name, members in groups:
            members = list(range(world)) if members is None else members
            if r in members:
                log.add(s, "group", {"name": name, "ranks": members}, t=t)
    return log


def progress(log, rank, t, *rows):
    """rows: (group, entered, completed, inflight_op, since[, dtype, bytes])."""
    groups = []
    for row in rows:
        g, entered, completed, op, since = row[:5]
        entry = {"group": g, "entered": entered, "completed": completed, "inflight_op": op,
                 "inflight_since": since}
        if op:
            entry["inflight_dtype"], entry["inflight_bytes"] = (row[5:7] or ("float32", 16))
        groups.append(entry)
    log.add(f"s{rank}", "heartbeat", {"groups": groups}, t=t)


def kinds(found):
    return [(f["kind"], f["ranks"]) for f in found]


def intervals(log, rank, group, waits_ms, start=101.0, per=20):
    """One coll_stats per second for ``rank``: ``per`` collectives waiting ``waits_ms`` each."""
    from pgdash_agent.wire import hist_bucket

    for i, ms in enumerate(waits_ms):
        us = ms * 1000
        log.add(f"s{rank}", "coll_stats", {"start": start + i - 1, "end": start + i, "rows": [
            {"group": group, "op": "all_reduce", "count": per, "bytes": 16 * per,
             "sum_us": us * per, "max_us": us, "hist": [[hist_bucket(us), per]]}]},
            t=start + i)


def half_seconds(log, rank, waits_ms, start=101.0, group="0"):
    """One coll_stats per half second (PGDASH_STATS_INTERVAL_S) for ``rank`` on ``group``;
    ``waits_ms``: per summary, the wait of each of its collectives (a list, so that a
    summary can mix)."""
    from pgdash_agent.wire import hist_bucket

    for i, waits in enumerate(waits_ms):
        hist: dict[int, int] = {}
        for ms in waits:
            hist[hist_bucket(ms * 1000)] = hist.get(hist_bucket(ms * 1000), 0) + 1
        end = start + 0.5 * i
        log.add(f"s{rank}", "coll_stats", {"start": end - 0.5, "end": end, "rows": [
            {"group": group, "op": "all_reduce", "count": len(waits), "bytes": 16 * len(waits),
             "sum_us": 1000.0 * sum(waits), "max_us": 1000.0 * max(waits),
             "hist": sorted(hist.items())}]}, t=end)
