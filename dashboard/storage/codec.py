"""Codec: the compact bytes of stored event bodies and of stored JobState checkpoints.

No SQL here (dashboard.storage stores the bytes; packs of many events have their own format,
dashboard.storage.packformat). Two formats, each led by a version byte so
that a later format can be added beside them and every stored row stays readable:

- event bodies, ``b"\\x01"`` + zlib(MessagePack(body)) with a preset dictionary. An agent's
  bodies are small (40 B - 2 kB) and mostly the same keys and op names again, which plain
  zlib cannot learn from one body; the preset dictionary teaches it. **Never edit
  ``_BODY_DICT_V1``**: rows written with it need exactly these bytes to be read. A better
  dictionary is a new version byte. ``b"\\x02"`` + MessagePack(body): the same body
  uncompressed, for rows the compactor packs within minutes (dashboard.storage.packs
  compresses a whole cell far better); zlib of one body cost the writer ~20 us, a fifth of a
  1,024-rank server's CPU.
- checkpoints, ``b"\\x01"`` + zlib(pickle(state)). Pickle is only safe on bytes pgdash itself
  wrote: these rows come from the server alone (``Rewind``), and :func:`decode_state` still
  refuses any class outside an allow-list, so a tampered row fails instead of running code.
"""

from __future__ import annotations

import contextlib
import gc
import io
import pickle
import threading
import zlib
from typing import Any, Iterator

import msgspec

BODY_V1 = 1
BODY_PLAIN = 2
_PLAIN = bytes((BODY_PLAIN,))
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


def encode_body(body: dict[str, Any], compress: bool = True) -> bytes:
    """The stored form of an event body: compact, or (``compress`` false) plain MessagePack,
    for a row that is packed soon."""
    if not compress:
        return _PLAIN + _encoder.encode(body)
    z = zlib.compressobj(6, zdict=_BODY_DICT_V1)
    return bytes((BODY_V1,)) + z.compress(_encoder.encode(body)) + z.flush()


class RawBody(bytes):
    """An event body left as its MessagePack bytes: what the compactor moves from rows into
    packs without looking inside (decoding every body of a 256-rank cell made ~30 objects
    per event, and the garbage collector's scans of them were two thirds of compaction's
    time). :func:`body_of` decodes one where it must be read."""

    __slots__ = ()


def body_of(body: dict[str, Any] | RawBody) -> dict[str, Any]:
    """An event body as a dict, whether it is one already or a :class:`RawBody`."""
    return _decoder.decode(body) if isinstance(body, RawBody) else body


def raw_body(data: bytes) -> RawBody:
    """:func:`encode_body`'s bytes as a :class:`RawBody` (decompressed, not decoded).

    Raises:
        ValueError: bytes of an unknown format.
    """
    data = bytes(data)
    if data[:1] == _PLAIN:
        return RawBody(data[1:])
    if not data or data[0] != BODY_V1:
        raise ValueError(f"stored event body has format {data[:1].hex() or 'empty'}; this "
                         "pgdash reads formats 01 and 02: upgrade pgdash to read this "
                         "database")
    z = zlib.decompressobj(zdict=_BODY_DICT_V1)
    return RawBody(z.decompress(data[1:]) + z.flush())


def decode_body(data: bytes) -> dict[str, Any]:
    """An event body from :func:`encode_body`'s bytes.

    Raises:
        ValueError: bytes of an unknown format (written by a newer pgdash).
    """
    return _decoder.decode(raw_body(data))  # bytes(): PostgreSQL hands out memoryviews


# -- checkpoints ----------------------------------------------------------------------------

# What a JobState is made of; anything else in a checkpoint row means it was not ours.
_ALLOWED = {
    ("dashboard.state.job", "JobState"), ("dashboard.state.records", "RankState"),
    ("dashboard.state.latency", "LatencyStats"), ("dashboard.state.recent", "RecentWindows"),
    ("dashboard.state.readings", "GpuHistory"), ("dashboard.state.totals", "LatencyTable"),
    # Where checkpoints stored before dashboard.state became a package name them
    ("dashboard.state", "JobState"), ("dashboard.state", "RankState"),
    ("dashboard.state", "LatencyStats"), ("collections", "deque"),
    ("collections", "Counter"), ("collections", "OrderedDict"), ("builtins", "set"),
    ("builtins", "frozenset"), ("builtins", "dict"), ("builtins", "list"),
    ("builtins", "tuple"), ("copyreg", "_reconstructor"), ("builtins", "object"),
    # What a replay folds: the state with its findings book (dashboard.diagnosis.timeline, .book)
    ("dashboard.diagnosis.timeline", "Timeline"), ("dashboard.diagnosis.book", "Book"),
    ("dashboard.diagnosis.core", "Settings"), ("dashboard.diagnosis.core", "Severity"),
    ("dashboard.statuses", "RankStatus"), ("dashboard.statuses", "JobStatus"),
}
# Where checkpoints stored by earlier versions found the statuses: the agent's wire module,
# first named ``agent``, then ``pgdash_agent``.
_MOVED = {"agent.wire": "dashboard.statuses", "pgdash_agent.wire": "dashboard.statuses"}
# Single classes that left a module whose other classes stayed: (module, name) -> new home.
# Timeline lived beside Book in dashboard.diagnosis.book until replay got its own module.
_MOVED_CLASSES = {
    ("dashboard.diagnosis.book", "Timeline"): ("dashboard.diagnosis.timeline", "Timeline"),
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        module = _MOVED.get(module, module)
        module, name = _MOVED_CLASSES.get((module, name), (module, name))
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
        with gc_paused():
            return _Unpickler(io.BytesIO(zlib.decompress(data[1:]))).load()
    except (pickle.UnpicklingError, zlib.error, EOFError) as exc:
        raise ValueError(f"stored checkpoint cannot be read: {exc}") from None


_gc_lock = threading.Lock()
_gc_pauses = 0  # threads inside gc_paused()
_gc_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off meanwhile (process-wide; nested and concurrent uses
    count). Unpickling a 256-rank state makes about a million objects, each of which a
    collection of the server's whole heap then scans, over and over: 0.98 s with it, 0.12 s
    without. Nothing those objects hold is garbage yet, so nothing is lost by waiting."""
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()
