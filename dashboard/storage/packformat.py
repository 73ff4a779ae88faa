"""The pack format: one compaction cell of a job's log (or up to PACK_EVENTS events of one) as
one compressed blob, stored in a row of ``event_packs`` (dashboard.storage.packs; written by
dashboard.storage.compaction).

No SQL here. The events' columns are stored apart, their bodies grouped by shape and
transposed, and floats that are short decimals as integer columns, so that zlib sees the
repeats across ranks (every session of the cell together: ranks send near-identical bodies).
A version byte leads each pack (``PACK_V1``, ``PACK_V2``); every stored pack stays readable.
"""

from __future__ import annotations

import array
import bisect
import itertools
import struct
import zlib
from typing import Any, Iterator, Optional

import msgspec
import numpy as np

from dashboard.storage.codec import RawBody

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()

PACK_V1 = 1  # pack_payload without its decimal columns
PACK_V2 = 2  # with them (what encode_pack writes)
PACK_LEVEL = 6  # zlib level of packs (bench/packs.py measured levels, dictionary and lzma)

# The bodies and decimal planes decode as views of the payload (no copy: a 1,024-rank
# cell's are ~100 MB), which Bodies copies once, regrouped.
_V1_FIELDS = (int, list[int], list[str], list[int], list[Optional[int]], bytes, bytes,
              list[str], list[int], list[int], memoryview)
_payload_decoders = {
    PACK_V1: msgspec.msgpack.Decoder(tuple[_V1_FIELDS]),
    PACK_V2: msgspec.msgpack.Decoder(tuple[(*_V1_FIELDS, list[tuple[int, int, memoryview]])]),
}
# A float of a body becomes an integer column when it is an exact decimal of at most this
# many places in every body of its group: what the agent sends (latencies rounded to the
# nanosecond, NVML's milliwatts as watts), whose float64 bytes look random to zlib although
# they hold ~25 bits.
_SCALE = 1000
PACK_EVENT_BYTES = 120  # an opened pack's memory per event beyond its bodies (89-116)
_DECIMAL_MAX = 2.0 ** 53 / _SCALE  # larger: no exact integer k with k / _SCALE == x


class Bodies:
    """Each event's body bytes, from pack_payload's transposed groups and decimal columns:
    one buffer per group of bodies of one shape, and per event its group and row (a few
    bytes an event; a body's bytes are sliced when asked for)."""

    __slots__ = ("_rows", "_sizes", "_group", "_row")

    def __init__(self, kidx: list[int], lengths: list[int], blob: bytes,
                 decimals: list[tuple[int, int, bytes]] = ()):
        if len(lengths) != len(kidx):
            raise ValueError("its bodies' lengths do not add up")
        groups: dict[tuple[int, int], list[int]] = {}
        for i, key in enumerate(zip(kidx, lengths)):
            groups.setdefault(key, []).append(i)
        cut: dict[int, list[tuple[int, bytes]]] = {}
        for g, offset, planes in decimals:
            if not 0 <= g < len(groups):
                raise ValueError("a decimal column lies outside its bodies")
            cut.setdefault(g, []).append((offset, planes))
        if sum(len(members) * (size - 8 * len(cut.get(g, ())))
               for g, ((_, size), members) in enumerate(groups.items())) != len(blob):
            raise ValueError("its bodies' lengths do not add up")
        self._rows: list[bytearray] = []
        self._sizes: list[int] = []
        self._group = array.array("I", bytes(4 * len(kidx)))
        self._row = array.array("I", bytes(4 * len(kidx)))
        stored = np.frombuffer(blob, np.uint8)
        pos = 0
        for g, ((_, size), members) in enumerate(groups.items()):
            m = len(members)
            # Filled through a numpy view of its own bytes: no other copy of the group.
            buffer = bytearray(m * size)
            rows = np.frombuffer(buffer, np.uint8).reshape(m, size)
            taken = np.zeros(size, bool)
            for offset, planes in cut.get(g, []):
                if not 0 <= offset <= size - 8 or len(planes) != 8 * m or \
                        taken[offset:offset + 8].any():
                    raise ValueError("a decimal column lies outside its bodies")
                taken[offset:offset + 8] = True
                rows[:, offset:offset + 8] = _decimals_back(planes, m)
            keep = np.flatnonzero(~taken)
            rows[:, keep] = stored[pos:pos + m * len(keep)].reshape(len(keep), m).T
            pos += m * len(keep)
            del rows
            self._rows.append(buffer)
            self._sizes.append(size)
            for r, i in enumerate(members):
                self._group[i] = g
                self._row[i] = r

    def __getitem__(self, i: int) -> bytes:
        g = self._group[i]
        size = self._sizes[g]
        start = self._row[i] * size
        return self._rows[g][start:start + size]

    def __len__(self) -> int:
        return len(self._group)


