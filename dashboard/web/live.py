"""The live page's feed, without Flask: what a job looks like to the page, and deltas of it.

A watcher of job J gets one full snapshot (the Socket.IO event ``job``), then deltas
(``job_delta``) against what the room was sent last, at most once per push interval:

    job        {"job_id": J, "v": N, "sections": {name: value, ...}}          every section
    job_delta  {"job_id": J, "v": N, "base": N - 1,
                "sections": {name: value},         sections replaced whole
                "rows": {name: [[index, row], ...]}}  rows replaced in place

A client applies a delta only on top of version ``base``; otherwise it missed one and asks
for a snapshot again (``watch``). Sections are the names of :data:`SECTIONS`. A keyed
section (:data:`ROW_KEYS`) whose rows keep their keys and order is patched row by row; when
rows come or go, or most of them changed, the section is sent whole. So a job where one rank
moves sends that rank's rows, and a 1,024-rank job at rest sends next to nothing.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from dashboard.diagnosis import Settings
from dashboard.diagnosis.book import Book
from dashboard.diagnosis.incidents import incidents as incidents_of
from dashboard.ingest.pipeline import Ingest
from dashboard.state import JobState
from dashboard.web import display, snapshots, timeline, views

# Rows of these sections are identified by these fields (in this order on the page).
ROW_KEYS: dict[str, tuple[str, ...]] = {
    "ranks": ("rank",),
    "groups": ("id",),
    "progress": ("group",),
    "rank_stats": ("rank",),
    "rendezvous": ("rank", "host"),
    "gpus": ("rank",),
    "findings": ("id",),
    "rank_states": ("rank",),
    "group_states": ("group",),
}

# The live page's history of collectives: seconds on its heat map grid.
TIMELINE_BINS = 30


def sections(state: JobState, cache: "ViewCache | None" = None, *, at: float | None = None,
             findings: list[dict[str, Any]] | None = None,
             settings: Settings = Settings()) -> dict[str, Any]:
    """Everything the job page shows of ``state`` judged at event time ``at``, by section.

    Live, ``at`` is ``Ingest.judged_at()`` and ``findings`` the job's book; replay
    (``GET /api/jobs/<id>/state?at=``) passes the moment asked for and the same book as
    of then (dashboard.diagnosis.book): the same function, so both show the same page. With ``at``, the sections include
    the display states (``rank_states``, ``group_states``: dashboard.web.views) judged then;
    with ``findings``, also ``findings`` and ``incidents``.

    ``ops`` (per group family and op) and ``timeline_grid`` (rank x second) are what the
    page draws of the collectives; they stay small at 1,024 ranks, where the per-rank rows
    of ``GET /collectives`` are half a megabyte (``rank_stats`` keeps one row per rank).
    With a ``cache`` (the live push has one) the expensive history views of a big job are
    reused for a while (see ViewCache); ranks and progress are always fresh.
    """
    def part(name: str, build: Callable[[], Any]) -> Any:
        return build() if cache is None else cache.get((state.job_id, name), state.applied,
                                                       build)

    out = {
        "job": state.summary(),
        "ranks": views.rank_rows(state),
        "groups": views.group_rows(state),
        "progress": progress_columns(views.progress_rows(state)),
        "rank_stats": part("rank_stats", lambda: views.rank_stat_rows(state)),
        "ops": part("ops", lambda: views.op_rows(state)),
        "timeline_grid": part("timeline_grid",
                              lambda: compact_grid(timeline.timeline_grid(state, TIMELINE_BINS))),
        "rendezvous": part("rendezvous", lambda: views.rendezvous_rows(state)),
        "errors": views.error_rows(state),
        "gpus": part("gpus", lambda: views.gpu_rows(state, history=False)),
        # Attempts of a restarted job (torchrun --max-restarts): a count of ranks and the
        # failed or lost ones, small at 1,024 ranks (/api/jobs/<id> has every rank row).
        "attempts": part("attempts", lambda: [
            dict(a, ranks=len(a["ranks"]), failed=[r["rank"] for r in a["ranks"]
                                                    if r["status"] in ("failed", "lost")])
            for a in state.attempt_rows()]),
    }
    if findings is not None:
        out["findings"] = findings
        out["incidents"] = snapshots.with_snapshots(state, incidents_of(findings))
    if at is not None:
        groups = display.group_states(state, at, settings)
        out["rank_states"] = display.rank_states(state, at, findings or [], settings, groups)
        out["group_states"] = groups
    return out


def state_at(ingest: Ingest, job_id: int, at: float) -> dict[str, Any] | None:
    """The job as the server saw it at ``at`` (Unix seconds), for ``state?at=``: every event
    received by then folded, judged then, with its findings and incidents as the book had
    them then, the same first/last-seen times live showed (None if the job is unknown).
    Scrubbing forward continues the last fold (dashboard.history.rewind)."""
    return ingest.replay(job_id, at, lambda timeline: moment(
        timeline.state, timeline.book_at(at), at, ingest.settings))


# The answer's fields that are its sections' own (the same values): a keyframe stores them
# once, with progress by columns only (a third fewer bytes: 98 kB against 139 at 1,024
# ranks), and its answer is put back together from slices of the stored JSON.
SHARED = ("job", "ranks", "groups", "findings", "incidents")


def moment(state: JobState, book: Book, at: float, settings: Settings) -> dict[str, Any]:
    """The ``state?at=`` answer of ``state`` judged at ``at`` with ``book`` as of then: the
    sections the live feed sends, and the findings and incidents of the book then, grouped
    once for both (a keyframe stores it as :func:`keyframe` says)."""
    shown = sections(state, at=at, findings=book.findings(), settings=settings)
    return {"at": at, **{name: shown[name] for name in SHARED},
            "progress": views.progress_rows(state), "sections": shown}


def keyframe(state: JobState, book: Book, at: float, settings: Settings) -> bytes:
    """What a keyframe stores of the ``state?at=`` answer at ``at`` (dashboard.history.keyframes):
    a line of JSON saying where each shared section lies, then the sections' JSON;
    :func:`keyframe_answer` makes the answer of it."""
    return keyframe_of(at, sections(state, at=at, findings=book.findings(), settings=settings))


def keyframe_of(at: float, shown: dict[str, Any]) -> bytes:
    """:func:`keyframe` of the sections ``shown`` at ``at``."""
    body, where = bytearray(b"{"), {}
    for name, value in shown.items():
        if len(body) > 1:
            body += b","
        body += _json(name) + b":"
        start = len(body)
        body += _json(value)
        if name in SHARED or name == "progress":
            where[name] = [start, len(body)]
    body += b"}"
    return _json({"at": at, "parts": where}) + b"\n" + bytes(body)


def keyframe_answer(stored: bytes) -> bytes:
    """The ``state?at=`` answer (JSON) of a keyframe's bytes: what :func:`moment` gives for
    its moment."""
    head, _, body = stored.partition(b"\n")
    meta = json.loads(head)

    def part(name: str) -> bytes:
        start, end = meta["parts"][name]
        return body[start:end]

    out = bytearray(b'{"at":' + _json(meta["at"]))
    for name in SHARED:
        out += b',"' + name.encode() + b'":' + part(name)
    out += b',"progress":' + _json(progress_from_columns(json.loads(part("progress"))))
    out += b',"sections":' + body + b"}"
    return bytes(out)


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def progress_from_columns(columns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of :func:`progress_columns` again (views.progress_rows')."""
    rows = []
    for col in columns:
        inflight = {rank: (op, since) for rank, op, since in col["inflight"]}
        for rank, entered, completed in zip(col["ranks"], col["entered"], col["completed"]):
            op, since = inflight.get(rank, (None, None))
            rows.append({"group": col["group"], "rank": rank, "entered": entered,
                         "completed": completed, "inflight_op": op, "inflight_since": since,
                         "source": col["source"]})
    return rows


