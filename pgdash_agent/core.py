"""The in-process agent: one object per process that builds the agent's parts and runs them.

Threads: the training thread only runs the collective wrappers (see
``pgdash_agent.collective_wrappers``) and appends rare events (init, errors) to the outbox.
``pgdash-agent`` (``pgdash_agent.loop``) polls async works, turns records into per-second
summaries, sends heartbeats and notices new process groups. ``pgdash-sender`` owns the network.
Nothing here raises into the training code.

:class:`Agent` composes the parts, each in its own module: the collective tracker and its
wrappers (``collectives``, ``collective_wrappers``), the process-group hooks
(``process_groups``), the failure and exit reports (``failures``), the periodic reports
(``reports``) and their schedule (``loop``), the stuck-stack capture (``stacks``), the outbox
and the sender. What stays here is the agent's identity (the Hello, the sender's auth), its
start and detach, and rank 0's console line.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import sys
import time
import uuid
from typing import Any, Callable, Mapping

from pgdash_agent import board, identity, native, reader
from pgdash_agent.collective_wrappers import CollectiveWrappers
from pgdash_agent.collectives import CollectiveTracker
from pgdash_agent.config import AgentConfig, relays
from pgdash_agent.ddp import DDPHooks
from pgdash_agent.failures import FailureReports
from pgdash_agent.flight import FlightRecorderProbe
from pgdash_agent.flight_stats import FlightStats
from pgdash_agent.gpu import GpuSampler
from pgdash_agent.loop import AgentLoop
from pgdash_agent.outbox import Outbox
from pgdash_agent.process_groups import ProcessGroupWatch, c10d, describe_group
from pgdash_agent.reports import Reporter
from pgdash_agent.sender import Sender
from pgdash_agent.snapshots import Snapshots
from pgdash_agent.stacks import StuckStacks
from pgdash_agent.wire import PROTOCOL_VERSION

log = logging.getLogger("pgdash.agent")


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
        self.failures = FailureReports(self.outbox, self.pid, self.detach)
        self.tracker = CollectiveTracker(describe_group, self.failures.collective_error,
                                         config.max_records)
        self.failures.last_calls = self.tracker.last_calls
        self.wrappers = CollectiveWrappers(self.tracker)
        kwargs = {"client_factory": client_factory} if client_factory else {}
        self.sender = Sender(config, self.outbox, self._auth,
                             on_ask=lambda message: self.snapshots.ask(message), **kwargs)
        self.flight = FlightRecorderProbe(time.time)
        self.tracker.fr_enabled = config.flight_stats
        self.fr_stats = FlightStats(self.flight, self.tracker.fr_wrapped,
                                    self.tracker.fr_open_calls, time.time,
                                    read_every_s=config.fr_read_s, budget=config.fr_budget)
        if config.flight_stats:
            self.flight.on_status = self.fr_stats.note_status
        self.reporter = Reporter(config, self.outbox, self.sender, self.tracker, self.flight,
                                 self.fr_stats, nvml, gpu_locator or identity.current_gpu_uuid)
        self._identity: dict[str, Any] = {}
        self._announced = False  # the console line naming the job's page (see _announce)
        self.groups = ProcessGroupWatch(self.outbox, self.tracker, self.environ,
                                        self._send_hello,
                                        functools.partial(self.reporter.heartbeat, force=True))
        self.stacks = StuckStacks(config.stack_after_s, self.tracker, self.wrappers,
                                  self.outbox, self.reporter.wall)
        self.snapshots = Snapshots(self.tracker, self.outbox, self.reporter.wall,
                                   lambda: self.reporter.last_flight,
                                   wake=lambda: self.loop.wake.set(),
                                   py_spy=native.find_py_spy(self.environ),
                                   cpp_recent=lambda: self.fr_stats.recent)
        self.loop = AgentLoop(config, self.tracker, self.groups, self.reporter, self.stacks,
                              self._announce, self.snapshots)
        self.tracker.wake = self.loop.wake.set
        self._detached = False
        self.peer_readable = False  # see start()
        self._readers = False  # its host runs a reader: this rank keeps a board (see start())
        self.host_reader = None  # the host reader process this rank started (pgdash_agent.reader)
        self._host_claim = None  # held while this rank is its host's first (reader.claim)
        self.ddp = DDPHooks()

    @property
    def gpu(self) -> GpuSampler | None:
        """This rank's GPU sampler, once its GPU was found (see Reporter.sample_gpu)."""
        return self.reporter.gpu

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, pg: Any = None) -> "Agent":
        self._send_hello()
        dist_c10d = c10d()
        import torch.distributed as dist

        self.wrappers.install([dist, dist_c10d])
        self.wrappers.install_wait(getattr(dist_c10d, "Work", None))
        self.groups.install(dist, dist_c10d)
        if self.config.ddp_hook:
            self.ddp.install()
        if dist_c10d.is_initialized():
            self.tracker.set_default(dist_c10d._world.default_pg)
        if pg is not None:
            self.tracker.track_for(pg)
        self.groups.scan()
        self.failures.install()
        # A rank blocked with the GIL held cannot name a tracer then: it names one now.
        self.peer_readable = bool(self.config.peer_read and self.snapshots.py_spy
                                  and native.allow_peer_reads())
        # (PGDASH_PEER_READ=0: this rank does not let other processes read it)
        readers = bool(self.config.server and self.config.wire != "v1"
                       and self.config.host_reader and self.config.peer_read)
        self._readers = readers
        key = self._launch_key() if readers else None  # (its host's ranks share it)
        relay_at = None
        if key and relays(self.config.relay, self._world_now(),
                          self.environ.get("LOCAL_WORLD_SIZE")
                          or self.environ.get("SLURM_NTASKS_PER_NODE")):
            from pgdash_agent.relay import path as relay_path

            relay_at = self.sender.relay_path = relay_path(key)
        self.sender.start()
        self.loop.start()
        if readers:  # (every rank of a host has a board where its host runs a reader)
            self._make_board()
        if reader.wanted(self.environ, readers, self._claim_host):
            # (its rank may not be known yet, as under mp.spawn: the board comes with it)
            where = board.directory(key) if key else None
            self.host_reader = reader.start(self.config.server, self._auth(),
                                            self.config.ca_file, where, relay_at)
            if self.host_reader is None:  # a rank of the host that attaches later may
                reader.release(self._host_claim)
                self._host_claim = None
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
            self.wrappers.uninstall()
            self.ddp.uninstall()
            self.groups.uninstall()
            self.failures.uninstall()
            self.loop.stop()
            # Async works (DDP's buckets through the comm hook) that completed since the
            # loop's last look: on a crowded host the loop may not end its pass within
            # stop's wait, and what it records after the last summary is never sent.
            self.tracker.poll_async()
            if self.gpu is not None:
                self.gpu.close()
            if self.config.flight_stats:  # the last C++ collectives, whatever the budget
                self.reporter.read_flight(force=True)
            self.reporter.flush_stats(force=True)
            # Final progress, so the page shows where it ended.
            self.reporter.heartbeat(force=True)
            self.outbox.put(time.time(), "exit", {"clean": not self.failures.failed,
                                                  "reason": reason,
                                                  "exitcode": self.failures.exitcode})
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
        finally:
            reader.stop(self.host_reader)  # (these three never raise)
            reader.release(self._host_claim)
            if self.tracker.board is not None:
                self.tracker.board.close()

    def _claim_host(self) -> bool:
        """Whether this rank is the first of its job's launch on this host to ask (where the
        launcher does not say which is: pgdash_agent.reader.claim). The launch is its job's
        name and attempt, the process that started the ranks (mp.spawn's parent, a launching
        shell; a job named by nothing but its script may run twice at once) and the host (a
        temporary directory may be shared between hosts)."""
        key = self._launch_key()
        if key is None:  # (never into training code: no claim, no reader)
            return False
        self._host_claim = reader.claim(key)
        return self._host_claim is not None

    def _launch_key(self) -> str | None:
        """This job's launch on this host (see _claim_host), as text; None if it cannot be
        told."""
        try:
            return json.dumps([self.config.server, self.job, self._identity.get("attempt"),
                               os.getppid(), socket.gethostname()], default=str)
        except Exception:
            return None

    def _rank_now(self) -> int | None:
        """This process's global rank: its process group's once there is one, else what its
        launcher said."""
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return dist.get_rank()
        except Exception:
            pass
        return self._identity.get("rank")

    def _world_now(self) -> int | None:
        """The job's number of ranks: its process group's once there is one, else what its
        launcher said (None: not known)."""
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return dist.get_world_size()
        except Exception:
            pass
        world = self._identity.get("world_size")
        return world if isinstance(world, int) else None

    def stats(self) -> dict[str, Any]:
        """Counters a user (or a test) can read: what was dropped, buffered, rejected."""
        return {
            "session": self.session, "job": self.job, "connected": self.sender.connected,
            "buffered": len(self.outbox), "dropped": self.reporter.dropped(),
            "rejected": self.sender.rejected, "last_error": self.sender.last_error,
            "internal_errors": self.tracker.internal_errors,
            "asks": {"dropped": self.snapshots.dropped, "ignored": self.snapshots.ignored},
            # Yama allowed only ancestors to ptrace this rank, and it let its user's do so
            "peer_readable": self.peer_readable,
        }

    # -- what is sent ------------------------------------------------------------------------

    def _auth(self) -> dict[str, Any]:
        return {"v": PROTOCOL_VERSION, "token": self.config.token, "session": self.session,
                "job": self.job, "rank": self._identity.get("rank"),
                "host": self._identity.get("host", ""), "pid": self.pid,
                "attempt": self._identity.get("attempt")}

    def _send_hello(self) -> None:
        launch = identity.launch_of(self.environ, init_method=self.groups.init_method)
        self._identity = identity.hello(self.job, self.environ, launch)
        self.outbox.put(time.time(), "hello", self._identity)
        if self._readers and self.tracker.board is None:  # the rank known at last
            self._make_board()

    def _make_board(self) -> None:
        """This process's board (pgdash_agent.board), once its rank is known: at attach where
        its launcher said it (torchrun, SLURM), else when its world group appears."""
        self.tracker.board = board.Board.make(self._launch_key(), self._rank_now())

    def _announce(self) -> None:
        """Rank 0 says once, on its console, which job it reports to and where its page is,
        as soon as the server has taken the job (a rank that cannot reach the server says
        that instead: agent.sender). Other ranks stay quiet: one line per job, not per rank.
        Once the program failed, its traceback stays the last thing it printed."""
        if self._announced or self._identity.get("rank") != 0 or not self.sender.accepted \
                or self.failures.failed:
            return
        self._announced = True
        try:
            print(announcement(self.job, self.config.server, self.sender.job_id),
                  file=sys.stderr, flush=True)
        except Exception:  # a closed or broken stderr: nothing to say it on
            pass

    # -- the program's end (pgdash_agent.failures) --------------------------------------------

    def note_uncaught(self, exc_type: type, exc: BaseException, tb: Any = None) -> None:
        """Report an exception that ends the program, one a launcher caught (e.g.
        torch.multiprocessing's): see :meth:`FailureReports.note_uncaught`. Never raises."""
        self.failures.note_uncaught(exc_type, exc, tb)

    def note_exit(self, code: Any) -> None:
        """The program called ``sys.exit(code)`` (seen by ``python -m pgdash_agent``): see
        :meth:`FailureReports.note_exit`. Never raises."""
        self.failures.note_exit(code)


def announcement(job: str, server: str, job_id: int | None) -> str:
    """The console line that tells a user where to watch their job. A server too old to say
    the job's id gets its jobs list as the page."""
    base = server.rstrip("/")
    page = f"{base}/jobs/{job_id}" if job_id is not None else f"{base}/"
    return f"pgdash: reporting job \"{job}\" to {base} \u2014 page {page}"
