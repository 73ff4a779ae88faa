"""Rule for ranks that called different collectives at the same sequence number."""

from __future__ import annotations

import collections

from dashboard.diagnosis.core import Finding, Settings, Severity, finding
from dashboard.diagnosis.text import group_label, ranks_label
from dashboard.state import JobState


def desync(state: JobState, now: float, s: Settings) -> list[Finding]:
    out = []
    for group in sorted(state.groups, key=str):
        by_seq: dict[int, dict[int, tuple]] = collections.defaultdict(dict)
        since: dict[int, float] = {}
        for rank, row in state.progress_of(group).items():
            if row.get("inflight_op"):
                sig = (row["inflight_op"], row.get("inflight_dtype"), row.get("inflight_bytes"))
                by_seq[row["entered"]][rank] = sig
                since[row["entered"]] = max(since.get(row["entered"], 0),
                                            row.get("inflight_since") or 0)
        for seq, sigs in by_seq.items():
            if len(set(sigs.values())) < 2:
                continue
            counts = collections.Counter(sigs.values())
            top = max(counts.values())
            majority = min((sig for sig, n in counts.items() if n == top),
                           key=lambda sig: min(r for r, v in sigs.items() if v == sig))
            odd = sorted(r for r, sig in sigs.items() if sig != majority)
            described = {str(r): {"op": sig[0], "dtype": sig[1], "bytes": sig[2]}
                         for r, sig in sorted(sigs.items())}
            odd_sig = sigs[odd[0]]
            out.append(finding(
                "desync", Severity.CRITICAL, odd, group,
                f"{ranks_label(odd).capitalize()} called {odd_sig[0]} ({odd_sig[1]}, "
                f"{odd_sig[2]} bytes) as collective #{seq} on {group_label(state, group)}, "
                f"where the others called {majority[0]} ({majority[1]}, {majority[2]} bytes).",
                "Ranks must issue the same collectives in the same order with the same shapes. "
                f"Look for a rank-dependent branch before collective #{seq} on "
                f"{ranks_label(odd)} (an `if rank == ...`, uneven data, a skipped step). "
                "TORCH_DISTRIBUTED_DEBUG=DETAIL checks every collective (slowly).",
                {"seq": seq, "signatures": described, "expected": {
                    "op": majority[0], "dtype": majority[1], "bytes": majority[2]}},
                since[seq], key=f"{seq}"))
    return out
