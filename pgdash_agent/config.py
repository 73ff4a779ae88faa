"""Agent settings: every knob is an argument of ``attach()`` or a ``PGDASH_*`` environment variable."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

ENV_PREFIX = "PGDASH_"
# PGDASH_RELAY=auto relays jobs of this many ranks or more, each host's ranks on one
# connection: there it took 17% off the server's CPU; at 512 ranks 2%, for a page 0.2-0.3 s
# staler (each frame held for its neighbours'): bench/capacity.py --wire v2,relay
RELAY_AUTO_RANKS = 1024


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """What the agent needs to know; see README "Configuration" for each variable."""

    server: str | None = None  # PGDASH_SERVER, e.g. http://127.0.0.1:8686; None disables sending
    token: str | None = None  # PGDASH_TOKEN
    job: str | None = None  # PGDASH_JOB; derived from the launch when unset
    max_buffered_events: int = 20_000  # PGDASH_MAX_BUFFERED_EVENTS: outbox bound
    max_records: int = 65_536  # PGDASH_MAX_RECORDS: collectives not yet summarised
    max_batch_events: int = 200  # PGDASH_MAX_BATCH_EVENTS
    max_inflight_batches: int = 4  # PGDASH_MAX_INFLIGHT_BATCHES: unacked batches on the wire
    interval_s: float = 1.0  # PGDASH_INTERVAL_S: heartbeat period (and the most a summary spans)
    # PGDASH_STATS_INTERVAL_S: latency summary (coll_stats) period, at most interval_s. Half a
    # second lets the server name a straggler within ~30 steps of 60 ms (bench/detect.py):
    # its rule needs the others' waits of a dozen collectives that all came after it slowed.
    stats_interval_s: float = 0.5
    ack_timeout_s: float = 10.0  # PGDASH_ACK_TIMEOUT_S: no ack by then means a broken link
    connect_timeout_s: float = 5.0  # PGDASH_CONNECT_TIMEOUT_S
    flush_timeout_s: float = 5.0  # PGDASH_FLUSH_TIMEOUT_S: how long detach()/exit waits
    reconnect_max_s: float = 10.0  # PGDASH_RECONNECT_MAX_S: backoff cap
    async_poll_s: float = 0.002  # PGDASH_ASYNC_POLL_S: completion check for async_op works
    stack_after_s: float = 2.0  # PGDASH_STACK_AFTER_S: capture the stack of a collective this old
    gpu: bool = True  # PGDASH_GPU: 0 turns GPU sampling (NVML) off
    # PGDASH_WIRE: auto (the compact protocol v2, or v1 with a server too old for it), v2, v1
    wire: str = "auto"
    # PGDASH_CA_FILE: PEM file of the CA that signed an https server's certificate (a
    # self-signed one); unset, the system's CAs are trusted. The certificate is always checked.
    ca_file: str | None = None
    # Collectives issued from C++ (DDP, functional), from the Flight Recorder's entries:
    flight_stats: bool = True  # PGDASH_FLIGHT_STATS: 0 turns them off
    fr_read_s: float = 1.0  # PGDASH_FR_READ_S: least time between two full reads
    fr_budget: float = 0.005  # PGDASH_FR_BUDGET: most share of one core the reads may take
    fr_poll_s: float = 0.05  # PGDASH_FR_POLL_S: status polls that time their completion
    # PGDASH_DDP_HOOK: 0 leaves DDP models unhooked (see agent.ddp: their gradient all-reduce
    # then shows only in the Flight Recorder, untimed on gloo)
    ddp_hook: bool = True
    # PGDASH_PEER_READ: 0 keeps Yama's rule (only ancestors may ptrace this rank), so that
    # another rank of its host cannot read it with py-spy if it blocks with the GIL held
    # (see pgdash_agent.native.allow_peer_reads; only where py-spy is installed)
    peer_read: bool = True
    # PGDASH_HOST_READER: 0 starts no host reader (pgdash_agent.reader: a process of its own,
    # started by the host's first rank where py-spy is installed, that reads this host's ranks
    # blocked with the GIL held when no other rank of the host can)
    host_reader: bool = True
    # PGDASH_RELAY: whether the host reader also starts the host's relay (pgdash_agent.relay, a
    # process of its own): one connection to the server per host, its ranks' frames held up to
    # 0.2 s to travel together. auto: in jobs of RELAY_AUTO_RANKS ranks or more, where the
    # server's per-connection work counts (a smaller job would gain little and see its page a
    # little staler); 1: in any job of more than one rank on the host; 0: never.
    relay: str = "auto"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "AgentConfig":
        """Build from PGDASH_* variables, then explicit (non-None) overrides.

        Raises:
            ValueError: a variable or option has the wrong type; the message names it.
        """
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            var = ENV_PREFIX + field.name.upper()
            if var in environ and environ[var] != "":
                values[field.name] = _parse(field, environ[var], var)
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(
                f"attach() got unknown option(s) {sorted(unknown)}; "
                f"known: {sorted(f.name for f in dataclasses.fields(cls))}"
            )
        for name, value in overrides.items():
            if value is not None:
                field = next(f for f in dataclasses.fields(cls) if f.name == name)
                values[name] = _parse(field, value, f"attach({name}=...)")
        config = cls(**values)
        if config.wire not in ("auto", "v1", "v2"):
            raise ValueError(f"{ENV_PREFIX}WIRE must be auto, v1 or v2, got {config.wire!r}")
        relay = config.relay.strip().lower()
        if relay != "auto":
            on = _switch(relay)
            if on is None:
                raise ValueError(f"{ENV_PREFIX}RELAY must be auto, 1 or 0, got {config.relay!r}")
            relay = "on" if on else "off"
        config = dataclasses.replace(config, relay=relay)
        if config.ca_file is not None:
            try:
                with open(config.ca_file, "rb"):
                    pass
            except OSError as exc:
                raise ValueError(f"PGDASH_CA_FILE {config.ca_file} cannot be read: "
                                 f"{exc.strerror or exc}") from None
        if config.stats_interval_s > config.interval_s and "stats_interval_s" not in values:
            # The default half second, with a heartbeat period set shorter: follow that.
            config = dataclasses.replace(config, stats_interval_s=config.interval_s)
        elif config.stats_interval_s > config.interval_s:
            raise ValueError(f"{ENV_PREFIX}STATS_INTERVAL_S ({config.stats_interval_s:g}) must "
                             f"be at most {ENV_PREFIX}INTERVAL_S ({config.interval_s:g}): "
                             "summaries are sent at least once per heartbeat")
        for field in dataclasses.fields(cls):
            value = getattr(config, field.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
                raise ValueError(f"{ENV_PREFIX}{field.name.upper()} must be positive, got {value}")
        return config


def _parse(field: dataclasses.Field, raw: Any, source: str) -> Any:
    kind = field.type if isinstance(field.type, str) else field.type.__name__
    try:
        if kind == "bool":
            on = _switch(str(raw).strip().lower())
            if on is None:
                raise ValueError(raw)
            return on
        if kind.startswith("int"):
            return int(raw)
        if kind.startswith("float"):
            return float(raw)
        return str(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{source} must be a {kind.split(' ')[0]}, got {raw!r}") from None


def _switch(text: str) -> bool | None:
    """A setting's on/off word (lower case) as True or False; None for any other."""
    if text in ("1", "true", "yes", "on"):
        return True
    return False if text in ("0", "false", "no", "off") else None


def relays(setting: str, world: int | None, local_world: str | None) -> bool:
    """Whether a job of ``world`` ranks (None: not known) whose host runs ``local_world`` of
    them (``LOCAL_WORLD_SIZE``, None when not set) relays its host's ranks, at ``setting``
    (AgentConfig.relay)."""
    if setting == "off" or local_world == "1":
        return False
    return setting == "on" or (world is not None and world >= RELAY_AUTO_RANKS)
