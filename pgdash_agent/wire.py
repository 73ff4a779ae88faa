"""The wire format between agent and server: message shapes, limits and their validation.

Both sides import this module (it imports only the standard library and msgspec), so a shape
is defined exactly once. The agent builds events with :func:`event`; the server checks every
inbound message with :func:`validate_auth` and :func:`validate_batch` before it stores anything.

An agent connects to the Socket.IO namespace :data:`AGENT_NAMESPACE` with an :class:`Auth`
payload, then emits ``batch`` messages (:class:`Batch`) and waits for each :class:`Ack`.
Every event carries a per-session sequence number; the server keeps the highest one stored per
session and ignores anything at or below it, so resending after a reconnect is always safe.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Optional, TypedDict

import msgspec

PROTOCOL_VERSION = 1  # the Socket.IO ``/agent`` namespace: every agent since 0.1 speaks it
PROTOCOL_V2 = 2  # the compact path: MessagePack frames on a plain websocket (see below)
PROTOCOL_VERSIONS = (PROTOCOL_VERSION, PROTOCOL_V2)
AGENT_V2_PATH = "/agent/v2"
READER_PATH = "/agent/v2/reader"  # a host reader's connection (pgdash_agent.reader)
# A host relay's connection (pgdash_agent.relay): the v2 connections of a host's ranks
# carried on one websocket. Its hello is a host reader's (the auth of the rank that started
# it, with ``reader``: the relay's pid); then, either way, RelayFrame maps.
RELAY_PATH = "/agent/v2/relay"
AGENT_NAMESPACE = "/agent"
UI_NAMESPACE = "/ui"
DEFAULT_PORT = 8686  # `pgdash serve`, and where an agent reports when PGDASH_SERVER is unset
BATCH_EVENT = "batch"
# The server's questions to an agent, on the connection the agent holds: a v2 frame
# ``{"ask": id, "what": "snapshot", "at": t, "reason": text}``, or this Socket.IO event (v1)
# with that map. The
# agent answers with a ``snapshot`` event in its usual stream; it executes nothing it is sent.
ASK_EVENT = "ask"
# What an agent answers; anything else is counted and ignored. "peer": read another rank of
# the same job on this host from outside ({"pid", "rank"}), one whose own agent did not
# answer (its interpreter blocked, e.g. in C with the GIL held); answered as a ``snapshot``
# with ``for_rank``.
ASKS = ("snapshot", "peer")
MAX_ASK_ID = 64
MAX_SNAPSHOT_THREADS = 64
MAX_NATIVE = 16_384  # characters of one thread's native stack (pgdash_agent.native)

# Limits enforced by the server; the agent stays below them by construction.
MAX_BATCH_EVENTS = 500
MAX_TEXT = 65_536  # error texts and stacks are evidence: keep them whole up to this size
MAX_NAME = 256
MAX_RANKS = 1_048_576
MAX_LIST = 10_000
MAX_ENV = 512
MAX_COMMAND = 512  # a Hello's command line
MAX_RELAY_FRAMES = 4096  # agents' frames (or gone channels) in one relay frame
# A relay's frame holds agents' frames up to this many bytes, or one larger frame alone: so it
# is at most this much larger than the largest frame an agent may send.
RELAY_FRAME_BYTES = 1 << 20
MAX_TIME = 1e11  # event times are Unix seconds: anything past the year 5138 is garbage

# Latency histograms: bucket i holds latencies in [2**(i/8), 2**((i+1)/8)) microseconds,
# about 9% wide, so merged percentiles stay within ~9% of the truth at any scale.
HIST_BUCKETS_PER_OCTAVE = 8
# Collectives whose payload size every rank must match: their bytes go into the call
# fingerprint and into what a failure reports of its calls, and only theirs are compared
# between ranks (all_gather's and all_to_all's may differ by rank: uneven gathers, MoE token
# splits; what is reported of them says 0 bytes, or the server reads it so).
SIZED = frozenset({"broadcast", "all_reduce", "all_reduce_coalesced", "reduce",
                   "all_gather_single", "gather", "scatter", "reduce_scatter",
                   "reduce_scatter_single"})
HIST_MAX_BUCKET = 8 * 40  # 2**40 us is ~12 days; anything longer is clamped


def hist_bucket(latency_us: float) -> int:
    """Histogram bucket index of a latency in microseconds."""
    if latency_us <= 1.0:
        return 0
    return min(int(math.log2(latency_us) * HIST_BUCKETS_PER_OCTAVE), HIST_MAX_BUCKET)


def hist_bucket_value(index: int) -> float:
    """Representative latency (geometric middle, in microseconds) of a histogram bucket."""
    return 2.0 ** ((index + 0.5) / HIST_BUCKETS_PER_OCTAVE)


@dataclass
class LatencySummary:
    """One interval of one (group, op) as a ``coll_stats`` row: the wrappers' (agent.
    collectives), and the Flight Recorder reader's (pgdash_agent.flight_stats) before it adds where
    its figures come from."""

    count: int = 0
    bytes: int = 0
    sum_us: float = 0.0
    max_us: float = 0.0
    hist: dict = field(default_factory=dict)

    def add(self, us: float, nbytes: int) -> None:
        self.count += 1
        self.bytes += nbytes
        self.sum_us += us
        if us > self.max_us:
            self.max_us = us
        bucket = hist_bucket(us)
        self.hist[bucket] = self.hist.get(bucket, 0) + 1

    def row(self, group: str, op: str) -> dict[str, Any]:
        return {"group": group, "op": op, "count": self.count, "bytes": self.bytes,
                "sum_us": round(self.sum_us, 3), "max_us": round(self.max_us, 3),
                "hist": sorted([b, c] for b, c in self.hist.items())}


class Auth(TypedDict, total=False):
    """Sent as the Socket.IO ``auth`` payload when an agent connects."""

    v: int
    token: str | None
    session: str  # one per agent process (uuid4 hex); the unit of de-duplication
    job: str  # the job name all ranks of one launch agree on
    rank: int | None
    host: str
    pid: int
    attempt: int  # optional: which restart of the job this process is (0 = first launch)


class Event(TypedDict):
    seq: int  # 1, 2, 3, ... per session
    t: float  # Unix seconds on the agent's clock, when the thing happened
    kind: str
    body: dict[str, Any]


class Batch(TypedDict):
    v: int
    events: list[Event]


class Ack(TypedDict, total=False):
    ok: bool
    stored: int  # events stored by this batch (duplicates are not counted)
    rejected: list[dict[str, Any]]  # [{"seq", "error"}] for events that failed validation
    error: str  # when ok is false: the whole batch was refused
    retry: bool  # when ok is false: whether sending the same batch again can succeed
    retry_after: float  # with retry: seconds to wait first (the connection is rate-limited)
    job: int  # optional (older servers omit it): the id of the job the session is stored in


def event(seq: int, t: float, kind: str, body: dict[str, Any]) -> Event:
    return {"seq": seq, "t": t, "kind": kind, "body": body}


class WireError(ValueError):
    """An inbound message that does not match the wire format; the text says what is wrong."""


# ---------------------------------------------------------------------------------------------
# Validation: one typed shape per message, checked in C by msgspec (decoding and checking a
# batch costs microseconds, where the hand-written checks it replaced cost ~0.3 ms a batch,
# the largest share of the server's work per rank). Unknown fields are accepted and left out
# of what is stored, so newer agents may add optional fields. Errors name the bad field:
# "events[0].body.ranks[1]: ...".

def _limited(kind, **meta):
    return Annotated[kind, msgspec.Meta(**meta)]


_Num = _limited(float, ge=-1e300, le=1e300)  # also refuses NaN and infinities
_Name = _limited(str, max_length=MAX_NAME)
_Text = _limited(str, max_length=MAX_TEXT)
_Rank = _limited(int, ge=0, le=MAX_RANKS)
_Count = _limited(int, ge=0, le=2**63 - 1)
_Int = _limited(int, ge=-(2**63), le=2**63 - 1)
_Size = _limited(int, ge=1, le=MAX_RANKS)
_MaybeRank = _limited(int, ge=-1, le=MAX_RANKS)  # -1: "not set yet" in init_start
_StrMap = _limited(dict[_Name, Optional[_Text]], max_length=MAX_ENV)
_CountMap = _limited(dict[_Name, _Count], max_length=64)
_NumMap = _limited(dict[_Name, Optional[_Num]], max_length=64)


class _Shape(msgspec.Struct, forbid_unknown_fields=False, omit_defaults=True):
    pass


class _HistPair(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """``[bucket, count]`` of a latency histogram (stored as that two-item list)."""

    bucket: _limited(int, ge=0, le=HIST_MAX_BUCKET)
    count: _limited(int, ge=1)


class GroupProgress(_Shape):
    group: _Name
    entered: _Count
    completed: _Count
    inflight_op: Optional[_Name] = None
    inflight_since: Optional[_Num] = None
    inflight_dtype: Optional[_Name] = None
    inflight_bytes: Optional[_Count] = None
    # Optional (newer agents): the global rank a rooted collective in flight names as its root
    # (a broadcast's or scatter's src, a reduce's or gather's dst), and the root of the one
    # numbered ``completed``: ranks must agree on it (desync).
    inflight_root: Optional[_Count] = None
    done_root: Optional[_Count] = None
    # The Flight Recorder's view, which also counts collectives issued from C++ (DDP).
    fr_enqueued: _Count = 0
    fr_completed: _Count = 0
    fr_inflight_since: Optional[_Num] = None
    # Of the recorder's samples since the last heartbeat, how many found one in flight.
    fr_busy: _Count = 0
    fr_samples: _Count = 0
    # Optional (newer agents): the Flight Recorder's number of the wrapped collective in
    # flight, which places a Python-issued collective in the order of C++-issued ones.
    inflight_fr: Optional[_Count] = None
    # ... and the number after the last wrapped one ended: an entry up to it in flight is a
    # Python call that returned (or raised), not a C++-issued collective.
    fr_wrapped: Optional[_Count] = None
    # Optional (newer agents): point-to-point ops posted per "direction:peer:tag" (direction
    # send or recv, peer a global rank, -1 for any source), and the oldest one not complete:
    # its op, peer, tag, number among that key's ops, and since when (Unix seconds).
    p2p_posted: _CountMap = {}
    p2p_op: Optional[_Name] = None
    p2p_peer: Optional[_Int] = None
    p2p_tag: Optional[_Int] = None
    p2p_n: Optional[_Count] = None
    p2p_since: Optional[_Num] = None
    # Optional (newer agents): fingerprints of every collective this rank called on the group
    # (op, reduce op, dtype, root, and the size where ranks' must match), as they stood after
    # the newest collective numbered a multiple of 16, of 256 and of 4,096: ranks whose
    # fingerprints differ at one number called something different, though nothing hung
    # (rules.desync).
    fp: _limited(list[_Mark], max_length=3) = []


class _Mark(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """``[seq, hash]``: a group's call fingerprint as it stood after collective ``seq``."""

    seq: _limited(int, ge=1)
    hash: _limited(int, ge=0, le=0xFFFFFFFF)


