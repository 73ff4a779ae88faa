"""The host reader: a small process of its own that reads this host's silent ranks from outside.

A rank blocked in C with the GIL held cannot run its agent, so it cannot answer a snapshot;
another rank's agent on its host reads it with py-spy instead (a ``peer`` question:
pgdash_agent.native.peer_dump). Where no other rank of the host answers (a rank alone on its
host, or every rank of the host blocked at once) nobody could. So the agent of the host's
first rank (``LOCAL_RANK`` 0, or a rank alone: ``LOCAL_WORLD_SIZE`` 1; where the launcher
sets neither, as ``mp.spawn`` and a bare ``python``, the first of the job's ranks on the host
to :func:`claim` it) starts this process (:func:`start`; ``PGDASH_HOST_READER=0`` turns it
off). It runs no training code and imports no torch, so it answers whatever the ranks are
doing.

It holds one protocol v2 connection (a hello with the starting rank's auth and ``reader``: its
own pid) and answers the server's ``peer`` questions, each with a ``{"read": body}`` frame
(pgdash_agent.wire.Read: py-spy's dump, or why there is none, such as py-spy not installed);
the server stores the reading as a ``read`` event of the starting rank's session. When it
ends (its parent gone, or the launcher's SIGTERM, which reaches it with its rank) it sends its
launch's boards, where each rank of the host was (pgdash_agent.board: ``{"boards": body}``), and
how each rank that ended meanwhile did (the signal or exit status of a rank its launcher has not
reaped yet: SIGTERM from a scheduler's cancel, SIGKILL, SIGABRT).
It reads only a process of its own user and launch (``same_launch``: its environment is its
parent's), sends nothing else, executes nothing it is sent, and exits when its parent does
(or is told to: ``detach``). A server that does not know
readers (an older pgdash) refuses its hello: it then gives up, quietly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from pgdash_agent import board, native, snapshots
from pgdash_agent.wire import BOARDS_FRAME, READ_FRAME, READER_PATH

log = logging.getLogger("pgdash.reader")

ENV = "PGDASH_READER_FOR"  # what the reader is started with: {"server", "auth"} as JSON
MAX_PENDING = 8  # questions waiting; the server asks at most 8 silent ranks a request
PARENT_POLL_S = 1.0  # how often it checks that the rank that started it still runs
RETRY_S = (1.0, 10.0)  # reconnection back-off, first and most
# The server's refusal of a reader whose rank it has not placed (yet): asked again later.
NOT_YET = "has not connected to this server process"
NOT_YET_S, NOT_YET_TRIES = 0.1, 50  # asked again that soon, that many times, then RETRY_S
SWEEP = 32  # claims left behind by killed ranks removed at each claim, at most
# At its end the reader waits up to this long for its launch's ranks to end too, to read how
# each did (pgdash_agent.board.settle): a scheduler's or launcher's SIGTERM reaches them together.
END_SETTLE_S = 0.5


def wanted(environ: Mapping[str, str], enabled: bool,
           claim: Callable[[], bool] = lambda: False) -> bool:
    """Whether this rank starts its host's reader: the host's first rank (or one alone),
    unless PGDASH_HOST_READER=0 (or PGDASH_PEER_READ=0: the agent passes ``enabled`` False
    then). Where the launcher does not say which rank is first on its host (no
    ``LOCAL_RANK``: ``mp.spawn``, a bare ``python``), the first to ``claim`` it (:func:`claim`,
    called only then). Without py-spy it still sends the boards; its readings say why they
    have no dump."""
    if not enabled:
        return False
    if "LOCAL_RANK" not in environ and "LOCAL_WORLD_SIZE" not in environ:
        return claim()
    return environ.get("LOCAL_RANK") == "0" or environ.get("LOCAL_WORLD_SIZE") == "1"


def claim(key: str) -> tuple[int, str] | None:
    """Among this user's processes on this host, the first to claim ``key`` (a job's launch
    and server) holds it until it :func:`release` s it or ends, however it ends (an ``flock``,
    which the kernel lets go of with the process). Returns what to release, or None: another
    process holds it, or no claim can be made here (then nobody starts a reader: never two).
    Never raises; never waits."""
    try:
        base = private_dir()
        if base is None:
            return None
        name = base / f"reader-{launch_hash(key)}.lock"
        sweep(base, "reader-*.lock", name, _remove_unheld)
        fd = _lock(name)
        return None if fd is None else (fd, str(name))
    except Exception as exc:
        log.debug("pgdash: no host reader claim (%s)", exc)
        return None


def private_dir() -> Path | None:
    """This user's directory for what the ranks of a host share (claims, the relay's
    socket), made if needed; None (said once in the log) where it is not this user's alone."""
    base = Path(tempfile.gettempdir()) / f"pgdash-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    st = base.lstat()  # (not a link, nor a directory another user made or may write to)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        log.warning("pgdash: %s is not a directory of this user's alone: no host reader "
                    "or relay is started from this rank (set TMPDIR elsewhere)", base)
        return None
    return base


