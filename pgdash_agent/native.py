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
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from typing import Mapping

NATIVE_TIMEOUT_S = 5.0  # py-spy's whole run; the agent's thread waits for it (reports wait)
MAX_NATIVE_CHARS = 16_384  # of one thread's native stack (pgdash_agent.wire.MAX_NATIVE)
PR_SET_PTRACER = 0x59616D61  # linux/prctl.h: Yama's "this process may trace me"

_THREAD = re.compile(r'^Thread (0x[0-9A-Fa-f]+|\d+) \(([^)]*)\)(?:: "(.*)")?\s*$')


def find_py_spy(environ: Mapping[str, str] | None = None) -> str | None:
    """``PGDASH_PY_SPY`` (a path), else ``py-spy`` on PATH; None when there is none."""
    env = os.environ if environ is None else environ
    path = env.get("PGDASH_PY_SPY") or shutil.which("py-spy")
    return path if path and os.access(path, os.X_OK) else None


def _allow_tracer(pid: int) -> None:
    """Let ``pid`` ptrace this process where Yama allows only ancestors (0: nobody more).
    Without Yama (or on another OS) it changes nothing, and failing is harmless."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PTRACER, pid, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def native_stacks(py_spy: str, timeout: float = NATIVE_TIMEOUT_S
                  ) -> tuple[dict[int, str], str | None]:
    """({native thread id: its native and Python frames, innermost first}, why there are
    none or None). Never raises."""
    try:
        # The shell waits for a line before it becomes py-spy (same pid): by then this
        # process has named that pid its tracer.
        proc = subprocess.Popen(
            ["/bin/sh", "-c", 'read _ && exec "$0" dump --native --pid "$1"', py_spy,
             str(os.getpid())], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        return {}, f"could not run {py_spy}: {exc}"
    _allow_tracer(proc.pid)
    try:
        out, err = proc.communicate("\n", timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {}, f"py-spy did not finish within {timeout:g} s"
    finally:
        _allow_tracer(0)
    if proc.returncode != 0:
        why = (err or out).strip().splitlines()
        return {}, f"py-spy failed (exit {proc.returncode}): " + (
            why[-1][:500] if why else "no message") + \
            " (ptrace of this process was refused? see pgdash_agent/native.py)"
    return parse_dump(out), None


def parse_dump(text: str) -> dict[int, str]:
    """py-spy dump's text -> {thread id as py-spy names it: its frames, one a line}."""
    found: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            current = found.setdefault(int(head.group(1), 0), [])
        elif current is not None and line.startswith((" ", "\t")) and line.strip():
            current.append(line.strip())
        elif not line.strip():
            continue
        else:
            current = None
    return {tid: "\n".join(lines)[:MAX_NATIVE_CHARS] for tid, lines in found.items()}