class CollRow(_Shape):
    group: _Name
    op: _Name
    count: _Count
    bytes: _Count
    sum_us: _Num
    max_us: _Num
    hist: _limited(list[_HistPair], max_length=HIST_MAX_BUCKET + 1)
    # Optional (newer agents): where the row comes from, "wrapper" (the default) or
    # "flight_recorder" (collectives issued from C++), and how exact its latency is:
    # "device" (NCCL's own timing) or "host_poll" (exact to resolution_us).
    source: Literal["wrapper", "flight_recorder"] = "wrapper"
    timing: Optional[Literal["wrapper", "device", "host_poll"]] = None
    resolution_us: Optional[_Num] = None


COLL_SOURCES = ("wrapper", "flight_recorder")
COLL_TIMINGS = ("wrapper", "device", "host_poll")


class Hello(_Shape):
    """Identity; first event of every session, repeated if it changes (e.g. rank at init)."""

    job: _Name
    host: _Name
    pid: _Count
    rank: Optional[_Rank] = None
    world_size: Optional[_Size] = None
    local_rank: Optional[_Rank] = None
    backend: Optional[_Name] = None
    device: Optional[_Name] = None
    gpu_uuid: Optional[_Name] = None
    versions: _limited(dict[_Name, Optional[_Text]], max_length=64) = {}
    env: _StrMap = {}
    # Optional (older agents omit it): 0 for the first launch, n after n restarts.
    attempt: Optional[_Count] = None
    # Optional (older agents omit them): how the process was started (pgdash_agent.identity.Launch):
    # the program's command line (secrets masked), the launcher (torchrun, slurm, mp.spawn,
    # python) and what tells this launch from another (torchrun's run id, the SLURM step, the
    # rendezvous address).
    command: Optional[_limited(str, max_length=MAX_COMMAND)] = None
    launcher: Optional[_Name] = None
    launcher_id: Optional[_Name] = None


