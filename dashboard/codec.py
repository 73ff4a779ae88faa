"""Codec: the compact bytes of stored event bodies and of stored JobState checkpoints.

No SQL here (dashboard.storage stores the bytes). Two formats, each led by a version byte so
that a later format can be added beside them and every stored row stays readable:

- event bodies, ``b"\\x01"`` + zlib(MessagePack(body)) with a preset dictionary. An agent's
  bodies are small (40 B - 2 kB) and mostly the same keys and op names again, which plain
  zlib cannot learn from one body; the preset dictionary teaches it. **Never edit
  ``_BODY_DICT_V1``**: rows written with it need exactly these bytes to be read. A better
  dictionary is a new version byte.
- checkpoints, ``b"\\x01"`` + zlib(pickle(state)). Pickle is only safe on bytes pgdash itself
  wrote: these rows come from the server alone (``Rewind``), and :func:`decode_state` still
  refuses any class outside an allow-list, so a tampered row fails instead of running code.
"""

from __future__ import annotations

import array
import bisect
import io
import itertools
import pickle
import zlib
from typing import Any, Iterator, Optional

import msgspec

BODY_V1 = 1
STATE_V1 = 1
# zlib level of checkpoints: at 256 ranks (a 10.6 MB pickle) level 6 stores 19% less than
# level 1 (2.66 against 3.29 MB) for 0.2 s more on the writer thread every PGDASH_CHECKPOINT_S,
# and inflates faster (21 against 29 ms). Any level reads back with the same format byte.
STATE_LEVEL = 6

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


def _dictionary_v1() -> bytes:
    """What an agent's bodies are made of: keys, op names, typical values (frozen, see above)."""
    keys = ("groups", "group", "entered", "completed", "inflight_op", "inflight_since",
            "inflight_seq", "dropped", "buffered", "fr_busy", "fr_samples", "start", "end",
            "rows", "op", "count", "bytes", "sum_us", "max_us", "hist", "source", "timing",
            "resolution_us", "wrapper", "flight_recorder", "host_poll", "uuid", "name", "lost",
            "reasons", "xids", "values", "util_gpu", "util_mem", "mem_used", "mem_total",
            "temp_c", "power_w", "power_limit_w", "sm_clock_mhz", "sm_clock_max_mhz",
            "ecc_uncorrected", "ecc_corrected", "pcie_replay", "remapped_correctable",
            "remapped_uncorrectable", "remap_pending", "remap_failure", "all_reduce",
            "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "barrier", "send",
            "recv", "all_to_all_single", "gather", "NVIDIA H200", "NVIDIA H100 80GB HBM3",
            "GPU-", "coll_stats", "heartbeat")
    sample = [
        {"groups": [{"group": "0", "entered": 2000, "completed": 2000, "inflight_op": None,
                     "inflight_since": None}], "dropped": {}, "buffered": 0},
        {"start": 1.7e9, "end": 1.7e9, "rows": [
            {"group": "0", "op": "all_reduce", "count": 20, "bytes": 83886080,
             "sum_us": 20000.0, "max_us": 4000.0,
             "hist": [[77, 1], [78, 2], [79, 3], [80, 1], [81, 2], [82, 1], [83, 1], [84, 2]]}]},
        {"uuid": "GPU-0", "name": "NVIDIA H200", "lost": False, "reasons": [], "xids": [],
         "values": {"util_gpu": 97.0, "util_mem": 40.0, "mem_used": 7.1e10,
                    "mem_total": 1.4e11, "temp_c": 61.0, "power_w": 600.0,
                    "power_limit_w": 700.0, "sm_clock_mhz": 1980.0,
                    "sm_clock_max_mhz": 1980.0, "ecc_uncorrected": 0.0, "ecc_corrected": 0.0,
                    "pcie_replay": 0.0, "remapped_correctable": 0.0,
                    "remapped_uncorrectable": 0.0, "remap_pending": 0.0,
                    "remap_failure": 0.0}},
    ]
    # zlib favours the dictionary's end for short matches: the samples go last.
    return b"".join(_encoder.encode(k) for k in keys) + b"".join(map(_encoder.encode, sample))


_BODY_DICT_V1 = _dictionary_v1()


