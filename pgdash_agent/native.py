"""Native frames of this process's threads, by ``py-spy dump --native`` when it is installed.

A snapshot's Python frames say which line a thread stands in; when that line is a call into C
(a collective waiting in libgloo or NCCL, a CUDA synchronise, a lock) the native frames say
where inside it. py-spy reads them from outside the interpreter: it attaches to this process
with ptrace, which stops it for the dump (0.1-0.4 s measured on a process that imported
torch), so they are taken only when a request asks for them (``native``), never with the
snapshots every incident takes.

Permissions: ptrace of one's own process. As root, or with CAP_SYS_PTRACE, it works. As
another user, Linux's Yama (``/proc/sys/kernel/yama/ptrace_scope``) decides: at 0 any process
of the same user may; at 1 (the default of most distributions) only an ancestor, so the agent
names py-spy as its tracer (``prctl(PR_SET_PTRACER)``) for the dump: py-spy is started behind a
shell that waits until the agent has done so; at 2 or 3 only an administrator can, and the
answer says why it has no native frames. In a container, ptrace may also need
``--cap-add SYS_PTRACE``. Without py-spy, or where it fails, a snapshot has its Python frames
only, and says why in ``native_error``.

A rank whose own agent cannot answer (its interpreter blocked in C with the GIL held, or
stopped) is read by another rank's agent on the same host (:func:`peer_dump`): the server
asks one that answered. Only a process of the same user and the same launch is read (its
rendezvous variables equal this process's: :func:`same_launch`). A frozen rank cannot name a
tracer then, so it does at attach (:func:`allow_peer_reads`, where py-spy is installed, unless
``PGDASH_PEER_READ=0``): under Yama's default (1) it lets any process of its own user trace it,
as Yama at 0 does for every process; other users still cannot, and at 2 or 3 it changes
nothing (root or CAP_SYS_PTRACE are then needed).
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from pgdash_agent.board import proc_stat
from pgdash_agent.wire import MAX_TEXT

NATIVE_TIMEOUT_S = 5.0  # py-spy's whole run; the agent's thread waits for it (reports wait)
MAX_NATIVE_CHARS = 16_384  # of one thread's native stack (pgdash_agent.wire.MAX_NATIVE)
PR_SET_PTRACER = 0x59616D61  # linux/prctl.h: Yama's "this process may trace me"
PR_SET_PTRACER_ANY = 2**64 - 1  # (unsigned long)-1: any process (of this user) may
YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
# Who may trace this process between native dumps: 0 (Yama's rule) or PR_SET_PTRACER_ANY once
# allow_peer_reads named it.
_standing_tracer = 0

NO_PY_SPY = ("py-spy is not installed where this rank runs (pip install py-spy, or set "
             "PGDASH_PY_SPY to its path)")

_THREAD = re.compile(r'^Thread (0x[0-9A-Fa-f]+|\d+) \(([^)]*)\)(?:: "(.*)")?\s*$')


def find_py_spy(environ: Mapping[str, str] | None = None) -> str | None:
    """``PGDASH_PY_SPY`` (a path), else ``py-spy`` on PATH, else beside this Python (pip put
    it there in a virtual environment that is not on PATH); None when there is none."""
    env = os.environ if environ is None else environ
    named = env.get("PGDASH_PY_SPY")
    candidates = [named] if named else [shutil.which("py-spy"),
                                        str(Path(sys.executable).with_name("py-spy"))]
    return next((path for path in candidates if path and os.access(path, os.X_OK)), None)


def _allow_tracer(pid: int) -> None:
    """Let ``pid`` ptrace this process where Yama allows only ancestors (0: nobody more;
    PR_SET_PTRACER_ANY: any process). Without Yama (or on another OS) it changes nothing, and
    failing is harmless."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PTRACER, ctypes.c_ulong(pid), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def allow_peer_reads(scope_path: str = YAMA_SCOPE) -> bool:
    """At attach: where Yama lets only a process's ancestors trace it (ptrace_scope 1, most
    distributions' default), let any process of this user trace this one, so that a rank of
    its host can read it with py-spy should it block with the GIL held (its agent cannot
    name a tracer then). True when it did; without Yama, or at 0 (anyone of this user may
    already), 2 or 3 (only an administrator may), nothing is done."""
    global _standing_tracer
    try:
        with open(scope_path) as f:
            scope = f.read().strip()
    except OSError:
        return False
    if scope != "1":
        return False
    _standing_tracer = PR_SET_PTRACER_ANY
    _allow_tracer(_standing_tracer)
    return True