def progress_columns(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Progress rows as one row per group with a column per field: ``{"group", "source",
    "ranks", "entered", "completed", "inflight": [[rank, op, since], ...]}`` (a sixth of the
    JSON of a row per rank, and one moving rank sends its group's row)."""
    out: list[dict[str, Any]] = []
    for row in rows:
        if not out or out[-1]["group"] != row["group"]:
            out.append({"group": row["group"], "source": row["source"], "ranks": [],
                        "entered": [], "completed": [], "inflight": []})
        col = out[-1]
        col["ranks"].append(row["rank"])
        col["entered"].append(row["entered"])
        col["completed"].append(row["completed"])
        if row["inflight_op"] is not None:
            col["inflight"].append([row["rank"], row["inflight_op"], row["inflight_since"]])
    return out


# The heat map's cells travel as one character each: percent / 2 as a digit of this
# alphabet (0-9, a-z, A-O: 0 %, 2 %, ..., 100 %), "-" where the rank reported nothing. A
# 1,024-rank job's four families are then ~125 KB of JSON instead of ~660 KB.
BUSY_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNO"
NO_REPORT = "-"


def compact_grid(grid: dict[str, Any]) -> dict[str, Any]:
    """``timeline_grid`` with each rank's busy row as a string (see BUSY_DIGITS)."""
    digits = [BUSY_DIGITS[(pct + 1) // 2] for pct in range(101)]
    return {**grid, "busy_digits": BUSY_DIGITS, "families": [
        {**fam, "busy": ["".join(NO_REPORT if v is None else digits[v] for v in row)
                         for row in fam["busy"]]}
        for fam in grid["families"]]}


def delta(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """What turns ``old`` sections into ``new``: ``{"sections", "rows"}``, or None if equal."""
    whole: dict[str, Any] = {}
    rows: dict[str, list] = {}
    for name, value in new.items():
        before = old.get(name)
        if name in old and before == value:
            continue
        keys = ROW_KEYS.get(name)
        patch = _row_patch(before, value, keys) if keys else None
        if patch is None:
            whole[name] = value
        else:
            rows[name] = patch
    for name in old.keys() - new.keys():
        whole[name] = None
    return {"sections": whole, "rows": rows} if whole or rows else None


def _row_patch(before: Any, after: Any, keys: tuple[str, ...]) -> list | None:
    """``[[index, row], ...]`` for the rows that changed, or None to send the whole list
    (rows came, went or moved, or patching would not be smaller)."""
    if not isinstance(before, list) or not isinstance(after, list) or \
            len(before) != len(after):
        return None
    patch = []
    for i, (a, b) in enumerate(zip(before, after)):
        if a == b:
            continue
        if any(a.get(k) != b.get(k) for k in keys):
            return None
        patch.append([i, b])
    return patch if 2 * len(patch) <= len(after) else None


def apply(old: dict[str, Any], d: dict[str, Any]) -> dict[str, Any]:
    """``old`` with the delta ``d`` applied (what the page does; for tests and tools)."""
    new = dict(old)
    for name, value in d["sections"].items():
        if value is None:
            new.pop(name, None)
        else:
            new[name] = value
    for name, patch in d["rows"].items():
        rows = list(new[name])
        for i, row in patch:
            rows[i] = row
        new[name] = rows
    return new


class Feed:
    """What one job's watchers were sent last, and its version."""

    def __init__(self, sections: dict[str, Any], version: int = 1):
        self.version = version
        self.sections = sections

    def snapshot(self, job_id: int) -> dict[str, Any]:
        return {"job_id": job_id, "v": self.version, "sections": self.sections}

    def advance(self, job_id: int, sections: dict[str, Any]) -> dict[str, Any] | None:
        """The delta from what was sent to ``sections`` (None if nothing changed)."""
        d = delta(self.sections, sections)
        if d is None:
            return None
        self.version += 1
        self.sections = sections
        return {"job_id": job_id, "v": self.version, "base": self.version - 1, **d}


class ViewCache:
    """Reuses a view that is expensive to build, for a time in proportion to its cost.

    A view that took C seconds is rebuilt at most every ``factor`` x C seconds (never later
    than ``max_age``), and is reused as long as nothing was applied to the job. Views that
    cost under ``min_cost`` (a small job's) are always fresh; a 1,024-rank job's history
    views (~100 ms) then cost about a tenth of the push thread instead of most of it, and
    they hold the state lock (which ingest needs to fold events) that much less.
    """

    def __init__(self, factor: float = 10.0, max_age: float = 1.0, min_cost: float = 0.005,
                 max_entries: int = 512):
        self.factor, self.max_age, self.min_cost = factor, max_age, min_cost
        self.max_entries = max_entries
        self._entries: dict[tuple, tuple[float, float, int, Any]] = {}

    def get(self, key: tuple, version: int, build: Callable[[], Any]) -> Any:
        now = time.monotonic()
        entry = self._entries.get(key)
        if entry is not None:
            built_at, cost, built_version, value = entry
            if built_version == version or (cost >= self.min_cost and now - built_at < min(
                    self.max_age, self.factor * cost)):
                return value
        value = build()
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[key] = (now, time.monotonic() - now, version, value)
        return value
