"""The in-process agent: hooks into torch.distributed, a background thread, and the sender.

Threads: the training thread only runs the collective wrappers (see ``pgdash_agent.collectives``) and
appends rare events (init, errors) to the outbox. ``pgdash-agent`` polls async works, turns
records into per-second summaries, sends heartbeats and notices new process groups.
``pgdash-sender`` owns the network. Nothing here raises into the training code.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import random
import sys
import threading
import time
import uuid
from typing import Any, Callable, Mapping

from pgdash_agent import frames as pyframes
from pgdash_agent import identity
from pgdash_agent.collectives import CollectiveTracker, GroupTrack
from pgdash_agent.config import AgentConfig
from pgdash_agent.flight import FlightRecorderProbe
from pgdash_agent.ddp import DDPHooks
from pgdash_agent.flight_stats import FlightStats
from pgdash_agent.gpu import GpuSampler
from pgdash_agent.outbox import Outbox
from pgdash_agent.sender import Sender
from pgdash_agent.wire import PROTOCOL_VERSION

log = logging.getLogger("pgdash.agent")


def _c10d():
    from torch.distributed import distributed_c10d

    return distributed_c10d


def describe_group(pg: Any) -> tuple[str, str | None, str | None, list[int]] | None:
    """``(name, desc, backend, global ranks)`` of a ProcessGroup from c10d's registry."""
    world = _c10d()._world
    name = world.pg_names.get(pg) if not isinstance(pg, int) else None
    if name is None:
        return None
    backend = (world.pg_map.get(pg) or (None,))[0]
    ranks = sorted(world.pg_group_ranks.get(pg, {}))
    return str(name), getattr(pg, "group_desc", None), str(backend) if backend else None, ranks


def _error_text(exc: BaseException) -> str:
    return str(exc) or repr(exc)