class InitStart(_Shape):
    init_method: Optional[_Text] = None
    backend: Optional[_Name] = None
    world_size: Optional[_MaybeRank] = None
    rank: Optional[_MaybeRank] = None
    master_addr: Optional[_Name] = None
    master_port: Optional[_Name] = None
    timeout_s: Optional[_Num] = None


class InitDone(_Shape):
    rank: _Rank
    world_size: _Size
    duration_s: _Num
    backend: Optional[_Name] = None


class InitFailed(_Shape):
    error_type: _Name
    error: _Text
    duration_s: _Num


class Group(_Shape):
    name: _Name
    ranks: _limited(list[_Rank], max_length=MAX_RANKS)
    desc: Optional[_Name] = None
    backend: Optional[_Name] = None


class CollStats(_Shape):
    start: _Num
    end: _Num
    rows: _limited(list[CollRow], max_length=MAX_LIST)


class Heartbeat(_Shape):
    groups: _limited(list[GroupProgress], max_length=MAX_LIST)
    dropped: _CountMap = {}  # events the agent had to drop, by kind
    buffered: _Count = 0
    # Optional (newer agents): the process's CPU seconds so far (every thread, and its child
    # processes': DataLoader's workers): whether a rank that issues no collectives is working
    # (an evaluation) or blocked (rules.idle)
    cpu_s: Optional[_Num] = None
    # ... and the bytes it read and wrote through system calls so far (Linux: files, pipes,
    # sockets): whether it moves data (a checkpoint written to slow storage) or is blocked
    io_b: Optional[_Count] = None
    # ... and, once the script's main thread has ended while the process lives on, True and
    # the non-daemon threads the interpreter waits for before it exits (rules.idle)
    main_done: bool = False
    holding: _limited(list[_Name], max_length=8) = []
    # Optional (newer agents): how many new_group calls the process made (every rank must
    # make the same, in the same order), and a fingerprint of all of them after each of the
    # newest (oldest first, the last after call ``groups_made``): ranks that differ at one
    # number made another call there
    groups_made: Optional[_Count] = None
    groups_made_fp: _limited(list[_Count], max_length=16) = []


