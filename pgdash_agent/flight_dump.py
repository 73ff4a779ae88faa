"""What a Flight Recorder dump says, read without knowing what it means: its text layout
(the tail of its entries decoded alone), an entry's op name and its bytes.

Kept apart from pgdash_agent.flight_stats (what the entries mean to the agent) and
pgdash_agent.flight (the per-group status) because both read dumps.
"""

from __future__ import annotations

import json
from typing import Any

# Bytes per element of the dtype names FR writes (c10::ScalarType names).
DTYPE_BYTES = {
    "Byte": 1, "Char": 1, "Short": 2, "Int": 4, "Long": 8, "Half": 2, "Float": 4, "Double": 8,
    "ComplexHalf": 4, "ComplexFloat": 8, "ComplexDouble": 16, "Bool": 1, "QInt8": 1,
    "QUInt8": 1, "QInt32": 4, "BFloat16": 2, "Float8_e5m2": 1, "Float8_e4m3fn": 1,
    "Float8_e5m2fnuz": 1, "Float8_e4m3fnuz": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8,
}


def op_name(profiling_name: str) -> str:
    """``"gloo:all_reduce"`` -> ``"all_reduce"``; ``"nccl:send 1->2"`` -> ``"send"``."""
    name = profiling_name.split(":", 1)[-1]
    return name.split(" ", 1)[0] or "unknown"


def entry_bytes(entry: dict[str, Any]) -> int:
    """Bytes of an entry's inputs (what the wrappers count: the tensor handed in)."""
    total = 0
    for sizes, dtype in zip(entry.get("input_sizes") or (), entry.get("input_dtypes") or ()):
        n = 1
        for d in sizes:
            n *= int(d)
        total += n * DTYPE_BYTES.get(str(dtype), 0)
    return total


def dump_tail(raw: bytes | str, first_id: int | None) -> tuple[list[dict], dict]:
    """A Flight Recorder dump's entries from record id ``first_id`` on (all when None), and
    its pg_status. A free function, apart from :class:`FlightStats`, because it knows the
    dump's text layout and nothing of what the entries mean.

    Parsing 2000 entries costs tens of ms: only the tail after the last processed id is
    decoded (entries are in record id order, keys sorted, as torch writes them).
    """
    data = raw.decode() if isinstance(raw, bytes) else raw
    start = data.find('"entries":[')
    if start < 0:
        return [], (json.loads(data).get("pg_status") or {})
    begin = start + len('"entries":[')
    if first_id is not None:
        at = data.find(f'"record_id":{first_id},', begin)
        if at > 0:  # entries hold no nested objects and start with this key (sorted)
            begin = max(begin, data.rfind('{"collective_seq_id"', begin, at))
    decoder = json.JSONDecoder()
    entries = []
    pos = begin
    length = len(data)
    while pos < length and data[pos] != "]":
        if data[pos] in ", ":
            pos += 1
            continue
        entry, pos = decoder.raw_decode(data, pos)
        entries.append(entry)
    status = {}
    tail = data.find('"pg_status":', pos)
    if tail > 0:
        status, _ = decoder.raw_decode(data, tail + len('"pg_status":'))
    return entries, status