class Agent:
    """One per process; made by :func:`pgdash_agent.attach`.

    Args:
        config: settings (see :class:`~agent.config.AgentConfig`).
        environ: the process environment (injected for tests).
        client_factory: makes the Socket.IO client (injected for tests).
        nvml: the ``pynvml`` module or a stand-in (tests: there is no GPU here).
        gpu_locator: returns this rank's GPU UUID, None while CUDA is not up yet, or False
            without CUDA (tests pretend a GPU with it).
    """

    def __init__(self, config: AgentConfig, environ: Mapping[str, str] | None = None,
                 client_factory: Callable[[], Any] | None = None, nvml: Any = None,
                 gpu_locator: Callable[[], str | None | bool] | None = None):
        self.config = config
        self.environ = os.environ if environ is None else environ
        self.session = uuid.uuid4().hex
        self.job = config.job or identity.job_name(self.environ)
        self.pid = os.getpid()
        self.outbox = Outbox(config.max_buffered_events)
        self.tracker = CollectiveTracker(describe_group, self._on_collective_error,
                                         config.max_records)
        kwargs = {"client_factory": client_factory} if client_factory else {}
        self.sender = Sender(config, self.outbox, self._auth, **kwargs)
        self._wall_offset = time.time() - time.perf_counter()
        self.flight = FlightRecorderProbe(time.time)
        self.tracker.fr_enabled = config.flight_stats
        self.fr_stats = FlightStats(self.flight, self.tracker.fr_wrapped,
                                    self.tracker.fr_open_calls, time.time,
                                    read_every_s=config.fr_read_s, budget=config.fr_budget)
        if config.flight_stats:
            self.flight.on_status = self.fr_stats.note_status
        self._flight: dict[str, dict[str, Any]] = {}  # the last Flight Recorder reading
        self._flight_sample_at = 0.0  # monotonic time of the next sample
        self._nvml = nvml
        self._gpu_locator = gpu_locator or identity.current_gpu_uuid
        self.gpu: GpuSampler | None = None
        self._gpu_checked = not config.gpu  # True once we know whether there is a GPU
        self._xids: list[int] = []  # XIDs not sent yet (kept across disconnects)
        self._identity: dict[str, Any] = {}
        self._init_method: Any = None  # init_process_group's, once called (see _init_start)
        self._announced = False  # the console line naming the job's page (see _announce)
        self._stop = threading.Event()
        self._wake = threading.Event()  # set on stop, and when an async work starts
        self.tracker.wake = self._wake.set
        self._thread = threading.Thread(target=self._loop, name="pgdash-agent", daemon=True)
        self._failed = False
        self._exitcode: int | None = None  # the program's exit status, when it is known
        self._detached = False
        self._patched: list[tuple[Any, str, Any]] = []
        self._pending_stats: list[dict[str, Any]] = []
        # (group, op) -> the last sequence number whose stack was sent: one entry per group,
        # however long the job runs.
        self._stacks_sent: dict[tuple[str, str], int] = {}
        self.ddp = DDPHooks()
        self._stats_start = time.time()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, pg: Any = None) -> "Agent":
        self._send_hello()
        c10d = _c10d()
        import torch.distributed as dist

        self.tracker.install([dist, c10d])
        self.tracker.install_wait(getattr(c10d, "Work", None))
        self._patch_init(dist, c10d)
        self._patch_destroy(dist, c10d)
        if self.config.ddp_hook:
            self.ddp.install()
        if c10d.is_initialized():
            self.tracker.set_default(c10d._world.default_pg)
        if pg is not None:
            self.tracker.track_for(pg)
        self._scan_groups()
        self._previous_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._at_exit)
        self.sender.start()
        self._thread.start()
        return self

    def detach(self, timeout: float | None = None, *, reason: str = "detach") -> bool:
        """Flush what is buffered, report a clean exit and stop. Never raises.

        Returns True if everything was acknowledged by the server within ``timeout`` seconds
        (default PGDASH_FLUSH_TIMEOUT_S); False at once if the server refused the agent.
        """
        if self._detached:
            return True
        self._detached = True
        try:
            self.tracker.enabled = False
            self.tracker.uninstall()
            self.ddp.uninstall()
            for module, name, fn in self._patched:
                setattr(module, name, fn)
            self._stop.set()
            self._wake.set()
            self._thread.join(timeout=2.0)
            if self.gpu is not None:
                self.gpu.close()
            if self.config.flight_stats:  # the last C++ collectives, whatever the budget
                self._read_flight(force=True)
            self._flush_stats(force=True)
            self._heartbeat(force=True)  # final progress, so the page shows where it ended
            self.outbox.put(time.time(), "exit", {"clean": not self._failed, "reason": reason,
                                                  "exitcode": self._exitcode})
            deadline = time.monotonic() + (self.config.flush_timeout_s if timeout is None
                                           else timeout)
            # A server that refused this agent will not take the rest either: training's exit
            # is not held back for it (the refusal was logged when it happened).
            while not self.sender.idle() and not self.sender.refused and \
                    time.monotonic() < deadline:
                time.sleep(0.02)
            flushed = self.sender.idle()
            self._announce()  # a job done before the server answered still says where it is
            self.sender.stop()
            self.sender.join(timeout=2.0)
            return flushed
        except Exception as exc:  # pragma: no cover - defensive
            log.warning("pgdash: detach failed: %s", exc)
            return False

    def stats(self) -> dict[str, Any]:
        """Counters a user (or a test) can read: what was dropped, buffered, rejected."""
        return {
            "session": self.session, "job": self.job, "connected": self.sender.connected,
            "buffered": len(self.outbox), "dropped": self._dropped(),
            "rejected": self.sender.rejected, "last_error": self.sender.last_error,
            "internal_errors": self.tracker.internal_errors,
        }

    # -- what is sent ------------------------------------------------------------------------

    def _auth(self) -> dict[str, Any]:
        return {"v": PROTOCOL_VERSION, "token": self.config.token, "session": self.session,
                "job": self.job, "rank": self._identity.get("rank"),
                "host": self._identity.get("host", ""), "pid": self.pid,
                "attempt": self._identity.get("attempt")}

    def _send_hello(self) -> None:
        launch = identity.launch_of(self.environ, init_method=self._init_method)
        self._identity = identity.hello(self.job, self.environ, launch)
        self.outbox.put(time.time(), "hello", self._identity)

    def _dropped(self) -> dict[str, int]:
        dropped = dict(self.outbox.dropped)
        if self.tracker.dropped_records:
            dropped["collectives"] = self.tracker.dropped_records
        if self.fr_stats.missed:  # Flight Recorder entries overwritten before they were read
            dropped["flight_recorder"] = self.fr_stats.missed
        return dropped

    def _wall(self, perf: float) -> float:
        return perf + self._wall_offset

    def _scan_groups(self) -> None:
        try:
            for pg in list(_c10d()._world.pg_names):
                self.tracker.track_for(pg)
        except Exception:
            pass  # the registry changed under us; next tick sees it
        while self.tracker.new_tracks:
            track: GroupTrack = self.tracker.new_tracks.popleft()
            self.outbox.put(time.time(), "group", {"name": track.name, "desc": track.desc,
                                                   "backend": track.backend,
                                                   "ranks": track.ranks})

    def _flush_stats(self, force: bool = False) -> None:
        """Close the current latency interval; while offline, keep growing it instead."""
        rows = self.tracker.take_summary() + self.fr_stats.take_summary()
        if rows:
            self._pending_stats = _merge_rows(self._pending_stats, rows)
        if self._pending_stats and (self.sender.connected or force):
            now = time.time()
            self.outbox.put(now, "coll_stats", {"start": self._stats_start, "end": now,
                                                "rows": self._pending_stats})
            self._pending_stats = []
            self._stats_start = now
        elif not self._pending_stats:
            self._stats_start = time.time()

    def _read_flight(self, force: bool = False) -> None:
        """Read the Flight Recorder's entries when due (see agent.flight_stats)."""
        try:
            now = time.time()
            if force or self.fr_stats.due(now, self.flight.last_status):
                self.fr_stats.read(now)
        except Exception as exc:
            self.fr_stats.errors += 1
            log.debug("pgdash: flight recorder read: %s", exc)

    def _heartbeat(self, force: bool = False) -> None:
        if not (self.sender.connected or force):
            return  # a stale heartbeat is worth nothing; the next live one says it all
        self._flight = self.flight.read()
        self.outbox.put(time.time(), "heartbeat", {
            "groups": self.tracker.progress(self._wall, self._flight),
            "dropped": self._dropped(), "buffered": len(self.outbox)})

    def _sample_flight(self, now: float) -> None:
        """Between heartbeats, while a group runs collectives Python never sees (DDP's), count
        how often the Flight Recorder finds one in flight: how long this rank waits there.

        Sampled at random moments (PGDASH_FR_POLL_S apart on average): at a fixed period a
        training step of a commensurate length would be seen at the same phase every time.
        """
        if now < self._flight_sample_at:
            return
        self._flight_sample_at = now + random.uniform(0.5, 1.5) * self.config.fr_poll_s
        tracks = self.tracker.by_name
        if self.fr_stats.seen_cpp or any(
                fr["fr_enqueued"] and (name not in tracks or not tracks[name].entered)
                for name, fr in self._flight.items()):
            self.flight.sample()

    def _loop(self) -> None:
        next_tick = time.monotonic() + self.config.interval_s
        next_stats = time.monotonic() + self.config.stats_interval_s
        while not self._stop.is_set():
            try:
                self.tracker.poll_async()
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + self.config.interval_s
                    next_stats = now + self.config.stats_interval_s
                    self._scan_groups()
                    if self.config.flight_stats:
                        self._read_flight()
                    self._flush_stats()
                    self._sample_gpu()
                    self._heartbeat()  # last: the readings waiting leave with it (outbox)
                    self._capture_stuck_stacks()
                elif now >= next_stats:
                    next_stats = now + self.config.stats_interval_s
                    # A summary between heartbeats; not one just before the next heartbeat's.
                    if next_tick - now > 0.5 * self.config.stats_interval_s:
                        self._flush_stats()
                else:
                    self.tracker.summarise()
                    self._sample_flight(now)
                self._announce()
            except Exception as exc:
                self.tracker.internal_errors += 1
                log.debug("pgdash: agent loop: %s", exc)
            wait = self.config.async_poll_s if self.tracker.pending else 0.1
            if self._flight:  # wake for the next sample, not on a fixed 0.1 s grid
                wait = min(wait, max(0.01, self._flight_sample_at - time.monotonic()))
            self._wake.wait(min(wait, max(0.0, min(next_tick, next_stats) - time.monotonic())))
            self._wake.clear()
        try:
            self.tracker.poll_async()
            self._scan_groups()
        except Exception:
            pass

    def _announce(self) -> None:
        """Rank 0 says once, on its console, which job it reports to and where its page is,
        as soon as the server has taken the job (a rank that cannot reach the server says
        that instead: agent.sender). Other ranks stay quiet: one line per job, not per rank.
        Once the program failed, its traceback stays the last thing it printed."""
        if self._announced or self._identity.get("rank") != 0 or not self.sender.accepted \
                or self._failed:
            return
        self._announced = True
        try:
            print(announcement(self.job, self.config.server, self.sender.job_id),
                  file=sys.stderr, flush=True)
        except Exception:  # a closed or broken stderr: nothing to say it on
            pass

    def _sample_gpu(self) -> None:
        """Find this rank's GPU once CUDA is up, then send one reading per interval."""
        if not self._gpu_checked:
            uuid = self._gpu_locator()
            if uuid is False:
                self._gpu_checked = True  # no CUDA in this process: nothing to sample
            elif uuid is not None:
                self._gpu_checked = True
                sampler = GpuSampler(uuid, self._nvml)
                if sampler.start():
                    self.gpu = sampler
                else:
                    log.info("pgdash: no GPU health: %s", sampler.error)
        if self.gpu is None:
            return
        reading = self.gpu.sample()
        if reading is None:
            return
        self._xids.extend(reading["xids"])
        if not self.sender.connected and not self._xids:
            return  # like heartbeats, plain readings are worth sending only live
        reading["xids"], self._xids = self._xids[:64], self._xids[64:]
        self.outbox.put(time.time(), "gpu", reading)

    def _capture_stuck_stacks(self) -> None:
        """Send the Python stack of each thread sitting in one collective for long (once each).

        A blocking collective releases the GIL, so this thread can read the stuck thread's
        frames; the stuck thread is the one with a pgdash wrapper frame on its stack.
        """
        stuck = self.tracker.stuck(self.config.stack_after_s)
        now = time.time()
        python = {t.name for t in stuck}  # the recorder numbers those too: one stack each
        stuck_fr = [(name, fr) for name, fr in self._flight.items()
                    if fr.get("fr_inflight_since") is not None and name not in python
                    and now - fr["fr_inflight_since"] > self.config.stack_after_s]
        if not stuck and not stuck_fr:
            return  # the usual case: no frames to walk
        code = self.tracker.wrapper_code
        frames: dict[int, Any] = {}  # id(track) -> the wrapper frame waiting on it
        threads = sys._current_frames()
        for frame in threads.values():
            while frame is not None and frame.f_code is not code:
                frame = frame.f_back
            if frame is not None:
                frames[id(frame.f_locals.get("track"))] = frame
        # Collectives issued from C++ (DDP) show only in the Flight Recorder, and an async
        # one (DDP's through the agent's comm hook) left its wrapper at once: the training
        # thread is then blocked in C++ under its last Python frame, on the main thread.
        main = threads.get(threading.main_thread().ident)
        for track in stuck:
            frame = frames.get(id(track))
            frame = frame.f_back if frame is not None else main
            inflight = track.inflight
            if frame is not None and inflight is not None:
                self._send_stack(track.name, track.entered, inflight[0],
                                 self._wall(track.inflight_since), frame)
        if main is not None:
            for name, fr in stuck_fr:
                self._send_stack(name, fr["fr_enqueued"], "c++ collective",
                                 fr["fr_inflight_since"], main)

    def _send_stack(self, group: str, seq: int, op: str, since: float, frame: Any) -> None:
        if self._stacks_sent.get((group, op)) == seq:
            return
        self._stacks_sent[(group, op)] = seq
        text = pyframes.format_stack(frame)  # the user's frames, not the agent's wrappers
        self.outbox.put(time.time(), "stack", {"group": group, "seq": seq, "op": op,
                                               "since": since, "stack": text[-60_000:]})

    # -- hooks -------------------------------------------------------------------------------

    def _on_collective_error(self, track: GroupTrack, op: str, seq: int,
                             exc: BaseException) -> None:
        try:
            self.outbox.put(time.time(), "error", {
                "where": "collective", "error_type": type(exc).__name__,
                "error": _error_text(exc), "group": track.name, "op": op, "seq": seq})
        except Exception:
            pass

    def _patch_init(self, *modules: Any) -> None:
        original = modules[0].init_process_group
        if getattr(original, "__pgdash_wrapped__", False):
            return
        signature = inspect.signature(original)
        agent = self

        def init_process_group(*args, **kwargs):
            started = time.time()
            agent._init_start(signature, args, kwargs)
            try:
                result = original(*args, **kwargs)
            except BaseException as exc:
                agent._init_end(started, exc)
                raise
            agent._init_end(started, None)
            return result

        self._replace(modules, init_process_group, original)

    def _replace(self, modules: tuple, fn: Any, original: Any) -> None:
        """Put ``fn`` in place of ``original`` (same name) in each module, and in every
        torch.distributed module loaded already that imported it by name (DeviceMesh's
        ``init_device_mesh`` calls its own ``init_process_group``); undone at detach."""
        name = original.__name__
        fn.__pgdash_wrapped__ = True
        fn.__wrapped__ = original
        fn.__doc__ = original.__doc__
        holders = list(modules) + [
            m for key, m in list(sys.modules.items())
            if key.startswith("torch.distributed") and m not in modules
            and getattr(m, name, None) is original]
        for module in holders:
            self._patched.append((module, name, getattr(module, name)))
            setattr(module, name, fn)

    def _patch_destroy(self, *modules: Any) -> None:
        """Report ``destroy_process_group``: a rank that leaves while its peers still issue
        collectives is the cause of what happens to them next (``rank_exited_early``). The
        final progress goes first, so the server knows how far the rank got."""
        original = modules[0].destroy_process_group
        if getattr(original, "__pgdash_wrapped__", False):
            return
        agent = self

        def destroy_process_group(group=None):
            agent._left(group)
            return original(group)

        self._replace(modules, destroy_process_group, original)

    def _left(self, group: Any) -> None:
        try:
            track = None if group is None else self.tracker.track_for(group)
            if group is not None and track is None:
                return  # not a group of this rank
            self._heartbeat(force=True)
            self.outbox.put(time.time(), "left", {
                "group": None if track is None else track.name,
                "reason": "destroy_process_group"})
        except Exception:
            self.tracker.internal_errors += 1

    def _init_start(self, signature: inspect.Signature, args: tuple, kwargs: dict) -> None:
        try:
            bound = signature.bind_partial(*args, **kwargs).arguments
            timeout = bound.get("timeout")
            self._init_method = bound.get("init_method")  # names the launch in the Hello
            env = self.environ
            self.outbox.put(time.time(), "init_start", {
                "init_method": _str_or_none(bound.get("init_method")),
                "backend": _str_or_none(bound.get("backend")),
                "world_size": _int_or_none(bound.get("world_size", env.get("WORLD_SIZE"))),
                "rank": _int_or_none(bound.get("rank", env.get("RANK"))),
                "master_addr": env.get("MASTER_ADDR"), "master_port": env.get("MASTER_PORT"),
                "timeout_s": timeout.total_seconds() if timeout is not None else None})
        except Exception:
            self.tracker.internal_errors += 1

    def _init_end(self, started: float, exc: BaseException | None) -> None:
        try:
            now = time.time()
            if exc is not None:
                self.outbox.put(now, "init_failed", {"error_type": type(exc).__name__,
                                                     "error": _error_text(exc),
                                                     "duration_s": now - started})
                return
            c10d = _c10d()
            self.tracker.set_default(c10d._world.default_pg)
            self._send_hello()  # rank and world size are certain now
            self.outbox.put(now, "init_done", {"rank": c10d.get_rank(),
                                               "world_size": c10d.get_world_size(),
                                               "backend": str(c10d.get_backend()),
                                               "duration_s": now - started})
            self._scan_groups()
        except Exception:
            self.tracker.internal_errors += 1

    def _excepthook(self, exc_type, exc, tb) -> None:
        try:
            self.note_uncaught(exc_type, exc, tb)
        finally:
            self._previous_excepthook(exc_type, exc, tb)

    def note_uncaught(self, exc_type: type, exc: BaseException, tb: Any = None) -> None:
        """Report an exception that ends the program (the excepthook's, or one a launcher
        caught, e.g. torch.multiprocessing's), with its traceback (``tb``, else the
        exception's own) as the user reads it (pgdash_agent.frames). Never raises."""
        try:
            if os.getpid() == self.pid and not issubclass(exc_type, KeyboardInterrupt):
                self._failed = True
                body = {"where": "uncaught", "error_type": exc_type.__name__,
                        "error": _error_text(exc)}
                frames, omitted = pyframes.traceback_frames(
                    tb if tb is not None else getattr(exc, "__traceback__", None))
                if frames:
                    body["traceback"] = frames
                if omitted:
                    body["traceback_omitted"] = omitted
                self.outbox.put(time.time(), "error", body)
            elif issubclass(exc_type, KeyboardInterrupt):
                self._failed = True
        except Exception:
            pass

    def note_exit(self, code: Any) -> None:
        """The program called ``sys.exit(code)`` (seen by ``python -m pgdash_agent``): a non-zero
        status is a failure, as the launcher will see it. Never raises."""
        try:
            status = 0 if code is None else code if isinstance(code, int) else 1
            if os.getpid() != self.pid or status == 0:
                return
            self._failed, self._exitcode = True, status
            self.outbox.put(time.time(), "error", {
                "where": "exit", "error_type": "SystemExit",
                "error": f"the program exited with status {status}"
                         + (f": {code}" if not isinstance(code, int) else "")})
        except Exception:
            pass

    def _at_exit(self) -> None:
        if os.getpid() != self.pid:  # a forked child (e.g. a DataLoader worker)
            return
        reason = "exit"
        if self._failed:
            reason = ("uncaught exception" if self._exitcode is None
                      else f"exit status {self._exitcode}")
        try:
            self.detach(reason=reason)
        except KeyboardInterrupt:
            pass  # interrupted again while flushing at exit: the user wants out, now