def encode_body(body: dict[str, Any]) -> bytes:
    """The compact stored form of an event body."""
    z = zlib.compressobj(6, zdict=_BODY_DICT_V1)
    return bytes((BODY_V1,)) + z.compress(_encoder.encode(body)) + z.flush()


def decode_body(data: bytes) -> dict[str, Any]:
    """An event body from :func:`encode_body`'s bytes.

    Raises:
        ValueError: bytes of an unknown format (written by a newer pgdash).
    """
    data = bytes(data)  # PostgreSQL drivers hand out memoryviews
    if not data or data[0] != BODY_V1:
        raise ValueError(f"stored event body has format {data[:1].hex() or 'empty'}; this "
                         "pgdash reads format 01 only: upgrade pgdash to read this database")
    z = zlib.decompressobj(zdict=_BODY_DICT_V1)
    return _decoder.decode(z.decompress(data[1:]) + z.flush())


# -- checkpoints ----------------------------------------------------------------------------

# What a JobState is made of; anything else in a checkpoint row means it was not ours.
_ALLOWED = {
    ("dashboard.state", "JobState"), ("dashboard.state", "RankState"),
    ("dashboard.state", "LatencyStats"), ("collections", "deque"),
    ("collections", "Counter"), ("collections", "OrderedDict"), ("builtins", "set"),
    ("builtins", "frozenset"), ("builtins", "dict"), ("builtins", "list"),
    ("builtins", "tuple"), ("copyreg", "_reconstructor"), ("builtins", "object"),
    # What a replay folds: the state with its findings book (dashboard.diagnosis.book)
    ("dashboard.diagnosis.book", "Timeline"), ("dashboard.diagnosis.book", "Book"),
    ("dashboard.diagnosis.core", "Settings"), ("dashboard.diagnosis.core", "Severity"),
    ("agent.wire", "RankStatus"), ("agent.wire", "JobStatus"),
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"checkpoint refers to {module}.{name}, which a "
                                         "JobState never holds: the row was not written by "
                                         "pgdash; delete it from the checkpoints table")
        return super().find_class(module, name)


def encode_state(fold: Any, level: int = STATE_LEVEL) -> bytes:
    """A checkpoint's bytes: a JobState, or a Timeline holding one (the state's memo caches
    left out: they rebuild on use). ``level``: zlib's (1 for copies kept in memory)."""
    return compress_state(pickle_state(fold), level)


def pickle_state(fold: Any) -> bytes:
    """The first half of :func:`encode_state`: what must be taken while nothing folds into
    the state (the second, :func:`compress_state`, may run elsewhere)."""
    state = getattr(fold, "state", fold)
    memo = (state._memo, state._summary_memo, state._ranks_memo)
    state._memo, state._summary_memo, state._ranks_memo = {}, None, None
    try:
        return pickle.dumps(fold, protocol=pickle.HIGHEST_PROTOCOL)
    finally:
        state._memo, state._summary_memo, state._ranks_memo = memo


def compress_state(raw: bytes, level: int = STATE_LEVEL) -> bytes:
    return bytes((STATE_V1,)) + zlib.compress(raw, level)


def decode_state(data: bytes) -> Any:
    """The JobState or Timeline of :func:`encode_state`'s bytes.

    Raises:
        ValueError: an unknown format, or a row pgdash did not write.
    """
    data = bytes(data)
    if not data or data[0] != STATE_V1:
        raise ValueError(f"stored checkpoint has format {data[:1].hex() or 'empty'}; this "
                         "pgdash reads format 01 only")
    try:
        return _Unpickler(io.BytesIO(zlib.decompress(data[1:]))).load()
    except (pickle.UnpicklingError, zlib.error, EOFError) as exc:
        raise ValueError(f"stored checkpoint cannot be read: {exc}") from None




# -- packs: one compaction cell of a job's log ------------------------------------------------

PACK_V1 = 1
PACK_LEVEL = 6  # zlib level of packs (bench/packs.py measured levels, dictionary and lzma)

_payload_decoder = msgspec.msgpack.Decoder(tuple[
    int, list[int], list[str], list[int], list[Optional[int]], bytes, bytes, list[str],
    list[int], list[int], bytes])


