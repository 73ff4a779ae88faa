"""The board: where each rank's collectives stand, in a page of shared memory that its host's
reader still reads after the rank is gone.

A rank that dies without a word takes with it what only it knew: the collective it was in.
Gloo aborts a rank that receives a message of another size than it expects (SIGABRT, in
C++), and a launcher then stops the others within a tenth of a second (torchrun's SIGTERM to
each rank's process group), none of them able to report, all of them seen last by a heartbeat
up to a second old. Yet the collective each was in names the rank at fault: the one that
called something else (bench/corpus: val_shard_empty_one_rank, oom_retry_repeats_allreduce).

So each agent writes, on the training thread as it enters and completes each collective, the
group's numbers, the call in flight and the call completed last into its board: a 4 KiB file under /dev/shm (memory,
never written to disk), one per process, in a directory of its launch on this host. The host
reader (pgdash_agent.reader), a process of its own that the launcher's SIGTERM reaches with the
ranks and that outlives a rank that was killed alone, sends every board of the directory when
it ends or its parent does (:func:`read_all`; a ``boards`` frame, stored by the server as a
``boards`` event and folded as those ranks' last progress), and removes those of processes
that are gone. A rank removes its own at a clean exit.

What a call costs the training thread: one ``struct.pack_into`` on entry and one on
completion (about half a microsecond together). Never raises into the caller; a board that
cannot be made (no writable shared memory) is simply absent.
"""

from __future__ import annotations

import faulthandler
import hashlib
import logging
import mmap
import os
import signal
import stat
import struct
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from pgdash_agent.wire import SIZED

log = logging.getLogger("pgdash.board")

MAGIC = b"PGDBRD1\0"
SIZE = 4096
HEADER = struct.Struct("<8siiI")  # magic, rank, pid, slots in use
SLOT_BYTES = 192
SLOTS = (SIZE - 64) // SLOT_BYTES  # groups a board holds (21); more are not written
NAME = struct.Struct("<24s")  # at a slot's start
ENTER = struct.Struct("<Q40sqdq")  # at +24: entered, "op\0dtype", bytes, since, root
COMPLETE = struct.Struct("<Q")  # at +96: completed
# ... or, for a call that returned (not an async one), with what it was: at +96 completed,
# then the number, "op\0dtype" and bytes of the call completed last
DONE = struct.Struct("<QQ40sq")
SLOT = struct.Struct("<24sQ40sqdqQQ40sq")
NONE = -1  # bytes or root not given


def directory(key: str) -> Path | None:
    """The boards' directory of one launch (``key``: what pgdash_agent.core's host claim is made
    of), created if need be: under /dev/shm where it exists, else the temporary directory.
    None where it cannot be made safely (not this user's alone)."""
    try:
        root = Path("/dev/shm") if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) \
            else Path(tempfile.gettempdir())
        base = root / f"pgdash-boards-{os.getuid()}"
        base.mkdir(mode=0o700, exist_ok=True)
        st = base.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None
        where = base / hashlib.sha256(key.encode()).hexdigest()[:16]
        where.mkdir(mode=0o700, exist_ok=True)
        _sweep(base)
        return where
    except Exception:
        return None


