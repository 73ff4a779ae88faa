"""Packs: bytes per event and decode speed of the pack encodings, on a real bench log.

What runs: the events of a job stored by ``bench/storage.py --db FILE`` (its newest
``--minutes``, which the compactor left at full resolution), cut into compaction cells
(60 s of arrival time); each cell is packed (dashboard.storage.packformat.pack_payload: format 1, and
format 2, which stores the agent's decimals as integer columns) and compressed several
ways: zlib at levels 1, 6 and 9, zlib with the body format's preset dictionary, lzma.
Reference in the same run: the bytes of the same events as one compressed body per row
(dashboard.storage.codec.encode_body, what revision 0004 stores) and that row format's decode rate.
Printed per encoding: bytes per event and decode events/s (inflate + MessagePack + the
StoredEvent dicts, as ``Store.log.events`` needs them).

The file is brought to this pgdash's schema first (``pgdash db upgrade``). A measurement, not
a test::

    python -m bench.storage --ranks 8 --minutes 60 --db /tmp/b8.db
    python -m bench.packs /tmp/b8.db
"""

from __future__ import annotations

import argparse
import collections
import lzma
import sqlite3
import time
import zlib
from pathlib import Path

from dashboard.storage.codec import _BODY_DICT_V1, decode_body, encode_body
from dashboard.storage.packformat import PACK_V1, PACK_V2, Pack, pack_payload
from dashboard.storage.database import upgrade
from dashboard.storage.store import Store


def zlib_dict(level: int):
    def enc(raw: bytes) -> bytes:
        z = zlib.compressobj(level, zdict=_BODY_DICT_V1)
        return z.compress(raw) + z.flush()

    def dec(data: bytes) -> bytes:
        z = zlib.decompressobj(zdict=_BODY_DICT_V1)
        return z.decompress(data) + z.flush()
    return enc, dec


ENCODINGS = {
    "zlib 1": (lambda r: zlib.compress(r, 1), zlib.decompress),
    "zlib 6": (lambda r: zlib.compress(r, 6), zlib.decompress),
    "zlib 9": (lambda r: zlib.compress(r, 9), zlib.decompress),
    "zlib 6 + body dictionary": zlib_dict(6),
    "lzma preset 0": (lambda r: lzma.compress(r, preset=0), lzma.decompress),
    "lzma preset 6": (lambda r: lzma.compress(r, preset=6), lzma.decompress),
}
try:  # not a dependency: measured here to decide whether it would be worth one
    import zstandard

    for _level in (3, 9, 19):
        ENCODINGS[f"zstandard {_level} (not a dep.)"] = (
            zstandard.ZstdCompressor(level=_level).compress,
            zstandard.ZstdDecompressor().decompress)
except ImportError:
    pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", type=Path)
    parser.add_argument("--job", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=12.0)
    parser.add_argument("--cell", type=float, default=60.0)
    args = parser.parse_args()
    con = sqlite3.connect(args.db)
    last = con.execute("SELECT MAX(received_at) FROM events WHERE job_id = ?",
                       (args.job,)).fetchone()[0]
    con.close()
    upgrade(f"sqlite:///{args.db}")
    store = Store(f"sqlite:///{args.db}")
    start = (last - args.minutes * 60) // args.cell * args.cell
    cells = collections.defaultdict(list)
    for ev in store.log.events(args.job):
        if start <= ev["received_at"] < last // args.cell * args.cell:
            cells[ev["received_at"] // args.cell].append(ev)
    events = [ev for cell in cells.values() for ev in cell]
    n = len(events)
    print(f"bench/packs: {n} events in {len(cells)} cells of {args.cell:g} s, "
          f"{len({ev['session'] for ev in events})} sessions")
    rows = [encode_body(ev["body"]) for ev in events]
    t = time.perf_counter()
    for body in rows:
        decode_body(body)
    row_s = time.perf_counter() - t
    print(f"  reference, one body per row (0004): {sum(map(len, rows)) / n:6.1f} B/event "
          f"(bodies alone), decode {n / row_s:9,.0f} events/s (bodies alone)")
    by_kind = collections.Counter()
    # Format 1 (no decimal columns) with zlib 6 as the reference, then format 2 every way.
    for version, encodings in ((PACK_V1, {"zlib 6": ENCODINGS["zlib 6"]}),
                               (PACK_V2, ENCODINGS)):
        t = time.perf_counter()
        payloads = [pack_payload(cell, decimals=version >= PACK_V2) for cell in cells.values()]
        payload_s = time.perf_counter() - t
        for name, (enc, dec) in encodings.items():
            t = time.perf_counter()
            packed = [enc(p) for p in payloads]
            enc_s = payload_s + time.perf_counter() - t
            t = time.perf_counter()
            for data in packed:
                for _ in Pack(dec(data), version).events():
                    pass
            dec_s = time.perf_counter() - t
            print(f"  pack format {version}, {name:26}: {sum(map(len, packed)) / n:6.1f} "
                  f"B/event, decode {n / dec_s:9,.0f} events/s, encode {n / enc_s:9,.0f} "
                  f"events/s")
    # Bytes per event of each kind alone (zlib 6), packed per cell.
    for kind in sorted({ev["kind"] for ev in events}):
        size = count = 0
        for cell in cells.values():
            mine = [ev for ev in cell if ev["kind"] == kind]
            if mine:
                size += len(zlib.compress(pack_payload(mine), 6))
                count += len(mine)
        by_kind[kind] = size / count
        print(f"  by kind (zlib 6, that kind alone per cell): {kind:12} {count:7} events, "
              f"{size / count:6.1f} B/event")


if __name__ == "__main__":
    main()
