"""A simulated job's log for the storage tests: its events, stored through the writer, folded
and viewed as the page would."""

import random


from dashboard.state import JobState
from dashboard.storage.compaction import Policy
from dashboard.storage.store import Store
from dashboard.web import timeline, views


T0 = 1_780_000_000.0


RANKS = 4


def _job_events(seconds: int, *, hang: tuple[float, float] | None = None,
                exit_rank_at: float | None = None, seed: int = 3) -> list[dict]:
    """What RANKS agents send over ``seconds`` (arrival times included): a start, then per
    second a heartbeat, a latency summary and a GPU reading; rank 1 throttles for a while,
    rank 2 reports an XID once; optionally a hang of rank 0 and an early exit of rank 3."""
    rng = random.Random(seed)
    out, seq = [], {r: 0 for r in range(RANKS)}

    def add(rank: int, t: float, kind: str, body: dict) -> None:
        seq[rank] += 1
        out.append({"session": f"s{rank}", "seq": seq[rank], "t": t, "received_at": t + 0.01,
                    "kind": kind, "body": body})

    for r in range(RANKS):
        add(r, T0 + r * 0.001, "hello", {"job": "j", "rank": r, "world_size": RANKS,
                                        "host": "h", "pid": 100 + r, "backend": "gloo"})
        add(r, T0 + 0.1 + r * 0.001, "group", {"name": "0", "desc": "default_pg",
                                              "backend": "gloo", "ranks": list(range(RANKS))})
    for s in range(1, seconds):
        for r in range(RANKS):
            t = T0 + s + r * 0.01
            if exit_rank_at is not None and r == 3 and t >= exit_rank_at:
                if t - 1 < exit_rank_at:
                    add(r, t, "exit", {"clean": True, "code": 0})
                continue
            hung = hang is not None and hang[0] <= t < hang[1]
            add(r, t, "heartbeat", {"groups": [{
                "group": "0", "entered": s * 10 + (1 if hung and r else 0),
                "completed": s * 10, "inflight_op": "all_reduce" if hung and r else None,
                "inflight_since": hang[0] if hung and r else None}],
                "dropped": {"coll_stats": s // 500}, "buffered": 0})
            if not hung:
                add(r, t, "coll_stats", {"start": t - 1, "end": t, "rows": [
                    {"group": "0", "op": op, "count": 10, "bytes": 4096 * 10,
                     "sum_us": 10 * rng.uniform(50, 150), "max_us": rng.uniform(150, 900),
                     "hist": [[70 + rng.randrange(6), 4], [80 + rng.randrange(3), 6]]}
                    for op in ("all_reduce", "broadcast")]})
            throttled = r == 1 and 400 <= s < 460
            add(r, t, "gpu", {"uuid": f"GPU-{r}", "name": "H200", "lost": False,
                              "reasons": ["hw_slowdown"] if throttled else [],
                              "xids": [79] if r == 2 and s == 300 else [],
                              "values": {"util_gpu": rng.uniform(80, 100), "mem_used": 1e9,
                                         "temp_c": 60.0, "power_w": 500.0}})
    out.sort(key=lambda e: e["received_at"])
    for i, ev in enumerate(out, 1):
        ev["id"] = i
    return out


def _views(state: JobState) -> dict:
    """What the page and diagnosis read of a state, beyond the fold's short windows."""
    return {"summary": state.summary(), "ranks": views.rank_rows(state),
            "collectives": views.collective_rows(state), "progress": views.progress_rows(state),
            "gpus": views.gpu_rows(state), "errors": views.error_rows(state),
            "faults": state.gpu_faults, "throttled": state.throttled_since,
            "groups": views.group_rows(state), "timeline": timeline.timeline_grid(state),
            "recent": state.recent.windows(),
            "gpu_history": {k: list(v) for k, v in state.gpu_history.items()}}


def _fold(events: list[dict], upto: float | None = None) -> JobState:
    return JobState(1, "j").apply_all(ev for ev in events
                                      if upto is None or ev["received_at"] <= upto)


def _store_job(store: Store, events: list[dict]) -> int:
    def write(conn) -> int:
        job_id = store.jobs.create(conn, "j", T0)
        for r in range(RANKS):
            store.sessions.create(conn, f"s{r}", job_id, r, "h", 100 + r, T0)
        store.log.insert_archived(conn, job_id, events)
        return job_id
    return store.writer.submit(write)


def insert_old_job(conn) -> None:
    """Job 1 and its RANKS sessions s0, s1, ... as an older pgdash wrote them (raw SQL)."""
    conn.exec_driver_sql("INSERT INTO jobs (id, name, created_at, status) "
                         "VALUES (1, 'j', 0, 'running')")
    for r in range(RANKS):
        conn.exec_driver_sql("INSERT INTO sessions (id, job_id, rank, first_seen) "
                             f"VALUES ('s{r}', 1, {r}, 0)")


# Every cell older than a minute packed, nothing thinned: the whole log at full resolution.
FULL = Policy(keep_full_s=3600, pack_after_s=60)


def _send_live(ingest, clock: list[float], events: list[dict], job: str,
               offset: float = 0.5) -> int:
    """``events`` (of :func:`_job_events`) sent through the live path as RANKS agents of
    job ``job``, a second's events at a time, ``clock[0]`` ``offset`` past each second; the
    job's id."""
    sessions = []
    for r in range(RANKS):
        session, job_id = ingest.connect({"v": 1, "session": f"{job}{r}", "job": job,
                                          "rank": r, "host": "h", "pid": 1})
        sessions.append(session)
    seq = {s: 0 for s in sessions}
    by_second: dict[int, list[dict]] = {}
    for ev in events:
        by_second.setdefault(int(ev["received_at"] - T0), []).append(ev)
    for second, evs in sorted(by_second.items()):
        clock[0] = T0 + second + offset
        for ev in evs:
            session = sessions[int(ev["session"][1:])]
            seq[session] += 1
            ack = ingest.batch(session, job_id, {"v": 1, "events": [
                {"seq": seq[session], "t": ev["t"], "kind": ev["kind"], "body": ev["body"]}]})
            assert ack["ok"], ack
    return job_id