def announcement(job: str, server: str, job_id: int | None) -> str:
    """The console line that tells a user where to watch their job. A server too old to say
    the job's id gets its jobs list as the page."""
    base = server.rstrip("/")
    page = f"{base}/jobs/{job_id}" if job_id is not None else f"{base}/"
    return f"pgdash: reporting job \"{job}\" to {base} \u2014 page {page}"


def _merge_rows(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge two interval summaries (used while the server is unreachable)."""
    if not old:
        return new
    merged = {_row_key(r): dict(r, hist=dict(map(tuple, r["hist"]))) for r in old}
    for r in new:
        key = _row_key(r)
        m = merged.get(key)
        if m is None:
            merged[key] = dict(r, hist=dict(map(tuple, r["hist"])))
            continue
        m["count"] += r["count"]
        m["bytes"] += r["bytes"]
        m["sum_us"] = round(m["sum_us"] + r["sum_us"], 3)
        m["max_us"] = max(m["max_us"], r["max_us"])
        for b, c in r["hist"]:
            m["hist"][b] = m["hist"].get(b, 0) + c
        if "resolution_us" in r:
            m["resolution_us"] = max(m.get("resolution_us", 0.0), r["resolution_us"])
            if r.get("timing") == "host_poll":
                m["timing"] = "host_poll"
    return [dict(m, hist=sorted([b, c] for b, c in m["hist"].items())) for m in merged.values()]


def _row_key(row: dict[str, Any]) -> tuple[str, str, str]:
    return row["group"], row["op"], row.get("source", "wrapper")


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None