def _float_offsets(body: bytes) -> list[int]:
    """Where the 8 bytes of each float64 of a MessagePack body start (what msgspec writes:
    maps, arrays, strings, bins, numbers, nil and booleans; [] for anything else)."""
    out: list[int] = []
    i, n, items = 0, len(body), 1
    widths = {0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8, 0xd0: 1, 0xd1: 2, 0xd2: 4, 0xd3: 8,
              0xca: 4}
    try:
        while items:
            items -= 1
            b = body[i]
            i += 1
            if b <= 0x7f or b >= 0xe0 or b in (0xc0, 0xc2, 0xc3):
                continue
            if b == 0xcb:
                out.append(i)
                i += 8
            elif b in widths:
                i += widths[b]
            elif 0xa0 <= b <= 0xbf:
                i += b & 0x1f
            elif b in (0xd9, 0xda, 0xdb, 0xc4, 0xc5, 0xc6):
                w = {0xd9: 1, 0xc4: 1, 0xda: 2, 0xc5: 2}.get(b, 4)
                i += w + int.from_bytes(body[i:i + w], "big")
            elif 0x90 <= b <= 0x9f or 0x80 <= b <= 0x8f:
                items += (b & 0x0f) * (2 if b <= 0x8f else 1)
            elif b in (0xdc, 0xdd, 0xde, 0xdf):
                w = 2 if b in (0xdc, 0xde) else 4
                items += int.from_bytes(body[i:i + w], "big") * (2 if b >= 0xde else 1)
                i += w
            else:
                return []
    except IndexError:
        return []
    return out if i == n else []


def _decimal_column(members: list[bytes], offset: int) -> bytes | None:
    """The float at ``offset`` of every body as integer byte planes (value x ``_SCALE``),
    if every one reads back exactly from them; else None. (numpy's arithmetic is IEEE's,
    as Python's is, and ``rint`` rounds halves to even, as ``round`` does.)"""
    m = len(members)
    raw = b"".join(body[offset:offset + 8] for body in members)
    x = np.frombuffer(raw, ">f8")
    with np.errstate(invalid="ignore"):
        if not ((-_DECIMAL_MAX < x) & (x < _DECIMAL_MAX)).all():  # also NaN
            return None
    ks = np.rint(x * _SCALE).astype(np.int64)
    if (ks / _SCALE).astype(">f8").tobytes() != raw:  # -0.0, 0.1234, ...
        return None
    return ks.astype("<i8").view(np.uint8).reshape(m, 8).T.tobytes()


def _decimals_back(planes: bytes, m: int) -> np.ndarray:
    """The big-endian float64 bytes of :func:`_decimal_column`'s planes, a row per body
    (int64 / int in numpy is IEEE's division of the exact float64 of k, |k| < 2**53 as
    written: the same float as Python's k / _SCALE)."""
    ks = np.frombuffer(planes, np.uint8).reshape(8, m).T.copy().view("<i8").ravel()
    return (ks / _SCALE).astype(">f8").view(np.uint8).reshape(m, 8)


def _shuffled(values: list[float]) -> bytes:
    """Floats as their 8-byte forms, byte planes apart: arrival times of one minute share
    their leading bytes, which then lie together for the compressor."""
    raw = array.array("d", values).tobytes()
    return b"".join(raw[i::8] for i in range(8))


def _unshuffled(data: bytes, n: int) -> array.array:
    raw = bytearray(8 * n)
    for i in range(8):
        raw[i::8] = data[i * n:(i + 1) * n]
    return array.array("d", raw)