def launch_hash(key: str) -> str:
    """A launch's key (pgdash_agent.core's _launch_key) as a short file name part."""
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def _lock(name: Path) -> int | None:
    """The open file ``name``, locked by this process; None if another holds it. A file
    removed between its opening and its locking (its holder released it, or a sweep took
    it) is not the claim any more: locked, it would let a second process claim the same
    name. So the lock counts only on the file still at ``name``."""
    import fcntl

    for _ in range(3):
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        if _still_at(fd, name):
            return fd
        os.close(fd)  # a removed file's: try the one there now
    return None


def _still_at(fd: int, name: Path) -> bool:
    """Whether the open file ``fd`` is the one at ``name``."""
    try:
        there, held = os.lstat(name), os.fstat(fd)
    except OSError:
        return False
    return (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)


def sweep(base: Path, pattern: str, mine: Path, remove_if_left: Callable[[Path], bool]) -> int:
    """Remove the files matching ``pattern`` in ``base`` that their processes left behind
    (``remove_if_left`` removes one if so and says whether it did: a claim nobody holds, a
    killed rank's; a relay's socket nobody listens on): at most SWEEP of them looked at, each
    older than a minute, so that a launch that is claiming or listening right now is never
    swept from under it. Returns how many went; never raises."""
    old, tried, removed = time.time() - 60, 0, 0
    for path in base.glob(pattern):
        try:
            if path == mine or path.lstat().st_mtime > old:
                continue
            if tried >= SWEEP:
                break
            tried += 1
            removed += remove_if_left(path)
        except OSError:
            continue
    return removed


def _remove_unheld(path: Path) -> bool:
    """Remove the claim at ``path`` if nobody holds it (locked by this process until it is
    gone, so nobody takes it meanwhile)."""
    fd = _lock(path)
    if fd is None:
        return False
    try:
        path.unlink()
        return True
    finally:
        os.close(fd)


def release(held: tuple[int, str] | None) -> None:
    """Let go of what :func:`claim` gave, and of its file (ranks claim once, at attach: none
    waits for it). Never raises."""
    if held is None:
        return
    fd, name = held
    for step in (lambda: os.unlink(name), lambda: os.close(fd)):
        try:
            step()
        except OSError:
            pass


def start(server: str, auth: dict[str, Any], ca_file: str | None = None,
          boards: Path | None = None, relay: str | None = None) -> subprocess.Popen | None:
    """Start the host reader for the rank whose ``auth`` (its v2 hello, with its token) is
    given; ``boards``: its launch's boards directory (pgdash_agent.board), which it sends when
    it ends; ``relay``: where its relay carries the host's agents (pgdash_agent.relay.path),
    if it starts one. Never raises: None when it could not be started."""
    return spawn("pgdash_agent.reader", ENV,
                 {"server": server, "auth": auth, "ca_file": ca_file and os.path.abspath(ca_file),
                  "boards": boards and str(boards), "relay": relay},
                 "the host reader did not start ({}); a rank of this host blocked with the GIL "
                 "held is read only by another rank's agent")


def spawn(module: str, env_name: str, given: dict[str, Any],
          failed: str) -> subprocess.Popen | None:
    """Run ``python -m module`` beside this process, ``given`` and this pid (``parent``: it
    ends when this process does) as JSON in ``env_name``; reaped whenever it ends. Never
    raises: ``failed`` (with a ``{}`` for why) is logged and None returned."""
    try:
        env = dict(os.environ)
        # The package as this process imported it, wherever that is.
        here = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        env["PYTHONSAFEPATH"] = "1"  # -m would put the working directory first (3.11+)
        # The token is in the environment, as PGDASH_TOKEN usually is, never in argv (which
        # any user may read): /proc/<pid>/environ is readable by this user and root only.
        env[env_name] = json.dumps({**given, "parent": os.getpid()})
        proc = subprocess.Popen([sys.executable, "-m", module], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, close_fds=True)
        # Reaped whenever it ends (it gives up on a server that does not take it): no zombie.
        threading.Thread(target=proc.wait, name=f"pgdash-reap-{proc.pid}", daemon=True).start()
        return proc
    except Exception as exc:
        log.warning("pgdash: " + failed.format(exc))
        return None