class Board:
    """This process's board (written by its training thread; see the module's docstring)."""

    def __init__(self, where: Path, rank: int, pid: int | None = None):
        self.pid = os.getpid() if pid is None else pid
        self.path = where / f"{self.pid}.board"
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self.mm = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self.rank = rank
        self.used = 0
        HEADER.pack_into(self.mm, 0, MAGIC, rank, self.pid, 0)
        self.slots: dict[str, int] = {}  # group name -> slot offset
        self.term_fd = _mark_stop(self.path.with_suffix(TERM)) if pid is None else None

    @classmethod
    def make(cls, key: str | None, rank: int | None) -> "Board | None":
        """A board for this process in the directory of launch ``key``, or None. Never raises."""
        if rank is None or key is None:
            return None
        try:
            where = directory(key)
            return cls(where, rank) if where is not None else None
        except Exception as exc:
            log.debug("pgdash: no board (%s)", exc)
            return None

    def slot(self, group: str) -> int:
        """The offset of ``group``'s slot (taken on first sight), or -1 when all are taken."""
        off = self.slots.get(group)
        if off is None:
            if self.used >= SLOTS:
                off = -1
            else:
                off = 64 + self.used * SLOT_BYTES
                NAME.pack_into(self.mm, off, group.encode()[:24])
                self.used += 1
                HEADER.pack_into(self.mm, 0, MAGIC, self.rank, self.pid, self.used)
            self.slots[group] = off
        return off

    def enter(self, track: Any, seq: int, op: str, dtype: Any, nbytes: int | None,
              since: float, root: int | None) -> None:
        """Collective ``seq`` of ``track`` (a pgdash_agent.collectives.GroupTrack, which keeps
        its slot and its last call's text) entered, on the training thread. Never raises."""
        try:
            off = track.board_off
            if off is None:
                off = track.board_off = self.slot(track.name)
            if off < 0:
                return
            last = track.board_sig
            if last[0] is not op or last[1] is not dtype:
                name = "" if dtype is None else str(dtype).removeprefix("torch.")
                last = track.board_sig = (op, dtype, f"{op}\0{name}".encode()[:40])
            ENTER.pack_into(self.mm, off + 24, seq, last[2], NONE if nbytes is None else nbytes,
                            since, NONE if root is None else root)
        except Exception:  # (closed at exit while another thread still calls)
            pass

    def complete(self, track: Any, seq: int) -> None:
        """Async collective ``seq`` of ``track`` seen completed (its call is long returned).
        Never raises."""
        try:
            off = track.board_off
            if off is not None and off >= 0:
                COMPLETE.pack_into(self.mm, off + 96, seq)
        except Exception:
            pass

    def done(self, track: Any, seq: int, nbytes: int | None) -> None:
        """Collective ``seq`` of ``track``, the one :meth:`enter` wrote last, returned: what
        it was stays beside its number (the ranks past a collective say what they called
        there, against one that died inside it with another size). Never raises."""
        try:
            off = track.board_off
            if off is not None and off >= 0:
                DONE.pack_into(self.mm, off + 96, seq, seq, track.board_sig[2],
                               NONE if nbytes is None else nbytes)
        except Exception:
            pass

    def close(self) -> None:
        """The process ends cleanly: nothing to tell after it."""
        _unmark_stop(self.term_fd)
        try:
            self.mm.close()
            self.path.with_suffix(TERM).unlink(missing_ok=True)
            self.path.unlink(missing_ok=True)
            self.path.parent.rmdir()  # (the launch's last board: otherwise not empty)
        except Exception:
            pass


# A SIGTERM that ends a rank is marked beside its board: ``<pid>.term`` holds the tracebacks
# faulthandler writes as the signal arrives (a C handler, no GIL, no Python code run), before
# it lets the signal's default action end the process as before. Its launcher may reap the
# process before the reader can read its wait status (how_ended); the mark stays. Set only
# where SIGTERM has its default action (a program's own handler decides what SIGTERM does,
# and pgdash_agent.failures reports it), and taken off in processes forked from the rank
# (DataLoader's workers, which their loader may SIGTERM).
TERM = ".term"
_marked: list[int] = []  # the fd of this process's mark, while set


def _mark_stop(path: Path) -> int | None:
    try:
        if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL or _marked or \
                not _default_action(signal.SIGTERM):
            return None
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        # (every thread's: with only the receiving thread's, a SIGTERM delivered to a thread
        # Python does not know, such as gloo's, would leave the mark empty)
        faulthandler.register(signal.SIGTERM, file=fd, all_threads=True, chain=True)
        if not _fork_hook:
            os.register_at_fork(after_in_child=_forked)
            _fork_hook.append(True)
        _marked.append(fd)
        return fd
    except Exception:
        return None