def encode_pack(events: list[dict[str, Any]], level: int = PACK_LEVEL,
                version: int = PACK_V2) -> bytes:
    """A pack's bytes: the version byte + zlib(:func:`pack_payload`). **Frozen formats**: a
    change is a new version byte, and every one stays readable (``version``: an older one,
    for tests). The payload is compressed piece by piece as it is made, never whole: at
    1,024 ranks a cell's bodies are ~100 MB, and joining them, encoding them and
    compressing that took four copies at once (bench/memory.py)."""
    compressor = zlib.compressobj(level)
    out = [bytes((version,))]
    out.extend(compressor.compress(piece)
               for piece in _payload_pieces(events, decimals=version >= PACK_V2))
    out.append(compressor.flush())
    return b"".join(out)


def pack_payload(events: list[dict[str, Any]], decimals: bool = True) -> bytes:
    """StoredEvent dicts (ascending ids) column by column, before compression.

    MessagePack([n, ids as deltas, the session table, each event's index in it, seqs as
    deltas per session, t and received_at as byte planes, the kind table, each event's index
    in it, each body's MessagePack length, the bodies]). The bodies are MessagePack, put in
    groups of one kind and one length (in event order within a group), each group stored
    transposed: the first byte of every body, then every second byte, and so on. Bodies of
    one kind and length are nearly always the same layout (a heartbeat, a latency summary of
    the same ops), so a column holds one field's byte across every rank and second: constant
    keys and exponents turn into long runs, and the compressor meets the random low bytes of
    the measured floats apart from the structure (31% fewer bytes than bodies one after the
    other, bench/packs.py). Any bodies read back exactly, whatever their layout.

    Format 2 adds a twelfth field, the decimal columns: [group, offset, planes] for each
    float64 of a group's first body (found by parsing it) that is, in every body of the
    group, an exact decimal of at most three places (what the agent sends: latencies in
    microseconds to the nanosecond, watts from milliwatts). Its 8 bytes leave the group's
    transposed bytes, and the values times 1000 are stored instead as little-endian int64
    byte planes (42% smaller packs of the bench's job, bench/packs.py). Whether a column
    qualifies is checked by reading it back, so any bytes there round-trip.
    """
    return b"".join(_payload_pieces(events, decimals))


def _payload_pieces(events: list[dict[str, Any]], decimals: bool) -> Iterator[bytes]:
    """:func:`pack_payload`'s bytes in pieces, one group of bodies' transposed bytes at a
    time (what msgspec would encode of the whole list, written out by hand around the
    bodies: an array header, the fields before them, a bin header, them, the columns)."""
    n = len(events)
    sessions: dict[str, int] = {}
    kinds: dict[str, int] = {}
    ids, sidx, kidx, seqs = [], [], [], []
    last_id, last_seq = 0, {}
    for ev in events:
        ids.append(ev["id"] - last_id)
        last_id = ev["id"]
        s = sessions.setdefault(ev["session"], len(sessions))
        sidx.append(s)
        kidx.append(kinds.setdefault(ev["kind"], len(kinds)))
        seq = ev["seq"]
        if seq is None:
            seqs.append(None)
        else:
            seqs.append(seq - last_seq.get(s, 0))
            last_seq[s] = seq
    bodies = [body if isinstance(body := ev["body"], RawBody) else _encoder.encode(body)
              for ev in events]
    lengths = [len(b) for b in bodies]
    groups: dict[tuple[int, int], list[bytes]] = {}
    for k, body in zip(kidx, bodies):
        groups.setdefault((k, len(body)), []).append(body)
    del bodies
    columns, kept, blob_size = [], [], 0
    for g, ((_, size), members) in enumerate(groups.items()):
        taken: set[int] = set()
        for offset in _float_offsets(members[0]) if decimals else ():
            planes = _decimal_column(members, offset)
            if planes is not None:
                columns.append((g, offset, planes))
                taken.update(range(offset, offset + 8))
        kept.append([j for j in range(size) if j not in taken])
        blob_size += len(members) * len(kept[-1])
    head = _encoder.encode([n, ids, list(sessions), sidx, seqs,
                            _shuffled([ev["t"] for ev in events]),
                            _shuffled([ev["received_at"] for ev in events]), list(kinds),
                            kidx, lengths])
    yield bytes((0x90 + 10 + 1 + decimals,)) + head[1:]  # a fixarray of 11 or 12 fields
    yield _bin_header(blob_size)
    for ((_, size), members), keep in zip(groups.items(), kept):
        rows = np.frombuffer(b"".join(members), np.uint8).reshape(len(members), size)
        yield (rows.T if len(keep) == size else rows[:, keep].T).tobytes()
    if decimals:
        yield _encoder.encode(columns)