def stop(proc: subprocess.Popen | None) -> None:
    """End a reader :func:`start` started (never waits more than two seconds: its last
    words and its relay's hand-over take under one; never raises)."""
    if proc is None or proc.poll() is not None:
        return
    terminate(proc)  # a read in progress ends first: its py-spy killed, its rank woken
    wait_or_kill(proc, 2.0)


def terminate(proc: subprocess.Popen) -> None:
    """SIGTERM to a process this one started, if it still runs. Never raises."""
    try:
        if proc.poll() is None:
            proc.terminate()
    except Exception:
        pass


def wait_or_kill(proc: subprocess.Popen, seconds: float) -> None:
    """Wait up to ``seconds`` for a process told to end; then kill it. Never raises."""
    try:
        proc.wait(timeout=seconds)
    except Exception:
        try:
            proc.kill()
            proc.wait(timeout=1.0)
        except Exception:
            pass


def question(message: Any) -> tuple[str, int, int, Any, str | None] | None:
    """A ``peer`` question as (ask, pid, rank, asked_at, reason), or None for anything else
    (checked as the agent checks its questions: pgdash_agent.snapshots.question)."""
    asked = snapshots.question(message)
    if asked is None or asked[4] is None:
        return None
    ask, at, reason, _native, (pid, rank) = asked
    return ask, pid, rank, at, reason


def reading(ask: str, pid: int, rank: int, at: Any, reason: str | None,
            py_spy: str | None) -> dict[str, Any]:
    """The answer to one question: py-spy's dump of ``pid``, or why there is none."""
    started = time.perf_counter()
    body = {"ask": ask, "for_rank": rank, **snapshots.peer_reading(py_spy, pid)}
    return snapshots.answered(body, at, reason, started)


