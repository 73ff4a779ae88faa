"""What one job's folded state holds in memory, per rank, table by table.

The server keeps a JobState per live job (dashboard.state). Here a job of ``--ranks`` ranks
(the mesh of bench.common.mesh_groups) runs ``--seconds`` of what the agent sends at its
defaults (bench.fold.build_log: a heartbeat, two latency summaries and a GPU reading a rank
and second; no fault), is folded, and each of the state's attributes is sized with everything
it reaches that an earlier attribute did not (``sys.getsizeof``, recursively: the Python
objects, not the allocator's overhead around them). Also: the stored checkpoint's size (the
codec of dashboard.storage.codec) and how long decoding it takes (the start of every moment
a scrub shows). Goal (issue 24): 64 KB of server memory per rank, of which this is a part.

``--reference DIR`` measures another checkout (e.g. ``git worktree add /tmp/ref HEAD~3``) on
the same log, in a subprocess, side by side. A measurement: exit status 0 whatever the
figures. From the repository root::

    python -m bench.state_size                          # 64 ranks, 90 s
    python -m bench.state_size --ranks 256 --reference /tmp/ref
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def deep_size(value, seen: set[int]) -> int:
    """Bytes of ``value`` and of what it reaches that ``seen`` does not hold yet."""
    if id(value) in seen:
        return 0
    seen.add(id(value))
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        return size + sum(deep_size(k, seen) + deep_size(v, seen) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)) or type(value).__name__ == "deque":
        return size + sum(deep_size(v, seen) for v in value)
    if hasattr(value, "__dict__"):
        return size + deep_size(vars(value), seen)
    for name in getattr(type(value), "__slots__", ()):
        if hasattr(value, name):
            size += deep_size(getattr(value, name), seen)
    return size


def measure(ranks: int, seconds: int) -> dict:
    """Fold the job with whatever ``dashboard`` is first on sys.path; its sizes."""
    from bench.fold import build_log
    from dashboard.state import JobState
    from dashboard.storage.codec import decode_state, encode_state

    log = build_log(ranks=ranks, seconds=seconds, hang_at=None, slow_rank=None)
    state = JobState(1, "bench-state-size").apply_all(log)
    gc.collect()
    seen: set[int] = set()
    tables = {name: deep_size(value, seen) for name, value in vars(state).items()}
    blob = encode_state(state)
    took = []
    for _ in range(3):
        start = time.perf_counter()
        decode_state(blob)
        took.append(time.perf_counter() - start)
    return {"root": str(Path(sys.modules["dashboard"].__file__).parent.parent),
            "events": len(log), "groups": len(state.groups), "tables": tables,
            "checkpoint_bytes": len(blob), "decode_s": min(took)}


def in_subprocess(root: Path, ranks: int, seconds: int) -> dict:
    from bench.common import checkout_env

    env = checkout_env(root)
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker",
                          "--ranks", str(ranks), "--seconds", str(seconds)],
                         env=env, cwd=str(root), check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--seconds", type=int, default=90)
    p.add_argument("--reference", type=Path, help="another checkout, measured beside this one")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(measure(args.ranks, args.seconds)))
        return
    mine = in_subprocess(ROOT, args.ranks, args.seconds)
    ref = in_subprocess(args.reference.resolve(), args.ranks, args.seconds) \
        if args.reference else None
    if ref is not None and ref["root"] == mine["root"]:
        raise SystemExit("state_size: the reference imported this checkout")
    print(f"{args.ranks} ranks ({mine['groups']} groups), {args.seconds} s at the agent's "
          f"defaults, {mine['events']:,} events; KB per rank"
          + (" (reference beside)" if ref else ""))
    names = sorted(mine["tables"], key=lambda n: -mine["tables"][n])
    names += [n for n in (ref or {}).get("tables", {}) if n not in mine["tables"]]

    def kb(result, name):
        value = (result or {}).get("tables", {}).get(name)
        return "-" if value is None else f"{value / args.ranks / 1024:.1f}"

    print("| table | this | reference |\n|---|---|---|")
    for name in names:
        if max(mine["tables"].get(name, 0), (ref or {}).get("tables", {}).get(name, 0)) \
                >= 0.1 * 1024 * args.ranks:
            print(f"| {name} | {kb(mine, name)} | {kb(ref, name)} |")
    total = {"tables": {"all": sum(mine["tables"].values())}}
    ref_total = {"tables": {"all": sum(ref["tables"].values())}} if ref else None
    print(f"| **all** | {kb(total, 'all')} | {kb(ref_total, 'all')} |")
    for label, r in (("this", mine), ("reference", ref)):
        if r is not None:
            print(f"checkpoint ({label}): {r['checkpoint_bytes'] / 1024:,.0f} KB, decoded in "
                  f"{r['decode_s'] * 1000:.0f} ms (best of 3)")


if __name__ == "__main__":
    main()