MAX_TRACEBACK_FRAMES = 40  # agent.frames keeps the first few and the innermost rest


class TracebackFrame(_Shape):
    """One frame of an exception's traceback (pgdash_agent.frames): the file as Python names it, the
    line, the function, the source line, and whether the file is the standard library's or an
    installed package's (then the training code's own line is further out)."""

    file: _limited(str, max_length=1024)
    line: _Count
    function: _Name
    code: Optional[_limited(str, max_length=1024)] = None
    library: bool = False


MAX_CAUSES = 4  # how many exceptions of an error's chain (``raise ... from``) come with it


class ErrorCause(_Shape):
    """An exception the reported one was raised from, or while handling."""

    error_type: _Name
    error: _Text


class Error(_Shape):
    where: _Name
    error_type: _Name
    error: _Text
    group: Optional[_Name] = None
    op: Optional[_Name] = None
    seq: Optional[_Count] = None
    # Optional (older agents omit it): the traceback of an exception that ended the program,
    # outermost frame first as Python prints it, pgdash's own frames left out; and how many
    # frames were left out past MAX_TRACEBACK_FRAMES (a deep recursion).
    traceback: Optional[_limited(list[TracebackFrame], max_length=MAX_TRACEBACK_FRAMES)] = None
    traceback_omitted: Optional[_Count] = None
    # Optional (older agents omit it): the exceptions it was raised from or while handling
    # (``raise ... from``, an error in an ``except`` block), nearest first: Python prints them
    # above its traceback, and the first is often the reason (a full disk under torch.save's
    # own error).
    causes: Optional[_limited(list[ErrorCause], max_length=MAX_CAUSES)] = None
    # Optional (newer agents), for a collective that raised: its dtype and bytes, and the
    # collective the rank completed before it on the group, [op, dtype, bytes] (rules.desync:
    # in a size mismatch that aborted another rank, the rank whose size changed is odd).
    dtype: Optional[_Name] = None
    bytes: Optional[_Count] = None
    before: Optional[tuple[_Name, Optional[_Name], _Count]] = None
    # ... and for an exception that ended the program, the last two collectives completed on
    # each group, [group, seq, op, dtype, bytes] (up to 16): ranks that fail together after a
    # collective whose sizes disagreed (a broadcast_object_list of another length) tell the
    # odd one. Bytes are 0 for an op whose size may differ by rank (all_gather, all_to_all).
    last: Optional[_limited(list[tuple[_Name, _Count, _Name, Optional[_Name], _Count]],
                            max_length=16)] = None


class Stack(_Shape):
    """The training thread's Python stack while it sits in one collective for long."""

    group: _Name
    seq: _Count
    op: _Name
    since: _Num
    stack: _Text


class Gpu(_Shape):
    """One reading of this rank's GPU (pgdash_agent.gpu): numbers are None where NVML can't tell."""

    uuid: _Name
    lost: bool
    values: _NumMap
    reasons: _limited(list[_Name], max_length=16)
    xids: _limited(list[_Count], max_length=64)
    name: Optional[_Name] = None