def _bin_header(size: int) -> bytes:
    """MessagePack's header of a bin of ``size`` bytes (the shortest, as msgspec writes)."""
    if size < 2**8:
        return struct.pack(">BB", 0xc4, size)
    if size < 2**16:
        return struct.pack(">BH", 0xc5, size)
    return struct.pack(">BI", 0xc6, size)


class Pack:
    """A pack opened for reading: its ids at once, each event's dict only when asked for.

    Bodies stay MessagePack (the payload's regrouped bytes, see :class:`Bodies`) until their
    event is built, so that a pack of a 1,024-rank cell costs its payload's bytes in memory
    and a few dozen bytes an event, not a few hundred megabytes of dicts, and ids at or
    below ``after`` cost no dict at all.
    """

    __slots__ = ("ids", "nbytes", "_sessions", "_sidx", "_seqs", "_t", "_r", "_kinds",
                 "_kidx", "_bodies")

    def __init__(self, raw: bytes, version: int = PACK_V2):
        try:
            (n, deltas, self._sessions, self._sidx, seq_d, t_raw, r_raw, self._kinds,
             self._kidx, lengths, blob, *decimals) = _payload_decoders[version].decode(raw)
            self.ids = array.array("q", itertools.accumulate(deltas))
            self._bodies = Bodies(self._kidx, lengths, blob, *decimals)
            seqs: list[int | None] = []
            last_seq: dict[int, int] = {}
            for s, d in zip(self._sidx, seq_d):
                if d is None:
                    seqs.append(None)
                else:
                    last_seq[s] = value = last_seq.get(s, 0) + d
                    seqs.append(value)
            self._seqs = seqs
            self._t, self._r = _unshuffled(t_raw, n), _unshuffled(r_raw, n)
            if not (len(self.ids) == len(self._sidx) == len(seqs) == len(self._kidx) == n):
                raise ValueError("its columns differ in length")
            self._sessions[max(self._sidx, default=0)]
            self._kinds[max(self._kidx, default=0)]
            # What it holds in memory, about: the bodies' bytes, and per event an id, two
            # times, a group and a row in arrays, and a session, kind and seq in lists.
            self.nbytes = len(raw) + n * PACK_EVENT_BYTES
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError,
                IndexError, OverflowError, struct.error) as exc:
            raise ValueError(f"pack cannot be read: {exc}") from None

    def events(self, after: int = 0, upto: int | None = None,
               raw: bool = False) -> Iterator[dict[str, Any]]:
        """StoredEvent dicts of the ids in (after, upto], in id order (``raw``: their
        bodies as :class:`RawBody`)."""
        ids, sessions, sidx, kinds, kidx = self.ids, self._sessions, self._sidx, \
            self._kinds, self._kidx
        seqs, ts, rs, bodies, body = self._seqs, self._t, self._r, self._bodies, \
            RawBody if raw else _decoder.decode
        hi = len(ids) if upto is None else bisect.bisect_right(ids, upto)
        for i in range(bisect.bisect_right(ids, after), hi):
            yield {"id": ids[i], "session": sessions[sidx[i]], "seq": seqs[i], "t": ts[i],
                   "received_at": rs[i], "kind": kinds[kidx[i]], "body": body(bodies[i])}


def open_pack(data: bytes) -> Pack:
    """A :class:`Pack` of :func:`encode_pack`'s bytes.

    Raises:
        ValueError: bytes of an unknown format (written by a newer pgdash), or damaged.
    """
    data = bytes(data)  # PostgreSQL drivers hand out memoryviews
    if not data or data[0] not in _payload_decoders:
        raise ValueError(f"pack has format {data[:1].hex() or 'empty'}; this pgdash reads "
                         "formats 01 and 02 only")
    try:
        raw = zlib.decompress(data[1:])
    except zlib.error as exc:
        raise ValueError(f"pack cannot be read: {exc}") from None
    return Pack(raw, data[0])


def decode_pack(data: bytes, after: int = 0, upto: int | None = None) -> list[dict[str, Any]]:
    """The StoredEvent dicts of :func:`encode_pack`'s bytes with ids in (after, upto]."""
    return list(open_pack(data).events(after, upto))