class Reader:
    """The reader's loop: connect, answer questions, reconnect, until the parent is gone."""

    def __init__(self, server: str, auth: dict[str, Any], parent: int,
                 ca_file: str | None = None, py_spy: str | None = None,
                 boards: str | None = None):
        self.server, self.auth, self.parent = server, auth, parent
        self.ca_file = ca_file
        self.py_spy = py_spy
        self.boards = Path(boards) if boards else None
        self.told = False  # the boards were sent (last_words)
        # how its ranks ended, read as each ended (pgdash_agent.board.Watch), and sent then
        self.watch = board.Watch(self.boards, self._ended) if self.boards else None
        self._watching = False
        self._sending = threading.Lock()  # (the watch's thread sends too)
        self.questions: queue.Queue = queue.Queue(MAX_PENDING)
        self.client = None
        self.answered = 0
        self.ignored = 0

    def alive(self) -> bool:
        return os.getppid() == self.parent

    def start_watch(self) -> None:
        """Watch how the launch's ranks on this host end (pgdash_agent.board.Watch), on a
        thread of its own, until the last words."""
        if self.watch is not None and not self._watching:
            self._watching = True
            threading.Thread(target=self.watch.run, args=(lambda: not self.told,),
                             name="pgdash-board-watch", daemon=True).start()

    def run(self) -> int:
        self.start_watch()
        wait, not_yet = RETRY_S[0], 0
        while self.alive():
            try:
                self._connect()
            except Exception as exc:
                from pgdash_agent.compact import NotServed, Refused

                # A server that does not take readers (an older pgdash: 404), or refuses this
                # one for good (its token): nothing to do here. One that has not placed the
                # starting rank yet is asked again.
                if isinstance(exc, NotServed) or (isinstance(exc, Refused)
                                                  and NOT_YET not in str(exc)):
                    return 0
                if NOT_YET in str(exc) and not_yet < NOT_YET_TRIES:
                    # its rank connects in a moment (through the relay started beside this
                    # reader, whose own connection comes first): asked again soon, since a
                    # job may be over within a second
                    not_yet += 1
                    self._sleep(NOT_YET_S)
                    continue
                self._sleep(wait)
                wait = min(RETRY_S[1], wait * 2)
                continue
            wait = RETRY_S[0]
            self._serve()
            self._sleep(RETRY_S[0])  # a server that admits and drops it is not hammered
        return 0

    def _connect(self) -> None:
        from pgdash_agent.compact import CompactClient

        client = CompactClient(sslopt={"ca_certs": self.ca_file} if self.ca_file else None,
                               path=READER_PATH)
        client.on("ask", self._ask)
        client.connect(self.server, auth={**self.auth, "reader": os.getpid()})
        while not self.questions.empty():  # asked on a connection that is gone: not wanted
            self.questions.get_nowait()
        self.client = client

    def _ask(self, message: Any) -> None:  # the client's reading thread
        q = question(message)
        if q is None:
            self.ignored += 1
            return
        try:
            self.questions.put_nowait(q)
        except queue.Full:
            self.ignored += 1

    def _serve(self) -> None:
        client = self.client
        while client.connected and self.alive():
            try:
                q = self.questions.get(timeout=PARENT_POLL_S)
            except queue.Empty:
                continue
            body = reading(*q, py_spy=self.py_spy)
            try:
                self._send(client, {READ_FRAME: body})
                self.answered += 1
            except Exception:
                break
        if client.connected and not self.alive():
            self.last_words()
        client.disconnect()

    def last_words(self) -> None:
        """Send the boards of this launch's ranks on this host (pgdash_agent.board), once: when
        the parent is gone, or this process was told to stop (the launcher's SIGTERM reaches
        it with the ranks). What each rank was inside when it died is on its board, however
        it died. Never raises."""
        if self.boards is None or self.told:
            return
        self.told = True
        try:
            boards = board.read_all(self.boards, settle_s=END_SETTLE_S,
                                    seen=self.watch and self.watch.ended)
            client = self.client
            if boards and client is not None and client.connected:
                self._send(client, {BOARDS_FRAME: {"t": time.time(), "boards": boards}})
        except Exception as exc:
            log.debug("pgdash reader: boards not sent (%s)", exc)

    def _send(self, client: Any, frame: dict[str, Any]) -> None:
        with self._sending:
            client.send(frame)

    def _ended(self, pid: int) -> None:
        """A rank of this launch on this host ended (the watch's thread): its board, with how it
        ended, is sent at once, not only with the last words (which do not come while this
        reader's own rank waits on the dead one: a job without a launcher to stop it). Never
        raises."""
        try:
            one = board.read(self.boards / f"{pid}.board", self.watch.ended)
            client = self.client
            if one is not None and not one["alive"] and client is not None and client.connected:
                self._send(client, {BOARDS_FRAME: {"t": time.time(), "boards": [one]}})
        except Exception as exc:
            log.debug("pgdash reader: a board not sent (%s)", exc)

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.alive() and time.monotonic() < deadline:
            time.sleep(min(PARENT_POLL_S, max(0.0, deadline - time.monotonic())))


def _stop(*_: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(0)


def main(environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    try:
        given = json.loads(env[ENV])
        server, auth, parent = given["server"], dict(given["auth"]), int(given["parent"])
    except (KeyError, ValueError, TypeError):
        print(f"pgdash reader: started without a valid {ENV}; the agent starts it",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for training; it follows its parent
    # detach's terminate: SystemExit, so a read in progress is cleaned up (subprocess.run kills
    # its py-spy, peer_dump wakes a rank py-spy left stopped) before it exits. Once: a scancel
    # SIGTERMs it, then torchrun's teardown again, which must not cut its last words short.
    signal.signal(signal.SIGTERM, _stop)
    reader = Reader(server, auth, parent, given.get("ca_file"), native.find_py_spy(env),
                    given.get("boards"))
    # Watching first: a rank that dies while the relay starts is read all the same.
    reader.start_watch()
    carrier = None
    if isinstance(given.get("relay"), str):
        # The relay is a process of its own (this one's child): its event loop never holds
        # this process's interpreter lock while the watch must read a rank that just died
        # (run as a thread here, beside a CPU hog, the watch missed launchers' reaping: the
        # likely reason). Without it the host's ranks connect to the server themselves.
        try:
            from pgdash_agent import relay

            carrier = relay.spawn(server, auth, given["relay"], given.get("ca_file"))
        except Exception as exc:
            log.warning("pgdash reader: no relay (%s)", exc)
    try:
        return reader.run()
    finally:  # (its parent gone, or SIGTERM: the launcher stopping the job, or detach)
        if carrier is not None:  # told to leave: its agents' last words still go up meanwhile
            terminate(carrier)
        reader.last_words()
        if carrier is not None:  # the host's agents that still run are handed back
            relay.finish(carrier)


if __name__ == "__main__":
    sys.exit(main())