class Exit(_Shape):
    clean: bool
    reason: Optional[_Text] = None
    exitcode: Optional[_Int] = None


class Left(_Shape):
    """The rank left distributed training while its process goes on: it destroyed its
    process group(s) (``group`` None: ``destroy_process_group()``, the default group and with
    it every group). Sent after a heartbeat with its final progress."""

    group: Optional[_Name] = None
    reason: Optional[_Text] = None


class ThreadStack(_Shape):
    """One thread of a snapshot: its Python frames, outermost first, pgdash's hidden."""

    name: _Name
    frames: _limited(list[TracebackFrame], max_length=MAX_TRACEBACK_FRAMES)
    training: bool = False  # the thread that runs the training loop (the main thread)
    omitted: _Count = 0  # frames left out of a deep stack (the outer and inner ends are kept)
    # Native and Python frames as py-spy dumps them, innermost first (asked for: "native")
    native: Optional[_limited(str, max_length=MAX_NATIVE)] = None


class RecentCollective(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """``[group, op, bytes, start, end, seq, source]``: one collective a snapshot's rank
    completed lately (Unix times; seq: the Flight Recorder's sequence number where known;
    source "flight_recorder" for one issued from C++ that only the recorder saw; the last
    two may be left out)."""

    group: _Name
    op: _Name
    bytes: _Count
    start: _Num
    end: _Num
    seq: Optional[_Count] = None
    source: Optional[_Name] = None


class Snapshot(_Shape):
    """A rank's answer to the server's ``ask`` (ASK_EVENT): what every thread is doing and
    where each of its groups is, taken on the agent's own thread."""

    ask: _limited(str, max_length=MAX_ASK_ID)
    threads: _limited(list[ThreadStack], max_length=MAX_SNAPSHOT_THREADS)
    groups: _limited(list[GroupProgress], max_length=MAX_LIST) = []
    # The newest collectives it completed, oldest first (the agent keeps 256 Python issued,
    # 256 issued from C++)
    recent: _limited(list[RecentCollective], max_length=1024) = []
    asked_at: Optional[_Num] = None  # the server's time of the question, echoed
    reason: Optional[_Name] = None  # why the server asked ("incident hang:r2"), echoed
    took_ms: _Num = 0.0  # how long the agent's thread took to answer
    native_error: Optional[_Text] = None  # native frames were asked for: why there are none
    # A "peer" answer: this rank read rank ``for_rank`` (its agent silent) with py-spy from
    # outside; ``peer_dump`` is py-spy's text (threads empty), or native_error says why not.
    for_rank: Optional[_Rank] = None
    peer_dump: Optional[_Text] = None


#: Event kinds an agent may send, and the shape of each body.
EVENT_KINDS: dict[str, type[_Shape]] = {
    "hello": Hello, "init_start": InitStart, "init_done": InitDone, "init_failed": InitFailed,
    "group": Group, "coll_stats": CollStats, "heartbeat": Heartbeat, "error": Error,
    "stack": Stack, "gpu": Gpu, "exit": Exit, "left": Left, "snapshot": Snapshot,
}


_Seq = _limited(int, ge=1, le=2**63 - 1)
_Time = _limited(float, ge=0, lt=MAX_TIME)  # Unix seconds


class _Envelope(_Shape):
    seq: _Seq
    t: _Time
    kind: _Name
    body: dict


class _AuthShape(_Shape):
    v: _Int
    session: _limited(str, max_length=64)
    job: _Name
    token: Optional[_Text] = None
    rank: Optional[_Rank] = None
    host: _Name = ""
    pid: _Count = 0
    attempt: Optional[_Count] = None  # optional; absent from older agents
    # A host reader's hello (pgdash_agent.reader): the auth of the rank that started it, and
    # the reader's own pid. It sends no events; it answers "peer" questions with READ frames.
    reader: Optional[_limited(int, ge=1, le=2**22)] = None


class _Connected(_Shape):
    rank: Optional[_Rank] = None
    host: Optional[_Name] = None
    attempt: Optional[_Count] = None


class _ServerEnvelope(_Shape):
    t: _limited(float, ge=0, lt=MAX_TIME)
    kind: _Name
    body: dict
    seq: None = None


class _Disconnected(_Shape):
    # How long the server had owed the agent an acknowledgement when the connection closed
    # (absent: nothing owed): an agent gives up on a server that is behind and reconnects.
    owed_s: Optional[_limited(float, ge=0, le=1e6)] = None
    # The agent closed the connection itself (a websocket close frame, Socket.IO's disconnect
    # packet) rather than its process vanishing: alive, it gave up on this link (absent: no).
    goodbye: Optional[bool] = None


class Read(_Shape):
    """A host reader's reading of a rank of its host whose agent was silent (a ``peer``
    question, answered from a process of its own: pgdash_agent.reader): sent as
    ``{READ_FRAME: body}`` on the reader's connection, stored by the server as a ``read``
    event of the session that started the reader, with ``reader_pid`` added."""

    ask: _limited(str, max_length=MAX_ASK_ID)
    for_rank: _Rank
    peer_dump: Optional[_Text] = None  # py-spy's text
    native_error: Optional[_Text] = None  # why there is none
    asked_at: Optional[_Num] = None
    reason: Optional[_Name] = None
    took_ms: _Num = 0.0
    reader_pid: Optional[_limited(int, ge=1, le=2**22)] = None  # set by the server


READ_FRAME = "read"


class BoardGroup(_Shape):
    """Where one group's collectives stood on a rank's board (pgdash_agent.board): the fields
    of a heartbeat's GroupProgress that say so."""

    group: _Name
    entered: _Count
    completed: _Count
    inflight_op: Optional[_Name] = None
    inflight_dtype: Optional[_Name] = None
    inflight_bytes: Optional[_Count] = None
    inflight_root: Optional[_Count] = None
    inflight_since: Optional[_Num] = None
    # the call numbered ``completed``, where the board knows it (a call that returned)
    done_op: Optional[_Name] = None
    done_dtype: Optional[_Name] = None
    done_bytes: Optional[_Count] = None


class Ended(_Shape):
    """How a process ended (pgdash_agent.board.how_ended), one of: the signal that killed it
    (its name: ``SIGTERM``), or its exit status, as its wait status said; or
    ``not_sigterm``: not by SIGTERM (its SIGTERM mark stayed empty), how not known."""

    signal: Optional[_Name] = None
    code: Optional[_limited(int, ge=0, le=255)] = None
    not_sigterm: Optional[bool] = None


class BoardRank(_Shape):
    rank: _Rank
    pid: _limited(int, ge=1, le=2**22)
    alive: bool  # whether the process still ran when its board was read
    groups: _limited(list[BoardGroup], max_length=64)
    ended: Optional[Ended] = None  # how it ended, where its reader saw (not alive)


class Boards(_Shape):
    """A host reader's last words: the boards of its launch's ranks on its host, read when
    its parent ended or it was told to stop (pgdash_agent.board). Sent as
    ``{BOARDS_FRAME: body}`` on the reader's connection, stored by the server as a
    ``boards`` event of the session that started the reader, with ``reader_pid`` added."""

    t: _Num
    boards: _limited(list[BoardRank], max_length=256)
    reader_pid: Optional[_limited(int, ge=1, le=2**22)] = None  # set by the server


BOARDS_FRAME = "boards"


class RelayFrame(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """What a host relay (pgdash_agent.relay) and the server send each other after its hello.

    ``relay``: frames of the agents it carries, each ``[channel, frame]``: the very v2 frame
    the agent sent (its hello, its batches) or the server's answer to it (acks, questions);
    a channel is one agent's connection to the relay, numbered by the relay. ``gone`` (relay
    to server): channels whose agent's connection ended, ``[channel, goodbye]`` (goodbye: the
    agent closed it itself: its process is alive; not when the relay closed it, leaving).
    ``closed`` (server to relay): channels the server closed, ``[channel, reason]`` (a
    refused agent)."""

    relay: _limited(list[tuple[_limited(int, ge=0, le=2**31), bytes]],
                    max_length=MAX_RELAY_FRAMES) = []
    gone: _limited(list[tuple[_limited(int, ge=0, le=2**31), bool]],
                   max_length=MAX_RELAY_FRAMES) = []
    closed: _limited(list[tuple[_limited(int, ge=0, le=2**31), _Name]],
                     max_length=MAX_RELAY_FRAMES) = []


_relay_decoder = msgspec.msgpack.Decoder(RelayFrame)
_relay_encoder = msgspec.msgpack.Encoder()


def decode_relay(frame: bytes | str) -> RelayFrame:
    """A relay's frame; raise WireError naming what is wrong with it."""
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise WireError("protocol v2 frames are binary MessagePack; got a text frame")
    try:
        return _relay_decoder.decode(frame)
    except msgspec.DecodeError as exc:
        raise WireError(f"not a relay frame: {exc}") from None


def encode_relay(relay: list | None = None, gone: list | None = None,
                 closed: list | None = None) -> bytes:
    return _relay_encoder.encode(RelayFrame(relay or [], gone or [], closed or []))

#: Event kinds the server itself records (never accepted from an agent), and their bodies.
SERVER_KINDS: dict[str, type[_Shape]] = {"connect": _Connected, "disconnect": _Disconnected,
                                         "read": Read, "boards": Boards}


def _check(value: Any, shape: type, where: str) -> Any:
    try:
        return msgspec.convert(value, shape)
    except msgspec.ValidationError as exc:
        text = str(exc)
        problem, _, path = text.rpartition(" - at `$")
        if not problem:
            problem, path = text, "`"
        field = where + path[:-1]
        missing = _MISSING.match(problem)
        if missing:
            raise WireError(f"{field}.{missing.group(1)} is missing") from None
        raise WireError(f"{field}: {problem}") from None
    except UnicodeError:  # msgspec meets a lone surrogate while matching a text field
        raise WireError(f"{where}: text that is not valid Unicode (a lone surrogate); "
                        "send UTF-8 text") from None


_MISSING = re.compile(r"Object missing required field `(\w+)`$")


def validate_auth(auth: Any) -> Auth:
    """Check an agent's connect payload; raise WireError naming the bad field."""
    _check(auth, _AuthShape, "auth")
    if auth["v"] not in PROTOCOL_VERSIONS:
        raise WireError(
            f"agent speaks protocol v{auth['v']}, this server speaks "
            f"{' and '.join(f'v{v}' for v in PROTOCOL_VERSIONS)}: "
            "install the same pgdash version on the training hosts and the server"
        )
    if not auth["session"] or not auth["job"]:
        raise WireError("auth.session and auth.job must not be empty")
    return auth  # type: ignore[return-value]


def validate_event(ev: Any, where: str = "event") -> Event:
    """Check one event; raise WireError naming the bad field.

    Returns the event as it is to be stored: its body holds exactly the fields checked.
    Fields this version does not know (a newer agent's) are left out, so nothing unchecked
    (a NaN, a list nested thousands deep) reaches the log, the page or an export.
    """
    _check(ev, _Envelope, where)
    shape = EVENT_KINDS.get(ev["kind"])
    if shape is None:
        raise WireError(f"{where}.kind {ev['kind']!r:.60} is not one of {sorted(EVENT_KINDS)}")
    body = _builtins(_check(ev["body"], shape, f"{where}.body"))
    _encodable(body, where)
    return {"seq": ev["seq"], "t": ev["t"], "kind": ev["kind"], "body": body}


def _encodable(body: dict[str, Any], where: str) -> None:
    """Text that is not Unicode (a lone surrogate: JSON's "\\ud800" decodes to one) cannot be
    stored or shown; refuse it here rather than fail the transaction it would be written in."""
    try:
        _json_encoder.encode(body)
    except UnicodeEncodeError:
        raise WireError(f"{where}.body holds text that is not valid Unicode (a lone UTF-16 "
                        "surrogate)") from None


def validate_read(body: Any) -> dict[str, Any]:
    """Check a host reader's reading (:class:`Read`); raise WireError naming the bad field."""
    read = _builtins(_check(body, Read, READ_FRAME))
    _encodable(read, READ_FRAME)
    return read


def validate_boards(body: Any) -> dict[str, Any]:
    """Check a host reader's boards (:class:`Boards`); raise WireError naming the bad field."""
    boards = _builtins(_check(body, Boards, BOARDS_FRAME))
    for i, one in enumerate(boards["boards"]):
        ended = one.get("ended")
        if ended is not None and len(ended) != 1:
            raise WireError(f"{BOARDS_FRAME}.boards[{i}].ended: give one of signal, code and "
                            f"not_sigterm, not {sorted(ended) or 'none'}")
    _encodable(boards, BOARDS_FRAME)
    return boards


def validate_server_event(ev: Any, where: str = "event") -> dict[str, Any]:
    """Check an event the server recorded itself (from an imported session file)."""
    _check(ev, _ServerEnvelope, where)
    body = _builtins(_check(ev["body"], SERVER_KINDS[ev["kind"]], f"{where}.body"))
    _encodable(body, where)
    return {"seq": None, "t": ev["t"], "kind": ev["kind"], "body": body}


_builtins = msgspec.to_builtins


def validate_events(events: Any) -> tuple[list[Event], list[dict[str, Any]]]:
    """Split a list of events into valid ones and per-event rejections.

    Raises WireError when the list itself is wrong (then nothing in it is usable).
    """
    if isinstance(events, CheckedEvents):
        return list(events), []
    if not isinstance(events, list):
        raise WireError("batch.events must be a list")
    if len(events) > MAX_BATCH_EVENTS:
        raise WireError(f"batch has {len(events)} events; the limit is {MAX_BATCH_EVENTS}")
    good, rejected = [], []
    for i, ev in enumerate(events):
        try:
            good.append(validate_event(ev, f"events[{i}]"))
        except WireError as exc:
            seq = ev.get("seq") if isinstance(ev, dict) else None
            rejected.append({"seq": seq if isinstance(seq, int) else None, "error": str(exc)})
    return good, rejected


def validate_batch_envelope(batch: Any) -> None:
    """Check the envelope of a protocol v1 ``batch`` message (not its events)."""
    if not isinstance(batch, dict):
        raise WireError(f"batch must be an object, got {type(batch).__name__}")
    if batch.get("v") != PROTOCOL_VERSION:
        raise WireError(f"batch.v must be {PROTOCOL_VERSION}, got {batch.get('v')!r:.20}")


def validate_batch(batch: Any) -> tuple[list[Event], list[dict[str, Any]]]:
    """A protocol v1 ``batch`` message: its envelope, then :func:`validate_events`."""
    validate_batch_envelope(batch)
    return validate_events(batch.get("events"))


# ---------------------------------------------------------------------------------------------
# Protocol v2: the compact path. A plain websocket at AGENT_V2_PATH on the server's own port,
# binary MessagePack frames, no Socket.IO layers, served without a thread per connection.
#
#   agent -> server, first frame: {"auth": Auth with v=2}
#   server -> agent:               {"ok": true} or {"ok": false, "error": "...", "retry": bool}
#                                  (then the server closes)
#   agent -> server:               {"id": n, "events": [Event, ...]}
#   server -> agent:               Ack plus {"id": n}, once the events are committed
#
# Events are exactly those of v1; only the framing differs.

def encode_v2(message: dict[str, Any]) -> bytes:
    return _msgpack_encoder.encode(message)


def decode_v2(frame: bytes | str) -> Any:
    """Decode one v2 frame; raise WireError when it is not MessagePack."""
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise WireError("protocol v2 frames are binary MessagePack; got a text frame")
    try:
        return msgspec.msgpack.decode(frame)
    except msgspec.DecodeError as exc:
        raise WireError(f"frame is not valid MessagePack: {exc}") from None


class CheckedEvents(list):
    """Events :func:`decode_v2_batch` decoded straight into their shapes: each is what
    :func:`validate_event` returns for it, so :func:`validate_events` passes them as they are."""


class _RawEvent(msgspec.Struct):
    seq: _Seq
    t: _Time
    kind: _Name
    body: msgspec.Raw  # decoded with its kind's shape


class _RawBatch(msgspec.Struct):
    id: int
    events: _limited(list[_RawEvent], max_length=MAX_BATCH_EVENTS)


_raw_batch = msgspec.msgpack.Decoder(_RawBatch)
_body_decoders = {kind: msgspec.msgpack.Decoder(shape) for kind, shape in EVENT_KINDS.items()}


def decode_v2_batch(frame: bytes) -> tuple[int, CheckedEvents] | None:
    """A v2 batch frame whose events are all valid, decoded straight from MessagePack into
    their shapes (half the server's cost per batch of :func:`decode_v2` and then
    :func:`validate_events`, which build every body as dicts first); None for any other
    frame, which those two then read, so that every error is theirs and names its field.

    Nothing is checked less: the shapes are the same, and MessagePack text is UTF-8 checked
    as it is decoded (no lone surrogate can arrive, which :func:`_encodable` looks for in
    JSON). An event time sent as an integer is read as a float.
    """
    try:
        batch = _raw_batch.decode(frame)
        return batch.id, CheckedEvents(
            {"seq": ev.seq, "t": ev.t, "kind": ev.kind,
             "body": _builtins(_body_decoders[ev.kind].decode(ev.body))}
            for ev in batch.events)
    except (msgspec.DecodeError, KeyError, TypeError):  # TypeError: a text frame
        return None


def _plain(value: Any) -> Any:
    """What msgspec cannot encode as is: subclasses of plain types (torch's TorchVersion is a
    str), numpy scalars; anything else as its repr rather than a failed batch."""
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    if hasattr(value, "item"):
        return value.item()
    return repr(value)


_msgpack_encoder = msgspec.msgpack.Encoder(enc_hook=_plain)
_json_encoder = msgspec.json.Encoder()