def native_stacks(py_spy: str, timeout: float = NATIVE_TIMEOUT_S
                  ) -> tuple[dict[int, str], str | None]:
    """({native thread id: its native and Python frames, innermost first}, why there are
    none or None). Never raises."""
    try:
        # The shell waits for a line, by when this process has named it (and so its children)
        # its tracer. It stops py-spy after ``timeout`` itself and then wakes this process:
        # py-spy stopped mid-dump can leave its target stopped (benfred/py-spy#416), and this
        # process cannot wake itself then.
        proc = subprocess.Popen(
            ["/bin/sh", "-c", 'read _ && timeout -s KILL "$2" "$0" dump --native --pid "$1"; '
             'code=$?; kill -CONT "$1"; exit $code', py_spy, str(os.getpid()), f"{timeout:g}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
    except OSError as exc:
        return {}, f"could not run {py_spy}: {exc}"
    _allow_tracer(proc.pid)
    try:
        out, err = proc.communicate("\n", timeout=timeout + 5)
    except subprocess.TimeoutExpired:  # the shell itself is stuck: stop it and its children
        _kill_group(proc.pid)
        proc.communicate()
        return {}, _late(timeout)
    finally:
        _allow_tracer(_standing_tracer)
    if proc.returncode == 137:  # timeout's SIGKILL
        return {}, _late(timeout)
    if proc.returncode != 0:
        return {}, _failed(proc.returncode, out, err,
                           "ptrace of this process was refused? see pgdash_agent/native.py")
    return parse_dump(out), None


def _late(timeout: float) -> str:
    return f"py-spy did not finish within {timeout:g} s"


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, a debugger): its state in /proc."""
    fields = proc_stat(pid)
    return bool(fields) and fields[0] in (b"T", b"t")


def _wake_if_left_stopped(pid: int, was_stopped: bool) -> None:
    """py-spy stopped mid-dump (our timeout, a crash) can leave the process it read stopped
    (benfred/py-spy#416): wake it, unless it was stopped before we read it (then its
    stopping is what the user is debugging, not ours to undo)."""
    if was_stopped or not _stopped(pid):
        return
    try:
        os.kill(pid, signal.SIGCONT)
    except OSError:
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def _failed(returncode: int, out: str, err: str, advice: str) -> str:
    """Why py-spy gave no dump: its exit status, its last line, and what may help."""
    lines = (err or out).strip().splitlines()
    return (f"py-spy failed (exit {returncode}): "
            f"{lines[-1][:500] if lines else 'no message'} ({advice})")


# What makes two processes ranks of one launch: the rendezvous and the launcher's ids.
LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID",
               "SLURM_STEP_ID", "PGDASH_JOB", "WORLD_SIZE")


def same_launch(pid: int, environ: Mapping[str, str]) -> str | None:
    """Why process ``pid`` may not be read for this process's job (None: it may): it must
    be another process of this user whose launch variables (LAUNCH_VARS) are this one's,
    and those must say something (a rendezvous port or a launcher id)."""
    if pid == os.getpid():
        return "that is this process"
    mine = {k: environ.get(k) for k in LAUNCH_VARS}
    if not any(mine.get(k) for k in ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID",
                                      "PGDASH_JOB")):
        return "this rank's environment names no launch (MASTER_PORT, a launcher id)"
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return f"process {pid} belongs to another user"
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError as exc:
        return f"process {pid} cannot be read here ({exc.strerror or exc})"
    theirs = dict(item.split("=", 1) for item in raw.decode("utf-8", "replace").split("\0")
                  if "=" in item)
    differ = [k for k in LAUNCH_VARS if theirs.get(k) != mine[k]]
    if differ:
        return f"process {pid} is not a rank of this launch ({differ[0]} differs)"
    return None


def peer_dump(py_spy: str | None, pid: int, environ: Mapping[str, str] | None = None,
              timeout: float = NATIVE_TIMEOUT_S) -> tuple[str | None, str | None]:
    """(``py-spy dump --native`` of process ``pid``, another rank of this launch on this
    host, or None; why there is none, or None). Never raises."""
    if py_spy is None:
        return None, NO_PY_SPY
    why = same_launch(pid, os.environ if environ is None else environ)
    if why is not None:
        return None, why
    was_stopped = _stopped(pid)
    try:
        done = subprocess.run([py_spy, "dump", "--native", "--pid", str(pid)],
                              capture_output=True, text=True, errors="replace",
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, _late(timeout)
    except OSError as exc:
        return None, f"could not run {py_spy}: {exc}"
    finally:
        _wake_if_left_stopped(pid, was_stopped)
    if done.returncode != 0:
        return None, _failed(done.returncode, done.stdout, done.stderr,
                             "ptrace of another process needs root, CAP_SYS_PTRACE, Yama's "
                             "ptrace_scope 0, or 1 with PGDASH_PEER_READ on in the rank read: "
                             "see pgdash_agent/native.py")
    return done.stdout[:MAX_TEXT], None


def _threads(text: str) -> list[tuple[str, str, str | None, list[str]]]:
    """py-spy dump's text -> each thread as (its id as py-spy prints it, its state such as
    ``active+gil``, its name or None, its frames one a line, innermost first)."""
    threads: list[tuple[str, str, str | None, list[str]]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            current = []
            threads.append((head.group(1), head.group(2), head.group(3), current))
        elif current is not None and line.startswith((" ", "\t")) and line.strip():
            current.append(line.strip())
        elif line.strip():
            current = None
    return threads


def gil_holder(text: str) -> str | None:
    """The thread a py-spy dump shows holding the GIL (``Thread 123 (active+gil):
    "MainThread"``): its name, or its id when it has none; None when no thread holds it."""
    return next((name or tid for tid, state, name, _ in _threads(text) if "gil" in state),
                None)


def where_blocked(text: str) -> str | None:
    """Where a py-spy dump's GIL-holding thread (else its first) stands: its innermost
    Python frame and the one that called it, as py-spy prints them (``match
    (re/__init__.py:166), called from inject (train.py:40)``); None without one."""
    threads = _threads(text)
    frames = next((f for _, state, _, f in threads if "gil" in state),
                  threads[0][3] if threads else [])
    return ", called from ".join([f for f in frames if ".py:" in f][:2]) or None


def parse_dump(text: str) -> dict[int, str]:
    """py-spy dump's text -> {thread id as py-spy names it: its frames, one a line}."""
    found: dict[int, list[str]] = {}
    for tid, _state, _name, frames in _threads(text):
        found.setdefault(int(tid, 0), []).extend(frames)
    return {tid: "\n".join(lines)[:MAX_NATIVE_CHARS] for tid, lines in found.items()}
