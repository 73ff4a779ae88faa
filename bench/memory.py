"""Does a healthy job's server memory stay flat? RSS over time, split into where it lives.

What runs: a real ``pgdash serve`` process (this repository's, a fresh SQLite file) started
through a small in-process probe (``python -m bench.memory _serve ...``: this module), and N
simulated agents sending what the real agent sends at its defaults (``bench.capacity``'s
agents, protocol v2 unless ``--wire v1``). Every ``--sample`` seconds the probe inside the
server writes one JSON line:

* ``rss``: VmRSS of the process (/proc/self/status);
* ``glibc_*``: glibc malloc's view (``mallinfo2``: ``arena`` bytes taken from the system for
  the heaps, ``inuse`` bytes handed out, ``free`` bytes free inside the heaps but still held,
  ``mmap`` bytes of large blocks mmapped apart), and the number of arenas (``malloc_info``);
* ``pymalloc``: bytes of pymalloc's arenas (``sys._debugmallocstats``): Python's small
  objects live there, outside glibc's heaps; of them ``live`` in objects alive and ``free`` in
  free blocks and unused pools (an arena returns to the system only once wholly free, so
  objects that outlive a burst keep the burst's arenas: fragmentation);
* ``sqlite``: bytes SQLite's allocator holds (``sqlite3_memory_used``: page caches,
  statements, schemas of every connection);
* ``traced``: with ``--tracemalloc``, what tracemalloc traces (the Python heap, requested
  sizes), and the top growing allocation sites (filename:lineno) against the snapshot taken
  at ``--mark`` seconds (once a minute: a snapshot is costly, and its memory shows in RSS);
* ``attributed``: with ``+at`` after a configuration's name, which of the server's periodic
  tasks (ATTRIBUTED) raised RSS to a new high while it ran, by how much in all, and how much
  it rose inside them at all: the bursts that leave free space behind, named (RSS read from
  /proc/self/statm around each call, ~20 us; tasks on other threads overlap, so a raise is
  the task's or its neighbours'; ``outside`` is what rose between the tasks; the first
  raises, counted in "all", hold the server's start-up: read "from mark");
* ``cpu_s``: the server's CPU time so far (all its threads): a run this long includes what a
  60-second ``bench/capacity.py`` run leaves out, such as the compactor's thinning of the
  cells that leave the full-resolution window after ``PGDASH_KEEP_FULL_S``;
* thread count and the SQLite file, WAL and SHM sizes (from outside).

Configurations (``--configs``, run one after another, each on its own fresh server):
``baseline``; ``arena2`` (``MALLOC_ARENA_MAX=2``); ``trim`` (``malloc_trim(0)`` called by the
probe every ``--sample`` seconds); ``arena2trim`` (both); ``mmap256k``
(``MALLOC_MMAP_THRESHOLD_=262144``: a fixed threshold, which turns glibc's dynamic one off);
``nockpt``, ``nokf``, ``nocompact`` (no stored checkpoints, no live keyframes, no
compaction); ``sysmalloc`` (``PYTHONMALLOC=malloc``, trimmed as ``trim``). ``+tm`` after a name
(``baseline+tm``) also runs tracemalloc in that server (slower: the figures are for the
attribution, not the RSS; on 2 cores a traced server keeps up with ~48 ranks, not 128: past
that its backlog, not a leak, fills the heap, and the agents' reconnections show it).

Reported per configuration: RSS at each sample, the growth between ``--mark`` and the end
as MB per rank-hour, the steady-state RSS per rank above an idle server's, and the
breakdown at the end. A measurement, not a test: exit status 0 whatever the figures. From the
repository root::

    python -m bench.memory                                       # 128 ranks, 7 min, baseline
    python -m bench.memory --ranks 128 --minutes 7 --configs baseline,arena2,trim
    python -m bench.memory --configs baseline+tm --json /tmp/mem.json
    git worktree add /tmp/mem-ref <commit>
    python -m bench.memory --reference /tmp/mem-ref   # that pgdash's server first, then this one
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import functools
import gc
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CONFIGS = {
    "baseline": ({}, False),
    "arena2": ({"MALLOC_ARENA_MAX": "2"}, False),
    "trim": ({}, True),
    "arena2trim": ({"MALLOC_ARENA_MAX": "2"}, True),
    # A fixed mmap threshold: glibc then neither raises it (nor the trim threshold, twice it)
    # after a large block is freed, so blocks above it are mmapped and unmapped at free.
    "mmap256k": ({"MALLOC_MMAP_THRESHOLD_": "262144"}, False),
    # What periodic bursts leave behind: no stored checkpoints (PGDASH_CHECKPOINT_S=0), no
    # live keyframes (PGDASH_KEYFRAME_S=0), no compaction (PGDASH_KEEP_FULL_S=0).
    "nockpt": ({"PGDASH_CHECKPOINT_S": "0"}, False),
    "nokf": ({"PGDASH_KEYFRAME_S": "0"}, False),
    "nocompact": ({"PGDASH_KEEP_FULL_S": "0"}, False),  # no compaction, no packs
    # Python's small objects from glibc's malloc instead of pymalloc's arenas (which go back
    # only once wholly free), trimmed every --sample seconds.
    "sysmalloc": ({"PYTHONMALLOC": "malloc"}, True),
}


# -- the probe inside the server ------------------------------------------------------------

class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]


def _libc():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    return libc


def _sqlite():
    try:
        lib = ctypes.CDLL("libsqlite3.so.0")  # the one _sqlite3 links (already loaded)
        lib.sqlite3_memory_used.restype = ctypes.c_int64
        return lib
    except OSError:
        return None


_STDERR_LOCK = threading.Lock()

# The server's periodic tasks whose bursts ``+at`` attributes: module, attribute path.
ATTRIBUTED = (
    ("dashboard.storage.compaction", "Compactor.compact_job"),  # a job's cells packed
    ("dashboard.history.keyframes", "Keyframes.take"),  # a moment rendered and stored
    ("dashboard.history.rewind", "Rewind._save"),  # a checkpoint pickled
    ("dashboard.history.rewind", "Rewind._save_compressed"),  # ... and compressed
    ("dashboard.ingest.diagnosing", "LiveDiagnosis.run"),  # a round of judgements
    ("dashboard.storage.writer", "Writer._run"),  # a batch of writes (ingest's folds)
    ("dashboard.ingest.pipeline", "Ingest.read"),  # an API read of a job's state
)


class _Attribution:
    """RSS raised to a new high inside each wrapped task (see ``attributed`` above)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.peak = self.rss()
        self.rows: dict[str, dict[str, float]] = {}

    def rss(self) -> int:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * self.page

    def note(self, name: str, before: int, after: int, seconds: float) -> None:
        with self.lock:
            row = self.rows.setdefault(name, {"calls": 0, "seconds": 0.0, "rose": 0,
                                              "raised_peak": 0, "largest_raise": 0})
            row["calls"] += 1
            row["seconds"] += seconds
            row["rose"] += max(0, after - before)
            if after > self.peak:
                raise_ = after - self.peak
                row["raised_peak"] += raise_
                row["largest_raise"] = max(row["largest_raise"], raise_)
                self.peak = after

    def wrap(self) -> None:
        for module, path in ATTRIBUTED:
            owner = importlib.import_module(module)
            *outer, attr = path.split(".")
            for part in outer:
                owner = getattr(owner, part)
            setattr(owner, attr, self._wrapped(path, getattr(owner, attr)))

    def _wrapped(self, name: str, fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            before, t = self.rss(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.note(name, before, self.rss(), time.perf_counter() - t)
        return call

    def sample(self) -> dict:
        """The rows so far, and the probe's own look: a new high between the tasks."""
        now = self.rss()
        self.note("outside", now, now, 0.0)
        with self.lock:
            return {k: dict(v) for k, v in self.rows.items()}


_ATTRIBUTION: _Attribution | None = None


def _pymalloc_bytes() -> tuple[int | None, int | None, int | None]:
    """Bytes in pymalloc's arenas now, of them in objects alive, and in free blocks or pools
    (held for reuse: what fragmentation keeps): ``sys._debugmallocstats`` writes to fd 2, so
    fd 2 is pointed at a file for the call."""
    with _STDERR_LOCK, tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    def number(pattern: str, group: int = 1) -> int | None:
        m = re.search(pattern, text)
        return int(m.group(group).replace(",", "")) if m else None

    arenas = number(r"(\d+) arenas \* (\d+) bytes/arena\s*=\s*([\d,]+)", 3)
    live = number(r"# bytes in allocated blocks\s*=\s*([\d,]+)")
    free = [number(r"# bytes in available blocks\s*=\s*([\d,]+)"),
            number(r"unused pools \* \d+ bytes\s*=\s*([\d,]+)")]
    return arenas, live, sum(f for f in free if f is not None) if live is not None else None


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _arenas(libc, path: str) -> int:
    fp = libc.fopen(path.encode(), b"w")
    if not fp:
        return -1
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    return Path(path).read_text().count("<heap nr=")


def _probe(out: Path, every: float, trim: bool, frames: int, mark_s: float) -> None:
    libc, sqlite = _libc(), _sqlite()
    import tracemalloc

    t0 = time.monotonic()
    marked, last_top = None, 0.0
    info_path = str(out) + ".malloc_info.xml"
    while True:
        time.sleep(every)
        row: dict = {"t": round(time.monotonic() - t0, 1)}
        if trim:
            t = time.perf_counter()
            libc.malloc_trim(0)
            row["trim_ms"] = round((time.perf_counter() - t) * 1000, 2)
        mi = libc.mallinfo2()
        row.update(rss=_status("VmRSS") * 1024, threads=_status("Threads"),
                   cpu_s=round(time.process_time(), 2),
                   glibc_arena=mi.arena, glibc_inuse=mi.uordblks + mi.hblkhd,
                   glibc_free=mi.fordblks, glibc_mmap=mi.hblkhd,
                   glibc_arenas=_arenas(libc, info_path),
                   sqlite=sqlite.sqlite3_memory_used() if sqlite else None,
                   blocks=sys.getallocatedblocks(), gc_objects=len(gc.get_objects()))
        row["pymalloc"], row["pymalloc_live"], row["pymalloc_free"] = _pymalloc_bytes()
        if tracemalloc.is_tracing():
            row["traced"] = tracemalloc.get_traced_memory()[0]
            row["traced_overhead"] = tracemalloc.get_tracemalloc_memory()
            if marked is None and row["t"] >= mark_s:
                marked = tracemalloc.take_snapshot()
                row["marked"] = True
            elif marked is not None and row["t"] - last_top >= 55:
                last_top = row["t"]
                snap = tracemalloc.take_snapshot()
                stats = snap.compare_to(marked, "lineno")
                row["top"] = [{"where": f"{s.traceback[0].filename}:{s.traceback[0].lineno}",
                               "size": s.size, "diff": s.size_diff, "count": s.count,
                               "count_diff": s.count_diff}
                              for s in stats[:25]]
                del snap, stats
        if _ATTRIBUTION is not None:
            row["attributed"] = _ATTRIBUTION.sample()
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")


def serve(argv: list[str]) -> None:
    """``python -m bench.memory _serve --stats FILE [--every S] [--trim] [--tracemalloc N]
    [--mark S] -- SERVE ARGS``: the probe in a thread, then ``pgdash serve``."""
    p = argparse.ArgumentParser(prog="bench.memory _serve")
    p.add_argument("--stats", required=True)
    p.add_argument("--every", type=float, default=15.0)
    p.add_argument("--trim", action="store_true")
    p.add_argument("--tracemalloc", type=int, default=0)
    p.add_argument("--mark", type=float, default=120.0)
    p.add_argument("--attribute", action="store_true")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.attribute:
        global _ATTRIBUTION
        _ATTRIBUTION = _Attribution()
        _ATTRIBUTION.wrap()
    if args.tracemalloc:
        import tracemalloc

        tracemalloc.start(args.tracemalloc)
    threading.Thread(target=_probe, name="bench-memory-probe", daemon=True,
                     args=(Path(args.stats), args.every, args.trim, args.tracemalloc,
                           args.mark)).start()
    from dashboard.cli import main

    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    sys.argv = ["pgdash", "serve", *rest]
    main()


# -- the bench ------------------------------------------------------------------------------

def _read_stats(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _mb(v) -> str:
    return "-" if v is None else f"{v / 2**20:.1f}"


async def run_one(name: str, args, workdir: Path, root: Path = ROOT) -> dict:
    from bench.capacity import Bench, launch
    from tests.helpers.procs import free_port, get_json, wait_for

    base = name.split("+")[0]
    env_extra, trim = CONFIGS[base]
    traced, attributed = name.endswith("+tm"), name.endswith("+at")
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / f"memory-{name}.db"
    stats = workdir / f"memory-{name}.jsonl"
    log = workdir / f"memory-{name}.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # This file as a script: the probe is this checkout's, the server (``dashboard``) the
    # one of ``root`` (PYTHONPATH first), so another checkout is measured by the same probe.
    cmd = [sys.executable, str(Path(__file__).resolve()), "_serve", "--stats", str(stats),
           "--every", str(args.sample), "--mark", str(args.mark),
           *(["--trim"] if trim else []), *(["--tracemalloc", "1"] if traced else []),
           *(["--attribute"] if attributed else []),
           "--", "--port", str(port), "--db", f"sqlite:///{db}", *args.server_args.split()]
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, cwd=root, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **env_extra,
                                     "PYTHONPATH": os.pathsep.join([str(root), str(ROOT)])})
    print(f"[{name}] server pid {proc.pid} on {url} ({' '.join(f'{k}={v}' for k, v in env_extra.items()) or 'default malloc'}"
          f"{', malloc_trim every sample' if trim else ''}{', tracemalloc' if traced else ''})",
          flush=True)
    try:
        wait_for(lambda: proc.poll() is None and get_json(url + "/api/jobs") is not None, 60,
                 f"pgdash server on {url}")
        bench = Bench([url], args.ranks, args.ops, f"memory-{args.ranks}-{uuid.uuid4().hex[:6]}")
        stop = asyncio.Event()
        _, tasks = await launch(bench, args.wire, stop)
        t0 = time.monotonic()
        files: list[tuple[float, int, int]] = []
        shown = None  # the probe's last row printed
        while time.monotonic() - t0 < args.minutes * 60:
            await asyncio.sleep(args.sample)
            sizes = [(db.parent / (db.name + s)).stat().st_size
                     if (db.parent / (db.name + s)).exists() else 0 for s in ("", "-wal")]
            files.append((time.monotonic() - t0, *sizes))
            rows = _read_stats(stats)
            if rows and rows[-1]["t"] != shown:
                r = rows[-1]
                shown = r["t"]
                print(f"[{name}] t={r['t']:.0f}s rss={_mb(r['rss'])} MB glibc in use "
                      f"{_mb(r['glibc_inuse'])} free {_mb(r['glibc_free'])} arenas "
                      f"{r['glibc_arenas']} pymalloc {_mb(r['pymalloc'])} (live "
                      f"{_mb(r.get('pymalloc_live'))} free {_mb(r.get('pymalloc_free'))}) sqlite "
                      f"{_mb(r['sqlite'])} traced {_mb(r.get('traced'))} threads "
                      f"{r['threads']} | connected {bench.connected} reconnects "
                      f"{bench.reconnects} db {_mb(sizes[0])} wal {_mb(sizes[1])}", flush=True)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        rows = _read_stats(stats)
        return {"config": name, "ranks": args.ranks, "samples": rows, "files": files,
                "connected": bench.connected, "reconnects": bench.reconnects,
                "ack_timeouts": bench.ack_timeouts}
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _at(rows: list[dict], t: float) -> dict | None:
    return min(rows, key=lambda r: abs(r["t"] - t)) if rows else None


def report(results: list[dict], args) -> None:
    print("\n## RSS over time (MB)\n")
    names = [r["config"] for r in results]
    print("| t (s) | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    times = sorted({round(s["t"]) for r in results for s in r["samples"]})
    for t in times:
        cells = []
        for r in results:
            s = _at(r["samples"], t)
            cells.append(_mb(s["rss"]) if s and abs(s["t"] - t) < args.sample / 2 else "")
        print(f"| {t} | " + " | ".join(cells) + " |")
    print("\n## growth and breakdown\n")
    print("| config | RSS at mark / end (MB) | growth mark->end, MB per rank-hour | KB per rank "
          "at end | glibc in use / free / arenas | pymalloc (live / free) | SQLite | traced | "
          "threads | reconnects | CPU-s per rank-hour, mark->end |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        rows = r["samples"]
        if not rows:
            print(f"| {r['config']} | no samples |")
            continue
        a, b = _at(rows, args.mark), rows[-1]
        hours = max(1e-9, (b["t"] - a["t"]) / 3600)
        rate = (b["rss"] - a["rss"]) / 2**20 / (r["ranks"] * hours)
        per_rank = (b["rss"] - rows[0]["rss"]) / 1024 / r["ranks"]
        cpu = ((b["cpu_s"] - a["cpu_s"]) / (r["ranks"] * hours)
               if "cpu_s" in a and "cpu_s" in b else None)
        print(f"| {r['config']} | {_mb(a['rss'])} / {_mb(b['rss'])} | {rate:.2f} "
              f"| {per_rank:.0f} (above the first sample) "
              f"| {_mb(b['glibc_inuse'])} / {_mb(b['glibc_free'])} / {b['glibc_arenas']} "
              f"| {_mb(b['pymalloc'])} ({_mb(b.get('pymalloc_live'))} / "
              f"{_mb(b.get('pymalloc_free'))}) | {_mb(b['sqlite'])} | {_mb(b.get('traced'))} "
              f"| {b['threads']} | {r['reconnects']} "
              f"| {'-' if cpu is None else f'{cpu:.2f}'} |")
    for r in results:
        last = next((s for s in reversed(r["samples"]) if s.get("attributed")), None)
        if last:
            first = _at(r["samples"], args.mark).get("attributed") or {}
            print(f"\n## {r['config']}: RSS raised to a new high inside each task, from "
                  f"t={args.mark:.0f}s (in all) to t={last['t']:.0f}s\n")
            print("| task | calls | seconds inside | raised the high (MB), from mark / all "
                  "| largest raise (MB) | rose inside it (MB, all) |")
            print("|---|---|---|---|---|---|")
            for name, row in sorted(last["attributed"].items(),
                                    key=lambda kv: -kv[1]["raised_peak"]):
                since = row["raised_peak"] - first.get(name, {}).get("raised_peak", 0)
                print(f"| {name} | {row['calls']} | {row['seconds']:.1f} | {_mb(since)} / "
                      f"{_mb(row['raised_peak'])} | {_mb(row['largest_raise'])} "
                      f"| {_mb(row['rose'])} |")
    for r in results:
        tops = [s for s in r["samples"] if s.get("top")]
        if tops:
            print(f"\n## {r['config']}: top growing allocation sites, t={args.mark:.0f}s -> "
                  f"t={tops[-1]['t']:.0f}s\n")
            print("| where | size now | growth | blocks growth |")
            print("|---|---|---|---|")
            for s in tops[-1]["top"][:20]:
                where = s["where"].replace(str(ROOT) + "/", "")
                where = re.sub(r".*/site-packages/", "", where)
                print(f"| {where} | {s['size'] / 1024:.0f} KB | {s['diff'] / 1024:+.0f} KB "
                      f"| {s['count_diff']:+d} |")


def main() -> None:
    if sys.argv[1:2] == ["_serve"]:
        serve(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=128)
    p.add_argument("--minutes", type=float, default=7.0, help="run time per configuration")
    p.add_argument("--sample", type=float, default=15.0, help="seconds between samples")
    p.add_argument("--mark", type=float, default=120.0,
                   help="seconds into the run from which growth is measured")
    p.add_argument("--configs", default="baseline",
                   help=f"comma-separated, of {', '.join(CONFIGS)}; '+tm' after one "
                        "also runs tracemalloc in its server, '+at' names the tasks that "
                        "raise its RSS")
    p.add_argument("--wire", default="v2", choices=("v1", "v2"))
    p.add_argument("--ops", type=int, default=None, help="coll_stats rows per rank-second")
    p.add_argument("--server-args", default="", help="extra arguments to pgdash serve")
    p.add_argument("--keep", metavar="DIR", help="keep databases, logs and samples in DIR")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    p.add_argument("--reference", type=Path, metavar="PATH",
                   help="another checkout (git worktree add PATH <commit>): each configuration "
                        "runs on its server too, first, named NAME@reference")
    args = p.parse_args()
    if args.ops is None:
        from bench.common import OPS_PER_SECOND

        args.ops = OPS_PER_SECOND
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    for n in names:
        if (n.split("+")[0] not in CONFIGS or n.count("+") > 1
                or ("+" in n and not n.endswith(("+tm", "+at")))):
            p.error(f"unknown configuration {n!r}")
    print(f"pgdash memory: {args.ranks} ranks, wire {args.wire}, {args.minutes:g} min per "
          f"configuration, a sample every {args.sample:g} s, {os.cpu_count()} CPUs", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="pgdash-memory-") as tmp:
        workdir = Path(args.keep or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for name in names:
            if args.reference:
                ref = asyncio.run(run_one(name, args, workdir / "reference",
                                          args.reference.resolve()))
                results.append({**ref, "config": f"{ref['config']}@reference"})
            results.append(asyncio.run(run_one(name, args, workdir)))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    report(results, args)


if __name__ == "__main__":
    main()