def _untransposed(kidx: list[int], lengths: list[int], blob: bytes) -> list[memoryview]:
    """Each event's body bytes, from pack_payload's transposed groups (no copy per body)."""
    if len(lengths) != len(kidx) or sum(lengths) != len(blob):
        raise ValueError("its bodies' lengths do not add up")
    groups: dict[tuple[int, int], list[int]] = {}
    for i, key in enumerate(zip(kidx, lengths)):
        groups.setdefault(key, []).append(i)
    bodies: list[Any] = [None] * len(kidx)
    pos = 0
    for (_, size), members in groups.items():
        m = len(members)
        rows = bytearray(m * size)
        for j in range(size):
            rows[j::size] = blob[pos + j * m:pos + (j + 1) * m]
        pos += m * size
        view = memoryview(rows)
        for r, i in enumerate(members):
            bodies[i] = view[r * size:(r + 1) * size]
    return bodies


def _shuffled(values: list[float]) -> bytes:
    """Floats as their 8-byte forms, byte planes apart: arrival times of one minute share
    their leading bytes, which then lie together for the compressor."""
    raw = array.array("d", values).tobytes()
    return b"".join(raw[i::8] for i in range(8))


def _unshuffled(data: bytes, n: int) -> list[float]:
    raw = bytearray(8 * n)
    for i in range(8):
        raw[i::8] = data[i * n:(i + 1) * n]
    return array.array("d", bytes(raw)).tolist()


def encode_pack(events: list[dict[str, Any]], level: int = PACK_LEVEL) -> bytes:
    """A pack's bytes: ``b"\\x01"`` + zlib(:func:`pack_payload`). **A frozen format**: a
    change is a new version byte, and this one stays readable."""
    return bytes((PACK_V1,)) + zlib.compress(pack_payload(events), level)


def pack_payload(events: list[dict[str, Any]]) -> bytes:
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
    """
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
    bodies = [_encoder.encode(ev["body"]) for ev in events]
    lengths = [len(b) for b in bodies]
    groups: dict[tuple[int, int], list[bytes]] = {}
    for k, body in zip(kidx, bodies):
        groups.setdefault((k, len(body)), []).append(body)
    blob = []
    for (_, size), members in groups.items():
        rows = b"".join(members)
        blob.extend(rows[j::size] for j in range(size))
    return _encoder.encode([
        n, ids, list(sessions), sidx, seqs, _shuffled([ev["t"] for ev in events]),
        _shuffled([ev["received_at"] for ev in events]), list(kinds), kidx, lengths,
        b"".join(blob)])


class Pack:
    """A pack opened for reading: its ids at once, each event's dict only when asked for.

    Bodies stay MessagePack (views of the payload's regrouped bytes) until their event is
    built, so that a pack of a 1,024-rank cell costs its payload's bytes in memory, not a
    few hundred megabytes of dicts, and ids at or below ``after`` cost no dict at all.
    """

    __slots__ = ("ids", "_sessions", "_sidx", "_seqs", "_t", "_r", "_kinds", "_kidx",
                 "_bodies")

    def __init__(self, raw: bytes):
        try:
            (n, deltas, self._sessions, self._sidx, seq_d, t_raw, r_raw, self._kinds,
             self._kidx, lengths, blob) = _payload_decoder.decode(raw)
            self.ids = list(itertools.accumulate(deltas))
            self._bodies = _untransposed(self._kidx, lengths, blob)
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
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError,
                IndexError) as exc:
            raise ValueError(f"pack cannot be read: {exc}") from None

    def events(self, after: int = 0, upto: int | None = None) -> Iterator[dict[str, Any]]:
        """StoredEvent dicts of the ids in (after, upto], in id order."""
        ids, sessions, sidx, kinds, kidx = self.ids, self._sessions, self._sidx, \
            self._kinds, self._kidx
        seqs, ts, rs, bodies, body = self._seqs, self._t, self._r, self._bodies, \
            _decoder.decode
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
    if not data or data[0] != PACK_V1:
        raise ValueError(f"pack has format {data[:1].hex() or 'empty'}; this pgdash reads "
                         "format 01 only")
    try:
        raw = zlib.decompress(data[1:])
    except zlib.error as exc:
        raise ValueError(f"pack cannot be read: {exc}") from None
    return Pack(raw)


def decode_pack(data: bytes, after: int = 0, upto: int | None = None) -> list[dict[str, Any]]:
    """The StoredEvent dicts of :func:`encode_pack`'s bytes with ids in (after, upto]."""
    return list(open_pack(data).events(after, upto))