def _default_action(signum: int) -> bool:
    """Whether the process's action for ``signum`` is the default one as the kernel holds it
    (``sigaction``): a handler set outside Python's signal module (a ``faulthandler.register``
    of the program's own, a C library's) leaves ``signal.getsignal`` at SIG_DFL, and
    registering the mark would replace it. False where it cannot be read."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        action = ctypes.create_string_buffer(256)  # a struct sigaction, the handler first
        if libc.sigaction(signum, None, action) != 0:
            return False
        return ctypes.c_void_p.from_buffer(action).value in (None, 0)
    except Exception:
        return False


def _unmark_stop(fd: int | None) -> None:
    """Take the mark off (where the program set no SIGTERM handler since: unregistering puts
    back the action faulthandler found, and would undo the program's)."""
    if fd is None or fd not in _marked:
        return
    try:
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            faulthandler.unregister(signal.SIGTERM)
            _marked.remove(fd)
            os.close(fd)  # (kept open otherwise: faulthandler may still write to it)
    except Exception:
        pass


_fork_hook: list[bool] = []


def _forked() -> None:
    if _marked:  # (the parent's mark is not the child's)
        _unmark_stop(_marked[0])


def _term_mark(board: Path) -> dict[str, Any] | None:
    """What the SIGTERM mark beside a gone process's board says: it died of SIGTERM (written),
    or of something else (set, and still empty: SIGKILL, a crash); None where none was set."""
    try:
        return {"signal": "SIGTERM"} if board.with_suffix(TERM).stat().st_size > 0 else \
            {"not_sigterm": True}
    except OSError:
        return None


SWEEP = 32  # boards left behind by launches killed whole removed at each new board, at most
SWEEP_AFTER_S = 60.0


def _sweep(base: Path) -> None:
    """Remove boards nobody will read: a launch whose every process, its reader too, was
    SIGKILLed leaves them (4 KiB a rank in shared memory); those of processes that are gone,
    untouched for a minute, SWEEP at a time, and the directories they leave empty."""
    removed = 0
    now = time.time()
    try:
        for path in base.glob("*/*.board"):
            if removed >= SWEEP:
                break
            try:
                stale = now - path.stat().st_mtime > SWEEP_AFTER_S
                if stale and not how_ended(int(path.stem))[0]:
                    path.with_suffix(TERM).unlink(missing_ok=True)
                    path.unlink()
                    removed += 1
                    path.parent.rmdir()  # (only once empty)
            except (OSError, ValueError):
                pass
    except OSError:
        pass


def read(path: Path, ended: dict[int, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """One board as the ``boards`` frame carries it (pgdash_agent.wire.BoardRank), or None for a
    file that is not a board. Times are Unix seconds (the board holds the monotonic clock,
    the same in every process of the host). ``ended``: how processes seen end earlier ended
    (:func:`settle`), for those reaped since."""
    try:
        data = path.read_bytes()[:SIZE]
    except OSError:
        return None
    if len(data) < SIZE or data[:8] != MAGIC:
        return None
    _, rank, pid, used = HEADER.unpack_from(data, 0)
    to_wall = time.time() - time.perf_counter()
    groups = []
    for i in range(min(used, SLOTS)):
        name, entered, sig, nbytes, since, root, completed, done_seq, done_sig, done_bytes = \
            SLOT.unpack_from(data, 64 + i * SLOT_BYTES)
        group = name.rstrip(b"\0").decode("utf-8", "replace")
        if not group:
            continue
        row: dict[str, Any] = {"group": group, "entered": entered, "completed": completed}
        if entered > completed:
            op, dtype = _call(sig)
            row.update(inflight_op=op, inflight_dtype=dtype, inflight_bytes=_size(op, nbytes),
                       inflight_since=round(since + to_wall, 6))
            if root >= 0:
                row["inflight_root"] = root
        if completed and done_seq == completed:
            op, dtype = _call(done_sig)
            row.update(done_op=op, done_dtype=dtype, done_bytes=_size(op, done_bytes))
        groups.append(row)
    alive, how = how_ended(pid)
    how = how or (ended or {}).get(pid) or \
        (_term_mark(path) if not alive else None)
    return {"rank": rank, "pid": pid, "alive": alive, "groups": groups,
            **({"ended": how} if how and not alive else {})}


def _size(op: str, nbytes: int) -> int | None:
    """The bytes ranks must agree on (0 for a collective whose size may differ by rank, as
    what a failure reports says: pgdash_agent.collectives.call_signature)."""
    return None if nbytes < 0 else nbytes if op in SIZED else 0


def _call(sig: bytes) -> tuple[str, str | None]:
    op, _, dtype = sig.rstrip(b"\0").decode("utf-8", "replace").partition("\0")
    return op, dtype or None


def read_all(where: Path, clean: bool = True, settle_s: float = 0.0,
             seen: dict[int, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every board of a launch's directory; with ``clean`` (the reader's last words: nobody
    reads them after it), the directory is removed once they are read. A rank still running
    keeps writing to its board's memory; it removes nothing that is not there at its exit.
    ``settle_s``: wait up to this long for the boards' processes to end first (:func:`settle`),
    so that ranks stopped with the reader say how they ended; ``seen``: how processes ended
    that a :class:`Watch` saw end earlier."""
    boards: list[dict[str, Any]] = []
    try:
        paths = sorted(where.glob("*.board"))
    except OSError:
        return boards
    ended = dict(seen or {})
    if settle_s:
        ended.update(settle([_pid_of(path) for path in paths[:MAX_BOARDS]], settle_s))
    for path in paths[:MAX_BOARDS]:
        board = read(path, ended)
        if board is not None:
            boards.append(board)
    if clean:
        for path in paths:
            try:
                path.with_suffix(TERM).unlink(missing_ok=True)
                path.unlink()
            except OSError:
                pass
        try:
            where.rmdir()
        except OSError:
            pass
    return boards


MAX_BOARDS = 256  # boards one frame carries (one host's ranks of one launch)


def how_ended(pid: int) -> tuple[bool, dict[str, Any] | None]:
    """Whether a process of this host still runs, and how it ended where that can be read: a
    process its parent (the launcher) has not reaped yet is a zombie, whose wait status
    ``/proc/<pid>/stat`` shows (Linux 3.5+): ``{"signal": "SIGTERM"}`` (stopped from outside:
    a scheduler's cancel, a launcher stopping the job), ``{"signal": "SIGKILL"}`` (the OOM
    killer, ``kill -9``), ``{"signal": "SIGABRT"}`` (a C++ abort) or ``{"code": 1}``. A process
    reaped already, or another user's, ended without saying how (None)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False, None
    except OSError:
        return True, None
    fields = proc_stat(pid)
    if fields is None:
        return True, None
    if not fields or fields[0] != b"Z":
        return True, None
    try:
        status = int(fields[EXIT_CODE_FIELD])
    except (IndexError, ValueError):
        return False, None
    if status & 0x7F == 0:
        return False, {"code": (status >> 8) & 0xFF}
    number = status & 0x7F
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"SIG{number}"
    return False, {"signal": name}


def proc_stat(pid: int | str, proc: str = "/proc") -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` from the state (the 3rd) on, past the command name
    (which may hold spaces and parentheses); None where it cannot be read."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()
    except OSError:
        return None


# exit_code, the 52nd field of /proc/<pid>/stat, counted from the state (the 3rd)
EXIT_CODE_FIELD = 52 - 3
SETTLE_POLL_S = 0.005


def settle(pids: list[int | None], seconds: float) -> dict[int, dict[str, Any]]:
    """Wait up to ``seconds`` for these processes to end (a launcher's or a scheduler's SIGTERM
    reaches the reader and the ranks at once), noting how each ended as soon as it shows: its
    parent may reap it a moment later, and with it what it died of."""
    ended: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + seconds
    while True:
        running = False
        for pid in pids:
            if pid is None or pid in ended:
                continue
            alive, how = how_ended(pid)
            if how is not None:
                ended[pid] = how
            running = running or alive
        if not running or time.monotonic() >= deadline:
            return ended
        time.sleep(SETTLE_POLL_S)


class Watch:
    """How each process of a launch's boards ended, read the moment it ended: a launcher reaps
    a dead rank within its monitor interval (torchrun's 0.1 s), and with it its wait status
    (SIGABRT, SIGSEGV, SIGKILL, an exit status), long before the reader's last words. The
    host reader runs :meth:`run` on a thread of its own: a process file descriptor
    (``pidfd_open``, Linux 5.3+) per board's process, polled, so it wakes only when one ends;
    boards that appear are picked up every ``rescan_s``; ``ended(pid)`` is called as each
    ends. Where pidfds are not available it does nothing (``ended`` stays empty)."""

    def __init__(self, where: Path, ended: Callable[[int], None] = lambda pid: None,
                 rescan_s: float = 1.0):
        self.where, self.on_end, self.rescan_s = where, ended, rescan_s
        self.ended: dict[int, dict[str, Any]] = {}  # by pid
        self._fds: dict[int, int] = {}  # pidfd -> pid

    def run(self, going: Callable[[], bool]) -> None:
        """Watch while ``going()``; never raises."""
        try:
            import select

            poller = select.poll()
            while going():
                self._scan(poller)
                for fd, _ in poller.poll(self.rescan_s * 1000):
                    pid = self._fds.get(fd)
                    if pid is None:
                        continue
                    alive, how = how_ended(pid)
                    if not alive:
                        if how is not None:
                            self.ended[pid] = how
                        poller.unregister(fd)
                        self.on_end(pid)
        except Exception as exc:
            log.debug("pgdash board watch stopped: %s", exc)
        finally:
            for fd in self._fds:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _scan(self, poller: Any) -> None:
        known = set(self._fds.values())
        for path in sorted(self.where.glob("*.board"))[:MAX_BOARDS]:
            pid = _pid_of(path)
            if pid is None or pid in known:
                continue
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            self._fds[fd] = pid
            known.add(pid)
            poller.register(fd, 1)  # POLLIN: the process ended


def _pid_of(path: Path) -> int | None:
    try:
        return int(path.stem)
    except ValueError:
        return None
