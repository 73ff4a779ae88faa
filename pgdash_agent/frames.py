"""Python frames as evidence: a traceback or a stack as the user would read it, bounded, with
pgdash's own frames hidden.

The agent sits between the training code and torch (its collective wrappers, its comm hook)
and, under ``python -m pgdash_agent``, below the program (``pgdash_agent.launch``, ``runpy``): none of those
frames is the user's, so none is shown. torch's launcher wrappers (the elastic ``@record``
decorator, ``torch.multiprocessing.spawn``'s ``_wrap``) are hidden where they are only the
outer end of the stack, as ``python train.py`` would show it without them.

Each frame of a traceback is ``{"file", "line", "function", "code"}`` (see
:class:`pgdash_agent.wire.TracebackFrame`), plus ``"library": True`` for the standard library's and
installed packages' frames, so that the server can name the line of the training code that
raised (the innermost frame that is not a library's).
"""

from __future__ import annotations

import os
import site
import sysconfig
import traceback
from typing import Any

from pgdash_agent.wire import MAX_TRACEBACK_FRAMES as MAX_FRAMES  # the first few, the innermost rest

KEEP_OUTER = 4  # ... of which this many from the outer end (where the program starts)
MAX_FILE = 512  # characters of a file name (its end is kept)
MAX_FUNCTION = 200
MAX_CODE = 240  # characters of a source line

AGENT_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# pgdash's own files: this package, and the shim of its first name ``agent`` beside it.
_PGDASH_DIRS = (AGENT_DIR,
                os.path.join(os.path.dirname(AGENT_DIR.rstrip(os.sep)), "agent", ""))
# Launchers that call the program: hidden at the outer end of a stack only.
_LAUNCHERS = tuple(os.path.join(*parts) for parts in (
    ("torch", "distributed", "elastic", "multiprocessing", "errors", "__init__.py"),
    ("torch", "multiprocessing", "spawn.py"),
    ("torch", "distributed", "run.py"),
    ("torch", "distributed", "launch.py"),
))


def _library_dirs() -> tuple[str, ...]:
    dirs: set[str] = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            dirs.add(sysconfig.get_paths()[key])
        except Exception:
            pass
    try:
        dirs.update(site.getsitepackages())
    except Exception:
        pass
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs if d)


_LIBRARY_DIRS = _library_dirs()


def is_pgdash(filename: str) -> bool:
    """Whether a frame's file is the agent's own."""
    return os.path.abspath(filename).startswith(_PGDASH_DIRS)


def is_launcher(filename: str) -> bool:
    """Whether a frame's file only starts the program (runpy, torch's launcher wrappers)."""
    if filename in ("<frozen runpy>",) or os.path.basename(filename) == "runpy.py":
        return True
    return filename.endswith(_LAUNCHERS)


def is_library(filename: str) -> bool:
    """Whether a frame's file is the standard library's or an installed package's."""
    if filename.startswith("<frozen "):
        return True
    path = os.path.realpath(filename) if os.path.isabs(filename) else filename
    return path.startswith(_LIBRARY_DIRS) or any(
        part in path for part in (f"{os.sep}site-packages{os.sep}",
                                  f"{os.sep}dist-packages{os.sep}"))


def _visible(summaries: list[traceback.FrameSummary]) -> list[traceback.FrameSummary]:
    """The frames a user reads: pgdash's hidden anywhere, launchers at the outer end; all of
    them if that leaves nothing (an error inside pgdash itself is still shown)."""
    shown = [f for f in summaries if not is_pgdash(f.filename)]
    while shown and is_launcher(shown[0].filename):
        shown.pop(0)
    return shown or list(summaries)


def _bounded(frames: list[Any]) -> tuple[list[Any], int]:
    """At most MAX_FRAMES: the outer KEEP_OUTER and the innermost rest; and how many were left
    out (a deep recursion shows where it started and where it ended)."""
    if len(frames) <= MAX_FRAMES:
        return frames, 0
    inner = MAX_FRAMES - KEEP_OUTER
    return frames[:KEEP_OUTER] + frames[-inner:], len(frames) - MAX_FRAMES


def _frame(summary: traceback.FrameSummary) -> dict[str, Any]:
    file = summary.filename
    frame = {"file": file if len(file) <= MAX_FILE else "..." + file[-(MAX_FILE - 3):],
             "line": summary.lineno or 0, "function": (summary.name or "?")[:MAX_FUNCTION]}
    code = (summary.line or "").strip()
    if code:
        frame["code"] = code[:MAX_CODE]
    if is_library(file):
        frame["library"] = True
    return frame


def traceback_frames(tb: Any) -> tuple[list[dict[str, Any]], int]:
    """The frames of an exception's traceback, outermost first as Python prints them (the
    raising frame last), bounded, pgdash's hidden; and how many were left out. Never raises:
    ``([], 0)`` when there is nothing to read."""
    try:
        if tb is None:
            return [], 0
        frames, omitted = _bounded(_visible(traceback.extract_tb(tb)))
        return [_frame(f) for f in frames], omitted
    except Exception:
        return [], 0


def stack_frames(frame: Any) -> tuple[list[dict[str, Any]], int]:
    """A running thread's frames from ``frame`` outwards, outermost first as a traceback,
    bounded, pgdash's hidden; and how many were left out."""
    frames, omitted = _bounded(_visible(traceback.extract_stack(frame, limit=1000)))
    return [_frame(f) for f in frames], omitted


def format_stack(frame: Any) -> str:
    """The stack of a running thread from ``frame`` outwards, formatted as
    ``traceback.format_stack`` does, pgdash's frames hidden and bounded like a traceback."""
    summaries = traceback.extract_stack(frame, limit=1000)
    frames, omitted = _bounded(_visible(summaries))
    lines = traceback.format_list(frames[:KEEP_OUTER] if omitted else frames)
    if omitted:
        lines.append(f"  ... {omitted} frames left out ...\n")
        lines += traceback.format_list(frames[KEEP_OUTER:])
    return "".join(lines)


def py_spy() -> str | None:
    """Where ``py-spy`` (which dumps a running process's Python stacks) is installed for this
    process: on its PATH, or beside its Python (a virtualenv not activated); None if not.
    Only looked up, never run."""
    import shutil
    import sys

    try:
        return shutil.which("py-spy") or shutil.which(
            "py-spy", path=os.path.dirname(os.path.abspath(sys.executable)))
    except Exception:
        return None
